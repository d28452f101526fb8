// GroupDiagnostics; see group_diagnostics.h.
#include "comm/group_diagnostics.h"

#include <unistd.h>

#include <filesystem>
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

std::string progress_key(int rank) { return fmt::format("watchdog/progress/{}", rank); }

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
                                   std::shared_ptr<diag::Tracer> tracer, DiagnosticsSettings settings)
    : store_(store->clone()),  // its own connection: never queued behind the program's store calls
      rank_(rank),
      size_(size),
      name_(std::move(name)),
      log_(std::move(log)),
      tracer_(std::move(tracer)),
      settings_(std::move(settings)) {
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
  const Deadline deadline = Deadline::after(settings_.settle);
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(progress_key(r));
  while (!store_->check(keys) && !deadline.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::vector<std::optional<diag::RankProgress>> all(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r)
    if (store_->check({keys[static_cast<std::size_t>(r)]}))
      all[static_cast<std::size_t>(r)] = diag::RankProgress::decode(store_->get(keys[static_cast<std::size_t>(r)]));
  const std::string mine = diag::verdict(seq, what, rank_, all);
  return store_->compare_set(kVerdict, "", mine);  // the first verdict stored is everyone's
}

std::exception_ptr GroupDiagnostics::on_failure(std::exception_ptr error, std::uint64_t seq, const OpInfo& info) {
  std::string text = what_of(error);
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
      // leave. The first failure recorded tells everyone what happened.
      const std::string first = store_->compare_set(kFirstFailure, "", text);
      if (!first.empty() && first != text) text += "\n  the first failure in this group was: " + first;
    }
  } catch (const std::exception& e) {
    log_.debug("diagnostics could not reach the store: {}", e.what());  // report what this rank saw
  }
  const std::string file = dump("failure");
  if (!file.empty()) text += "\n  flight recorder: " + file;
  return rewrap(error, text);
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
      if (store_->check({kRound})) {
        store_->set(progress_key(rank_), progress());
        const Deadline deadline = Deadline::after(settings_.settle + std::chrono::seconds(5));
        while (!store_->check({kVerdict}) && !deadline.expired()) {
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
