// ElasticRendezvous; see elastic_rendezvous.h for the protocol.
#include "run/elastic_rendezvous.h"

#include <algorithm>
#include <functional>
#include <thread>

#include <fmt/format.h>

#include "common/env.h"
#include "lockstep/error.h"
#include "run/interruption.h"

namespace lockstep::cli {
namespace {

// How often a waiting launcher looks at the store and its signals.
constexpr Duration kPoll = std::chrono::milliseconds(100);

constexpr char kRoundKey[] = "rdzv/round";
constexpr char kFinishedKey[] = "rdzv/finished";
std::string joined_key(int r) { return fmt::format("rdzv/{}/joined", r); }
std::string closed_key(int r) { return fmt::format("rdzv/{}/closed", r); }
std::string waiting_key(int r) { return fmt::format("rdzv/{}/waiting", r); }
std::string node_key(int r, int n) { return fmt::format("rdzv/{}/node/{}", r, n); }
std::string interrupted_key(int r) { return fmt::format("rdzv/{}/interrupted", r); }
std::string beat_key(int r, int n) { return fmt::format("rdzv/{}/beat/{}", r, n); }
std::string lost_key(int r) { return fmt::format("rdzv/{}/lost", r); }
std::string done_key(int r, int n) { return fmt::format("rdzv/{}/done/{}", r, n); }

// How many of the next nodes in rank order each launcher watches: one
// would do (the live node before a silent one sees it); two keep a round
// watched when a node and its watcher stop together.
constexpr int kWatched = 2;
// The next kWatched nodes after `node_rank` (in rank order, round the
// ring) of which `counts` is true.
std::vector<int> watched_by(int node_rank, int nnodes, const std::function<bool(int)>& counts = nullptr) {
  std::vector<int> nodes;
  for (int k = 1; k < nnodes && static_cast<int>(nodes.size()) < kWatched; ++k) {
    const int node = (node_rank + k) % nnodes;
    if (!counts || counts(node)) nodes.push_back(node);
  }
  return nodes;
}

int to_int(const std::string& text) { return static_cast<int>(parse_int(text).value_or(0)); }

}  // namespace

ElasticRendezvous::ElasticRendezvous(Store& store, ElasticOptions options, int nproc, std::string node_name,
                                     int signal_fd)
    : store_(store), options_(std::move(options)), nproc_(nproc), node_name_(std::move(node_name)),
      signal_fd_(signal_fd), heartbeat_(store.clone(), options_.keep_alive.interval),
      silence_(options_.keep_alive.limit()) {}

int ElasticRendezvous::current_round() { return to_int(store_.compare_set(kRoundKey, "", "0")); }

std::optional<Round> ElasticRendezvous::next_round() {
  const Deadline deadline = deadline_after(*options_.clock, options_.join_timeout);
  for (;;) {
    const int r = current_round();
    Round round;
    interruption_key_ = interrupted_key(r);
    const Joined joined = join(r, deadline, round);
    interruption_key_.clear();
    switch (joined) {
      case Joined::member:
        return round;
      case Joined::late:
        heartbeat_.beat_on("");  // nobody watches a node outside the round
        std::fprintf(stderr, "lockstep run: the job is running without this node; waiting to join its next round\n");
        store_.add(waiting_key(r), 1);
        if (!wait_for_next_round(r, deadline)) return std::nullopt;
        break;
      case Joined::moved_on:
        break;
    }
  }
}

// Steps 1 and 2 of the protocol for round `r`.
ElasticRendezvous::Joined ElasticRendezvous::join(int r, Deadline deadline, Round& out) {
  const int me = static_cast<int>(store_.add(joined_key(r), 1) - 1);
  heartbeat_.beat_on(beat_key(r, me));
  store_.set(node_key(r, me), fmt::format("{} {}", nproc_, node_name_));
  std::optional<Clock::time_point> enough_since;
  const std::string waiting_for = fmt::format("the nodes of rendezvous '{}' to join", options_.id);
  // Said before a wait that may be long (see rendezvous_static).
  std::fprintf(stderr, "lockstep run: joined round %d of rendezvous '%s' as its node %d; waiting for %s\n", r,
               options_.id.c_str(), me, waiting_for.c_str());
  for (;;) {
    throw_if_interrupted(signal_fd_, waiting_for);
    throw_if_peer_interrupted(store_, interrupted_key(r));
    if (store_.check({closed_key(r)})) {
      const int count = to_int(store_.get(closed_key(r)));
      if (me >= count) return Joined::late;
      out = layout(r, me, count, deadline);
      return Joined::member;
    }
    if (current_round() != r) return Joined::moved_on;
    const std::int64_t joined = store_.add(joined_key(r), 0);
    // A node that joined and went silent would hold the round up (or join
    // it and never start its ranks): form the next one without it.
    if (auto silent = silent_node(r, watched_by(me, static_cast<int>(joined)))) {
      std::fprintf(stderr, "lockstep run: %s; forming round %d without it\n", declare_lost(r, *silent).c_str(), r + 1);
      return Joined::moved_on;
    }
    if (joined >= options_.max_nodes) {
      store_.compare_set(closed_key(r), "", std::to_string(options_.max_nodes));
      continue;
    }
    if (joined >= options_.min_nodes) {
      // The last call: others may still be on their way (a restart stops
      // ranks first); then close with whoever came.
      const auto now = options_.clock->now();
      if (!enough_since) enough_since = now;
      if (now - *enough_since >= options_.last_call) {
        store_.compare_set(closed_key(r), "", std::to_string(joined));
        continue;
      }
    } else if (expired(*options_.clock, deadline)) {
      too_few(r, joined);
    }
    std::this_thread::sleep_for(kPoll);
  }
}

Round ElasticRendezvous::layout(int r, int node_rank, int nnodes, Deadline deadline) {
  std::vector<std::string> keys;
  for (int n = 0; n < nnodes; ++n) keys.push_back(node_key(r, n));
  if (!wait_for_keys(store_, keys, deadline, signal_fd_, "the nodes of the round to describe themselves",
                     *options_.clock))
    throw ConfigError(fmt::format("round {} of rendezvous '{}' closed with {} node(s), but not all of them said how "
                                  "many ranks they run within the join timeout",
                                  r, options_.id, nnodes));
  Round round;
  round.number = r;
  round.node_rank = node_rank;
  round.nnodes = nnodes;
  for (int n = 0; n < nnodes; ++n) {
    const std::string node = store_.get(keys[static_cast<std::size_t>(n)]);  // "<nproc> <host>"
    const int count = to_int(node.substr(0, node.find(' ')));
    if (n < node_rank) round.first_rank += count;
    round.world_size += count;
  }
  return round;
}

bool ElasticRendezvous::wait_for_next_round(int r, Deadline deadline) {
  for (;;) {
    throw_if_interrupted(signal_fd_, "the running job's next round");
    if (store_.check({kFinishedKey})) return false;
    if (current_round() != r) return true;
    if (expired(*options_.clock, deadline)) {
      const int count = to_int(store_.get(closed_key(r)));
      throw ConfigError(fmt::format(
          "waited {:.0f} s to join rendezvous '{}' at {}, but its job keeps running with {} node(s) (--nnodes "
          "maximum {}){}; start this node when one leaves, or raise the maximum",
          seconds(options_.join_timeout), options_.id, options_.endpoint, count, options_.max_nodes,
          count >= options_.max_nodes ? ", which is full" : ""));
    }
    std::this_thread::sleep_for(kPoll);
  }
}

void ElasticRendezvous::too_few(int r, std::int64_t joined) {
  std::string names;
  for (int n = 0; n < joined; ++n) {
    const std::string key = node_key(r, n);
    std::string who = store_.check({key}) ? store_.get(key) : "?";
    const std::size_t space = who.find(' ');
    if (space != std::string::npos) who = who.substr(space + 1);
    names += fmt::format("{}{}", names.empty() ? "" : ", ", who);
  }
  throw ConfigError(fmt::format(
      "only {} node(s) ({}) joined rendezvous '{}' at {} within {:.0f} s, fewer than the minimum of {} (--nnodes "
      "{}:{}); start more nodes with the same --rdzv-endpoint and --rdzv-id, lower the minimum, or raise "
      "--rdzv-timeout",
      joined, names, options_.id, options_.endpoint, seconds(options_.join_timeout), options_.min_nodes,
      options_.min_nodes, options_.max_nodes));
}

std::int64_t ElasticRendezvous::nodes_waiting(const Round& round) { return store_.add(waiting_key(round.number), 0); }

void ElasticRendezvous::open_next_round(const Round& round) {
  store_.compare_set(kRoundKey, std::to_string(round.number), std::to_string(round.number + 1));
}

void ElasticRendezvous::mark_finished() { store_.set(kFinishedKey, "1"); }

std::optional<std::string> ElasticRendezvous::lost_node(const Round& round) {
  const std::string key = lost_key(round.number);
  if (!store_.check({key})) return std::nullopt;
  return store_.get(key);
}

std::optional<Round> ElasticRendezvous::running_round() {
  const int r = current_round();
  if (!store_.check({closed_key(r)}) || store_.check({kFinishedKey})) return std::nullopt;
  Round round;
  round.number = r;
  round.nnodes = to_int(store_.get(closed_key(r)));
  return round;
}

std::optional<std::string> ElasticRendezvous::watch(const Round& round, bool watch_peers) {
  const int r = round.number;
  const int open = current_round();
  if (open != r) {
    const std::string why = lost_node(round).value_or(fmt::format("another launcher opened round {}", open));
    return fmt::format("round {} of rendezvous '{}' is over: {}{}", r, options_.id, why, pause_note());
  }
  if (!watch_peers) return std::nullopt;
  // A node whose ranks all finished stops beating when it leaves; one
  // whose ranks still run (a last checkpoint) must not take it for lost.
  const auto unfinished = [&](int node) { return !store_.check({done_key(r, node)}); };
  if (auto silent = silent_node(r, watched_by(round.node_rank, round.nnodes, unfinished)))
    return declare_lost(r, *silent) + "; re-forming the group without it";
  return std::nullopt;
}

void ElasticRendezvous::mark_done(const Round& round) { store_.set(done_key(round.number, round.node_rank), "1"); }

std::optional<std::string> ElasticRendezvous::silent_before_done(const Round& round) {
  std::vector<int> nodes;
  for (int n = 0; n < round.nnodes; ++n)
    if (n != round.node_rank && !store_.check({done_key(round.number, n)})) nodes.push_back(n);
  const auto silent = silent_node(round.number, nodes);
  if (!silent) return std::nullopt;
  return fmt::format("node {} (host {}) stopped beating before it said that its ranks finished: its heartbeat did not "
                     "change for {:.1f} s; it was killed, stopped or cut off",
                     silent->node, host_of(round.number, silent->node), seconds(silent->for_how_long));
}

void ElasticRendezvous::note_poll(const Round& round) {
  const auto now = options_.clock->now();
  if (polled_round_ != round.number) last_poll_.reset();  // between rounds nobody polls
  polled_round_ = round.number;
  paused_ = last_poll_ && now - *last_poll_ > options_.keep_alive.limit()
                ? std::chrono::duration_cast<Duration>(now - *last_poll_)
                : Duration{};
  last_poll_ = now;
}

std::string ElasticRendezvous::pause_note() const {
  // Stopped before this poll, or during it (between its requests).
  Duration paused = paused_;
  if (last_poll_) {
    const auto during = std::chrono::duration_cast<Duration>(options_.clock->now() - *last_poll_);
    if (during > options_.keep_alive.limit()) paused = std::max(paused, during);
  }
  if (paused == Duration{}) return "";
  return fmt::format(" (this launcher itself was stopped for {:.1f} s, SIGSTOP or a suspended host, longer than the "
                     "keep-alive limit of {:.1f} s: the other nodes went on without it)",
                     seconds(paused), seconds(options_.keep_alive.limit()));
}

std::optional<Silence> ElasticRendezvous::silent_node(int r, const std::vector<int>& nodes) {
  const auto now = options_.clock->now();
  if (watched_round_ != r) {
    silence_.reset();
    last_look_.reset();
    watched_round_ = r;
  }
  if (last_look_ && now - *last_look_ < options_.keep_alive.interval / 2) return std::nullopt;
  last_look_ = now;
  std::map<int, std::int64_t> counters;
  for (int node : nodes) counters[node] = store_.add(beat_key(r, node), 0);
  return silence_.look(counters, options_.clock->now());
}

std::string ElasticRendezvous::declare_lost(int r, const Silence& s) {
  const std::string what = fmt::format(
      "node {} (host {}) stopped beating: its heartbeat did not change for {:.1f} s (keep_alive_interval {:g} s x "
      "keep_alive_max_attempt {}); it was killed, stopped or cut off",
      s.node, host_of(r, s.node), seconds(s.for_how_long), seconds(options_.keep_alive.interval),
      options_.keep_alive.max_attempts);
  const std::string said = store_.compare_set(lost_key(r), "", what);  // the first launcher to notice
  store_.compare_set(kRoundKey, std::to_string(r), std::to_string(r + 1));
  return said;
}

std::string ElasticRendezvous::host_of(int r, int node) {
  const std::string key = node_key(r, node);
  if (!store_.check({key})) return "?";
  const std::string value = store_.get(key);  // "<nproc> <host>"
  const std::size_t space = value.find(' ');
  return space == std::string::npos ? value : value.substr(space + 1);
}

}  // namespace lockstep::cli
