// GroupDiagnostics; see group_diagnostics.h.
#include "comm/group_diagnostics.h"

#include <unistd.h>

#include <filesystem>
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>

#include "comm/rendezvous.h"
#include "comm/signal_dumps.h"
#include "common/file.h"
#include "common/clock.h"
#include "diag/watchdog_report.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

constexpr char kFirstFailure[] = "abort/first";
constexpr char kRound[] = "watchdog/round";
constexpr char kVerdict[] = "watchdog/verdict";
constexpr Duration kWatchInterval{500};
constexpr char kStallGeneration[] = "stall/generation";
constexpr char kStallQuery[] = "stall/query";
// How long a stall inspection waits for the other ranks' watchdogs (which
// look every kWatchInterval).
constexpr Duration kStallCollect{1500};
constexpr std::uint64_t kMaxStallAnswers = 64;

std::string progress_key(int rank) { return fmt::format("watchdog/progress/{}", rank); }
std::string stall_progress_key(std::uint64_t generation, int rank) {
  return fmt::format("stall/{}/progress/{}", generation, rank);
}

// The same error with `text` as its message.
std::exception_ptr rewrap(std::exception_ptr error, const std::string& text) {
  try {
    std::rethrow_exception(error);
  } catch (const PeerError& e) {
    return std::make_exception_ptr(PeerError(text, e.peer()));
  } catch (const TimeoutError& e) {
    return std::make_exception_ptr(TimeoutError(text, e.peer()));
  } catch (const MismatchError&) {
    return std::make_exception_ptr(MismatchError(text));
  } catch (...) {
    return error;
  }
}

// The first failure as stored: its kind and peer on the first line (so the
// ranks it aborts raise the same kind of error), then the message.
std::string encode_failure(std::exception_ptr error, const std::string& text) {
  char kind = 'E';
  int peer = -1;
  try {
    std::rethrow_exception(error);
  } catch (const PeerError& e) {
    kind = 'P';
    peer = e.peer();
  } catch (const TimeoutError& e) {
    kind = 'T';
    peer = e.peer();
  } catch (const MismatchError&) {
    kind = 'M';
  } catch (...) {
  }
  return fmt::format("{} {}\n{}", kind, peer, text);
}

std::string text_of_failure(const std::string& stored) {
  const auto newline = stored.find('\n');
  return newline == std::string::npos ? stored : stored.substr(newline + 1);
}

std::exception_ptr failure_from(const std::string& stored, const std::string& text) {
  const char kind = stored.empty() ? 'E' : stored[0];
  int peer = -1;
  if (stored.size() > 2) peer = std::atoi(stored.c_str() + 2);
  switch (kind) {
    case 'P': return std::make_exception_ptr(PeerError(text, peer));
    case 'T': return std::make_exception_ptr(TimeoutError(text, peer));
    case 'M': return std::make_exception_ptr(MismatchError(text));
    default: return std::make_exception_ptr(Error(text));
  }
}

bool is_peer_error(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const PeerError&) {
    return true;
  } catch (...) {
    return false;
  }
}

std::string what_of(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace

GroupDiagnostics::GroupDiagnostics(std::shared_ptr<Store> store, int rank, int size, std::string name, Logger log,
                                   std::shared_ptr<diag::Tracer> tracer, DiagnosticsSettings settings, Os& clock)
    : store_(store->clone()),  // its own connection: never queued behind the program's store calls
      rank_(rank),
      size_(size),
      name_(std::move(name)),
      log_(std::move(log)),
      tracer_(std::move(tracer)),
      settings_(std::move(settings)),
      clock_(clock) {
  register_for_signal_dumps(this);
}

GroupDiagnostics::~GroupDiagnostics() {
  unregister_from_signal_dumps(this);
  stop_watchdog();
}

void GroupDiagnostics::stop_watchdog() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

std::string GroupDiagnostics::progress() const {
  diag::RankProgress p;
  p.rank = rank_;
  p.pid = static_cast<int>(::getpid());
  p.host = host_identity().substr(0, host_identity().find('/'));
  for (const auto& r : recorder_.snapshot()) {
    const std::string what = describe(r.info, r.seq) + (r.label.empty() ? "" : " [" + r.label + "]");
    p.issued = r.seq + 1;
    if (r.state == diag::OpState::completed) p.last_completed = what;
    if (p.running.empty() && (r.state == diag::OpState::started || r.state == diag::OpState::issued))
      p.running = what + (r.state == diag::OpState::issued ? " (queued)" : "");
  }
  return p.encode();
}

std::string GroupDiagnostics::collect_verdict(std::uint64_t seq, const std::string& what) {
  store_->compare_set(kRound, "", std::to_string(seq));
  store_->set(progress_key(rank_), progress());
  const Deadline deadline = deadline_after(clock_, settings_.settle);
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(progress_key(r));
  // The poll interval is real time (a test clock that moves on sleep would
  // make this a busy loop); the deadline is on the group's clock.
  while (!store_->check(keys) && !expired(clock_, deadline)) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::vector<std::optional<diag::RankProgress>> all(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r)
    if (store_->check({keys[static_cast<std::size_t>(r)]}))
      all[static_cast<std::size_t>(r)] = diag::RankProgress::decode(store_->get(keys[static_cast<std::size_t>(r)]));
  const std::string mine = diag::verdict(seq, what, rank_, all);
  return store_->compare_set(kVerdict, "", mine);  // the first verdict stored is everyone's
}

std::optional<std::string> GroupDiagnostics::planned_stop() const {
  if (!settings_.launcher_store) return std::nullopt;
  try {
    if (!settings_.launcher_store->check({settings_.launcher_stop_key})) return std::nullopt;
    return settings_.launcher_store->get(settings_.launcher_stop_key);
  } catch (const std::exception&) {
    return std::nullopt;  // the launcher's store is gone: nothing was planned that it could say
  }
}

std::exception_ptr GroupDiagnostics::on_failure(std::exception_ptr error, std::uint64_t seq, const OpInfo& info) {
  std::string text = what_of(error);
  if (is_peer_error(error)) {
    if (auto reason = planned_stop()) {
      log_.info("the launcher stops the ranks on purpose ({}); {}", *reason, text);
      int peer = -1;
      try {
        std::rethrow_exception(error);
      } catch (const PeerError& e) {
        peer = e.peer();
      } catch (...) {
      }
      return std::make_exception_ptr(PeerError(
          fmt::format("stopped by the launcher on purpose ({}), not a failure: a peer left first ({})", *reason, text),
          peer));
    }
  }
  try {
    bool timeout = false;
    try {
      std::rethrow_exception(error);
    } catch (const TimeoutError&) {
      timeout = true;
    } catch (...) {
    }
    if (timeout && size_ > 1) {
      text += "\n" + collect_verdict(seq, describe(info, seq));
    } else {
      // When rank 2 dies, rank 3 notices first; rank 0 may only see rank 3
      // leave. The first failure recorded tells everyone what happened, and
      // the other ranks' watchdogs abort their groups with it (watch()).
      const std::string first = record_failure_as_stored(error);
      if (!first.empty()) {
        text += "\n  the first failure in this group was: " + text_of_failure(first);
        // A peer that left or died after another rank found a mismatch
        // ended because of it (it failed, or its program stopped on the
        // error): the mismatch is what this rank reports, as every rank does.
        if (first[0] == 'M' && is_peer_error(error)) error = std::make_exception_ptr(MismatchError(text));
      }
    }
  } catch (const std::exception& e) {
    log_.debug("diagnostics could not reach the store: {}", e.what());  // report what this rank saw
  }
  const std::string file = dump("failure");
  if (!file.empty()) text += "\n  flight recorder: " + file;
  return rewrap(error, text);
}

std::string GroupDiagnostics::record_failure(std::exception_ptr error) {
  const std::string first = record_failure_as_stored(error);
  return first.empty() ? first : text_of_failure(first);
}

std::string GroupDiagnostics::record_failure_as_stored(std::exception_ptr error) {
  reported_failure_.store(true);
  try {
    const std::string mine = encode_failure(error, what_of(error));
    const std::string first = store_->compare_set(kFirstFailure, "", mine);
    return first.empty() || first == mine ? std::string() : first;
  } catch (const std::exception& e) {
    log_.debug("could not record the failure in the store: {}", e.what());
    return {};
  }
}

void GroupDiagnostics::start_watchdog(std::function<void(std::exception_ptr)> abort) {
  if (size_ == 1) return;
  abort_ = std::move(abort);
  watchdog_ = std::thread([this] { watch(); });
}

void GroupDiagnostics::watch() {
  std::unique_lock lock(mutex_);
  while (!stop_.wait_for(lock, kWatchInterval, [&] { return stopping_; })) {
    lock.unlock();
    try {
      if (!reported_failure_.load() && store_->check({kFirstFailure})) {
        // Another rank's operation failed (a mismatch it saw, a peer it
        // lost): the group cannot finish its collectives, so end this rank's
        // too, now, with that rank's words, instead of waiting out the
        // timeout in an operation whose data will not come.
        const std::string first = store_->get(kFirstFailure);
        if (reported_failure_.load()) return;  // this rank failed meanwhile and said so itself
        dump("peer failure");
        abort_(failure_from(first, fmt::format("rank {}/{}: the group was aborted because another rank failed:\n  {}",
                                                rank_, size_, text_of_failure(first))));
        return;
      }
      answer_stall_queries();
      inspect_stall();
      if (store_->check({kRound})) {
        store_->set(progress_key(rank_), progress());
        const Deadline deadline = deadline_after(clock_, settings_.settle + std::chrono::seconds(5));
        while (!store_->check({kVerdict}) && !expired(clock_, deadline)) {
          std::unique_lock wait_lock(mutex_);
          if (stop_.wait_for(wait_lock, std::chrono::milliseconds(100), [&] { return stopping_; })) return;
        }
        const std::string verdict =
            store_->check({kVerdict}) ? store_->get(kVerdict) : std::string("watchdog: a rank timed out; no verdict arrived");
        // Dump first: a rank stuck outside lockstep may be stopped by its
        // launcher as soon as another rank reports the failure.
        dump("watchdog");
        abort_(std::make_exception_ptr(TimeoutError(
            fmt::format("rank {}/{}: the group was aborted by the watchdog:\n{}", rank_, size_, verdict))));
        return;
      }
    } catch (const std::exception& e) {
      log_.debug("watchdog: the store is unreachable ({}); stopping", e.what());
      return;
    }
    lock.lock();
  }
}

void GroupDiagnostics::answer_stall_queries() {
  if (!store_->check({kStallQuery})) return;
  const std::uint64_t asked = std::stoull(store_->get(kStallQuery));
  // Queries are numbered densely; two ranks that ask at once may store
  // their numbers out of order, so answer every one not yet answered.
  for (std::uint64_t g = std::max(answered_stall_query_ + 1, asked > kMaxStallAnswers ? asked - kMaxStallAnswers : 1);
       g <= asked; ++g)
    store_->set(stall_progress_key(g, rank_), progress());
  answered_stall_query_ = std::max(answered_stall_query_, asked);
}

void GroupDiagnostics::inspect_stall() {
  if (settings_.stall_after <= Duration(0)) return;
  const std::int64_t now = to_us(clock_.now());  // the clock the engine stamped started_us on
  for (const auto& r : recorder_.snapshot()) {
    if (r.state != diag::OpState::started || r.started_us == 0) continue;
    const std::int64_t waited_us = now - r.started_us;
    if (waited_us < std::chrono::duration_cast<std::chrono::microseconds>(settings_.stall_after).count() ||
        r.seq == warned_stall_seq_)
      return;
    warned_stall_seq_ = r.seq;
    const std::uint64_t generation = static_cast<std::uint64_t>(store_->add(kStallGeneration, 1));
    store_->set(stall_progress_key(generation, rank_), progress());
    store_->set(kStallQuery, std::to_string(generation));
    std::vector<std::string> keys;
    for (int q = 0; q < size_; ++q) keys.push_back(stall_progress_key(generation, q));
    const Deadline deadline = deadline_after(clock_, kStallCollect);
    while (!store_->check(keys) && !expired(clock_, deadline)) {
      {
        std::unique_lock wait_lock(mutex_);
        if (stop_.wait_for(wait_lock, std::chrono::milliseconds(100), [&] { return stopping_; })) return;
      }
      answer_stall_queries();  // ranks stalled in the same operation ask each other at the same time
    }
    std::vector<std::optional<diag::RankProgress>> all(static_cast<std::size_t>(size_));
    bool everyone_in_it = true;
    for (int q = 0; q < size_; ++q) {
      const auto& key = keys[static_cast<std::size_t>(q)];
      if (store_->check({key})) all[static_cast<std::size_t>(q)] = diag::RankProgress::decode(store_->get(key));
      const auto& p = all[static_cast<std::size_t>(q)];
      everyone_in_it = everyone_in_it && p && p->issued > r.seq;
    }
    const std::string report =
        diag::stall_report(r.seq, describe(r.info, r.seq), rank_, static_cast<double>(waited_us) / 1e6,
                           static_cast<double>(settings_.timeout.count()) / 1000.0, all);
    // Every rank inside a slow operation (a large transfer on a slow link)
    // is not a stall worth a warning; a rank missing from it is.
    if (everyone_in_it && report.find("disagree") == std::string::npos) log_.info("{}", report);
    else log_.warn("{}", report);
    return;
  }
}

std::string GroupDiagnostics::dump(const std::string& reason) {
  try {
    const std::filesystem::path dir = settings_.flight_dir.empty() ? std::filesystem::temp_directory_path()
                                                                    : std::filesystem::path(settings_.flight_dir);
    std::filesystem::create_directories(dir);
    std::string group = name_;
    for (auto& c : group)
      if (c == '/') c = '_';
    const auto path = dir / fmt::format("lockstep-flight-{}-rank{}-pid{}.json", group, rank_, ::getpid());
    write_file_atomically(path.string(), recorder_.to_json(fmt::format("{}/{}", rank_, size_)) + "\n");
    log_.warn("flight recorder ({}) of group '{}': {}; written to {}", reason, name_, recorder_.summary(), path.string());
    return path.string();
  } catch (const std::exception& e) {
    log_.warn("could not write the flight recorder: {}", e.what());
    return {};
  }
}

}  // namespace lockstep
