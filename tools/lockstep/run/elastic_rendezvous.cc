// ElasticRendezvous; see elastic_rendezvous.h for the protocol.
#include "run/elastic_rendezvous.h"

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

int to_int(const std::string& text) { return static_cast<int>(parse_int(text).value_or(0)); }

double seconds(Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

ElasticRendezvous::ElasticRendezvous(Store& store, ElasticOptions options, int nproc, std::string node_name,
                                     int signal_fd)
    : store_(store), options_(std::move(options)), nproc_(nproc), node_name_(std::move(node_name)),
      signal_fd_(signal_fd) {}

int ElasticRendezvous::current_round() { return to_int(store_.compare_set(kRoundKey, "", "0")); }

std::optional<Round> ElasticRendezvous::next_round() {
  const Deadline deadline = Deadline::after(options_.join_timeout);
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
  store_.set(node_key(r, me), fmt::format("{} {}", nproc_, node_name_));
  std::optional<Clock::time_point> enough_since;
  const std::string waiting_for = fmt::format("the nodes of rendezvous '{}' to join", options_.id);
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
    if (joined >= options_.max_nodes) {
      store_.compare_set(closed_key(r), "", std::to_string(options_.max_nodes));
      continue;
    }
    if (joined >= options_.min_nodes) {
      // The last call: others may still be on their way (a restart stops
      // ranks first); then close with whoever came.
      if (!enough_since) enough_since = Clock::now();
      if (Clock::now() - *enough_since >= options_.last_call) {
        store_.compare_set(closed_key(r), "", std::to_string(joined));
        continue;
      }
    } else if (deadline.expired()) {
      too_few(r, joined);
    }
    std::this_thread::sleep_for(kPoll);
  }
}

Round ElasticRendezvous::layout(int r, int node_rank, int nnodes, Deadline deadline) {
  std::vector<std::string> keys;
  for (int n = 0; n < nnodes; ++n) keys.push_back(node_key(r, n));
  if (!wait_for_keys(store_, keys, deadline, signal_fd_, "the nodes of the round to describe themselves"))
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
    if (deadline.expired()) {
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

}  // namespace lockstep::cli
