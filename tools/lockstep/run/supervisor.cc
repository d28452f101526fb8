// supervise(); see supervisor.h.
#include "run/supervisor.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "lockstep/error.h"
#include "lockstep/error_file.h"
#include "run/output_relay.h"
#include "run/run_arguments.h"

namespace lockstep::cli {
namespace {

// After every rank exited, how long to wait for pipes still held open by
// stray grandchildren before closing them.
constexpr Duration kPipeDrainLimit = std::chrono::seconds(2);

// After the first failure, how long to watch for a rank that exits cleanly
// before the others are stopped. A rank that leaves early destroys its
// group before its process ends (static destructors, unloading libraries);
// its peers notice the first at once and may fail before the second, so a
// rank that is still exiting must not be stopped and go unnamed.
constexpr Duration kCauseSettle = std::chrono::milliseconds(500);

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};

// Per-rank output state.
struct Streams {
  std::unique_ptr<std::FILE, FileCloser> out_log;
  std::unique_ptr<std::FILE, FileCloser> err_log;
  std::unique_ptr<OutputRelay> out;
  std::unique_ptr<OutputRelay> err;
};

class Attempt {
 public:
  Attempt(std::vector<RankProcess>& ranks, int signal_fd, const SupervisorOptions& options)
      : ranks_(ranks), signal_fd_(signal_fd), options_(options) {
    for (std::size_t local = 0; local < ranks_.size(); ++local) {
      const RankProcess& r = ranks_[local];
      Streams s;
      if (options_.write_logs) {
        const std::filesystem::path& dir = options_.rank_dirs.at(local);
        s.out_log.reset(std::fopen((dir / "stdout.log").c_str(), "a"));
        s.err_log.reset(std::fopen((dir / "stderr.log").c_str(), "a"));
        if (!s.out_log || !s.err_log)
          std::fprintf(stderr, "lockstep run: cannot write rank %d's logs in %s: %s\n", r.rank(), dir.c_str(),
                       std::strerror(errno));
      }
      const bool prefixed = options_.prefix_output && !(options_.unprefixed_rank0 && r.rank() == 0);
      const std::string prefix = prefixed ? fmt::format("[{}] ", r.rank()) : "";
      const bool selected = !options_.tee.empty() || !options_.redirects.empty();
      const int tee = stream_mask(options_.tee, static_cast<int>(local), "--tee");
      const int redirected = stream_mask(options_.redirects, static_cast<int>(local), "--redirects");
      const bool shown = options_.console_ranks.empty() || options_.console_ranks.count(static_cast<int>(local));
      const auto console = [&](int stream, std::FILE* f) { return (redirected & stream) || !shown ? nullptr : f; };
      const auto log = [&](int stream) {
        std::FILE* file = stream == kStdout ? s.out_log.get() : s.err_log.get();
        return !selected || ((tee | redirected) & stream) ? file : nullptr;
      };
      s.out = std::make_unique<OutputRelay>(console(kStdout, stdout), log(kStdout), prefix);
      s.err = std::make_unique<OutputRelay>(console(kStderr, stderr), log(kStderr), prefix);
      const std::string rank_prefix = fmt::format("[{}] ", r.rank());
      if (!options_.stdout_filters.empty())
        s.out->duplicate_matching(filtered_file(filtered_out_, "filtered_stdout.log"), &options_.stdout_filters, rank_prefix);
      if (!options_.stderr_filters.empty())
        s.err->duplicate_matching(filtered_file(filtered_err_, "filtered_stderr.log"), &options_.stderr_filters, rank_prefix);
      streams_.push_back(std::move(s));
    }
  }

  AttemptResult run() {
    Clock::time_point next_remote_check = options_.clock->now();
    Clock::time_point next_dropped_check = options_.clock->now();
    std::optional<Clock::time_point> all_exited_at;
    while (!finished(all_exited_at)) {
      std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
      std::vector<std::pair<std::size_t, bool>> owners;  // (rank index, is stderr)
      for (std::size_t i = 0; i < ranks_.size(); ++i) {
        if (ranks_[i].stdout_fd() >= 0) {
          fds.push_back({ranks_[i].stdout_fd(), POLLIN, 0});
          owners.push_back({i, false});
        }
        if (ranks_[i].stderr_fd() >= 0) {
          fds.push_back({ranks_[i].stderr_fd(), POLLIN, 0});
          owners.push_back({i, true});
        }
      }
      ::poll(fds.data(), fds.size(), 50);
      if (fds[0].revents & POLLIN) handle_signals();
      for (std::size_t f = 1; f < fds.size(); ++f)
        if (fds[f].revents & (POLLIN | POLLHUP | POLLERR)) read_stream(owners[f - 1].first, owners[f - 1].second);
      reap();
      if (pending_failure_ >= 0 && (options_.clock->now() >= settle_deadline_ || all_exited())) record_failure();
      if (!stopping_ && pending_failure_ < 0 && options_.remote_failure && options_.clock->now() >= next_remote_check) {
        next_remote_check = options_.clock->now() + options_.monitor_interval;
        if (auto remote = options_.remote_failure()) {
          RankFailure f;
          f.reported_by = *remote;
          result_.first_failure = f;
          begin_stop(SIGTERM);
        }
      }
      if (!stopping_ && options_.continue_after_rank_failure && options_.dropped &&
          options_.clock->now() >= next_dropped_check) {
        next_dropped_check = options_.clock->now() + options_.monitor_interval;
        kill_dropped();
      }
      if (stopping_ && !killed_ && options_.clock->now() >= stop_deadline_) {
        for (auto& r : ranks_) r.signal(SIGKILL);
        killed_ = true;
      }
      if (!all_exited_at && all_exited()) all_exited_at = options_.clock->now();
    }
    for (auto& s : streams_) {
      s.out->finish();
      s.err->finish();
    }
    judge_losses();
    result_.ok = !result_.first_failure && result_.interrupted_by == 0;
    return result_;
  }

 private:
  bool all_exited() const {
    for (const auto& r : ranks_)
      if (r.running()) return false;
    return true;
  }

  // Done when every rank is reaped and its pipes are drained (or a stray
  // grandchild kept them open past the limit).
  bool finished(const std::optional<Clock::time_point>& all_exited_at) {
    if (!all_exited_at) return false;
    bool pipes_open = false;
    for (auto& r : ranks_) pipes_open |= r.stdout_fd() >= 0 || r.stderr_fd() >= 0;
    if (!pipes_open) return true;
    if (options_.clock->now() - *all_exited_at < kPipeDrainLimit) return false;
    for (auto& r : ranks_) {
      r.close_stdout();
      r.close_stderr();
    }
    return true;
  }

  void handle_signals() {
    signalfd_siginfo info{};
    while (::read(signal_fd_, &info, sizeof info) == sizeof info) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) continue;  // reap() runs every pass
      if (result_.interrupted_by == 0) {
        result_.interrupted_by = sig;
        std::fprintf(stderr, "lockstep run: received SIG%s, stopping all ranks\n", sigabbrev_np(sig));
      }
      // A second Ctrl-C means "now": skip the grace period.
      if (stopping_) {
        for (auto& r : ranks_) r.signal(SIGKILL);
        killed_ = true;
      } else {
        begin_stop(sig == SIGHUP ? SIGTERM : sig);
      }
    }
  }

  // Reads what is there (pipes are non-blocking); returns whether it got data.
  bool read_stream(std::size_t i, bool is_stderr) {
    RankProcess& r = ranks_[i];
    const int fd = is_stderr ? r.stderr_fd() : r.stdout_fd();
    char buf[16384];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      (is_stderr ? streams_[i].err : streams_[i].out)->feed(buf, static_cast<std::size_t>(n));
      return true;
    }
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      if (is_stderr) r.close_stderr(); else r.close_stdout();
    }
    return false;
  }

  void reap() {
    std::vector<std::size_t> exited;
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      RankProcess& r = ranks_[i];
      if (!r.running()) continue;
      int status = 0;
      if (::waitpid(r.pid(), &status, WNOHANG) != r.pid()) continue;
      r.exited(status);
      exited.push_back(i);
    }
    // Clean exits first: a rank that left early and the peer that failed
    // because of it are often reaped in the same pass.
    std::stable_partition(exited.begin(), exited.end(), [&](std::size_t i) { return ranks_[i].status().ok(); });
    for (std::size_t i : exited) {
      if (ranks_[i].status().ok())
        note_clean_exit(i);
      else
        note_failure(i);
    }
  }

  // The first rank to exit 0 before any failure: if another rank fails
  // afterwards, this one most likely left early and is named as the cause.
  void note_clean_exit(std::size_t i) {
    if (!stopping_ && !result_.first_failure && first_clean_exit_ < 0) first_clean_exit_ = static_cast<int>(i);
  }

  // The first failure is recorded after kCauseSettle, or when every rank
  // has exited, whichever comes first (see kCauseSettle).
  void note_failure(std::size_t i) {
    if (options_.continue_after_rank_failure && !stopping_ && result_.interrupted_by == 0) return note_loss(i);
    if (result_.first_failure || pending_failure_ >= 0 || result_.interrupted_by != 0 || stopping_) return;
    pending_failure_ = static_cast<int>(i);
    settle_deadline_ = options_.clock->now() + kCauseSettle;
  }

  // The rank that failed first. A rank that records its error (PyTorch's
  // @record, lockstep::record_error) writes the file before it exits and
  // so before its peers can notice it is gone: when the first rank to exit
  // recorded an error, the earliest error file among the ranks failed so
  // far names the cause, even if a peer's process happened to end sooner
  // (torchrun's rule too, on the files' timestamps). When the first to
  // exit recorded none (killed, crashed), or with equal times (the kernel
  // stamps files at the resolution of its tick), the first to exit.
  std::size_t first_to_fail() const {
    const auto written = [&](std::size_t i) -> std::optional<std::filesystem::file_time_type> {
      if (i >= options_.rank_dirs.size()) return std::nullopt;
      std::error_code error;
      const auto time = std::filesystem::last_write_time(options_.rank_dirs[i] / "error.json", error);
      if (error) return std::nullopt;
      return time;
    };
    auto first = static_cast<std::size_t>(pending_failure_);
    std::optional<std::filesystem::file_time_type> earliest = written(first);
    // The first to exit wrote no error file: it crashed or was killed, and
    // a peer's later error file is that peer noticing it.
    if (!earliest) return first;
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i].running() || ranks_[i].status().ok()) continue;
      const auto time = written(i);
      if (!time || (earliest && *earliest <= *time)) continue;
      earliest = time;
      first = i;
    }
    return first;
  }

  // --on-rank-failure continue: the others go on; they hear of it from the
  // store (rank_lost) as soon as from their collectives. With replacements
  // left, a new process takes its place and joins them.
  void note_loss(std::size_t i) {
    RankProcess& r = ranks_[i];
    while (r.stderr_fd() >= 0 && read_stream(i, true)) {
    }
    while (r.stdout_fd() >= 0 && read_stream(i, false)) {
    }
    std::fprintf(stderr, "lockstep run: rank %d %s after %.1f s; the other ranks go on without it (--on-rank-failure "
                 "continue)\n",
                 r.rank(), r.status().describe().c_str(), seconds_between(r.started(), r.ended()));
    const int rank = r.rank();
    const int ended = incarnation(i);
    result_.survived_loss_of.push_back(r.rank());
    // A rank killed because its peers re-formed without it was lost when
    // they did, not when the launcher got to it: they may have finished
    // (cleanly) before that. A replacement that ended before it joined
    // (refused, or failed while it started) was never the group's: the
    // ranks that outlived the last member lost need not outlive it.
    if (!killed_dropped_.count({r.rank(), incarnation(i)}) && went_on(i)) last_loss_ = r.ended();
    if (!first_loss_) {
      first_loss_ = ended_rank(i);
      first_loss_at_ = r.ended();
    }
    // The replacement's start is counted before the end is said: a
    // survivor that reads the end then sees the start, and one that reads
    // neither yet waits (ProcessGroup::replacements_started,
    // ends_unseen_by_launcher).
    if (replacements_started_ < options_.replacements && options_.start_replacement) replace(i);
    if (options_.rank_lost) options_.rank_lost(rank, ended);
  }

  // Starts local rank `i` again: its replacement joins the running group.
  void replace(std::size_t i) {
    const int rank = ranks_[i].rank();
    ++replacements_started_;
    int next = incarnation(i) + 1;
    try {
      if (options_.next_incarnation) next = options_.next_incarnation(rank);
      ranks_[i] = options_.start_replacement(i, next);
    } catch (const Error& e) {
      std::fprintf(stderr, "lockstep run: could not start a replacement for rank %d: %s\n", rank, e.what());
      // Its start was counted: said ended, so that no survivor waits for it.
      if (options_.rank_lost) options_.rank_lost(rank, next);
      return;
    }
    incarnations_[i] = next;
    result_.replaced.push_back(rank);
    std::fprintf(stderr, "lockstep run: started a replacement for rank %d (replacement %d of %d on this node); it "
                 "joins the running group at its next step boundary\n",
                 rank, replacements_started_, options_.replacements);
  }

  // Whether rank `i` took part in the job: a replacement only once it joined.
  bool went_on(std::size_t i) const {
    if (incarnation(i) == 0 || !options_.joined) return true;
    try {
      return options_.joined(ranks_[i].rank(), incarnation(i));
    } catch (const Error&) {
      return false;  // the store is gone: not known to have joined
    }
  }

  int incarnation(std::size_t i) const { return i < incarnations_.size() ? incarnations_[i] : 0; }

  // --on-rank-failure continue: a rank its peers re-formed without while it
  // neither answered nor ended (frozen, cut off) is killed, and so lost.
  void kill_dropped() {
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      RankProcess& r = ranks_[i];
      if (!r.running() || killed_dropped_.count({r.rank(), incarnation(i)})) continue;
      bool dropped = false;
      try {
        dropped = options_.dropped(r.rank(), incarnation(i));
      } catch (const Error&) {
        return;  // the store does not answer now: asked again at the next poll
      }
      if (!dropped) continue;
      std::fprintf(stderr, "lockstep run: rank %d stopped answering its peers, who re-formed their group without it; "
                   "killing it (--on-rank-failure continue)\n", r.rank());
      r.signal(SIGKILL);
      killed_dropped_.insert({r.rank(), incarnation(i)});
    }
  }

  // With continue: ok if some rank outlived the last death and every such
  // rank exited 0; otherwise the first death is the job's failure. A rank
  // killed because its peers re-formed without it died when they did.
  void judge_losses() {
    if (!first_loss_ || result_.first_failure) return;
    bool outlived = false, all_clean = true;
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      const RankProcess& r = ranks_[i];
      if (r.ended() <= last_loss_ || !went_on(i) || killed_dropped_.count({r.rank(), incarnation(i)})) continue;
      outlived = true;
      all_clean = all_clean && r.status().ok();
    }
    if (outlived && all_clean) return;
    result_.first_failure = first_loss_;
    // The first rank that exited with an error (not killed) after the first
    // death: a survivor that could not go on in place.
    std::optional<std::size_t> survivor;
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      const RankProcess& r = ranks_[i];
      if (r.rank() == first_loss_->rank || r.status().code <= 0 || r.ended() < first_loss_at_) continue;
      if (!survivor || r.ended() < ranks_[*survivor].ended()) survivor = i;
    }
    if (survivor) result_.could_not_go_on = ended_rank(*survivor);
    result_.none_left = !outlived && !survivor;
  }

  // What rank `i` was when it ended: its status, how long it ran, its last
  // lines on stderr.
  RankFailure ended_rank(std::size_t i) const {
    const RankProcess& r = ranks_[i];
    RankFailure f;
    f.rank = r.rank();
    f.status = r.status();
    f.seconds = seconds_between(r.started(), r.ended());
    f.last_stderr.assign(streams_[i].err->last_lines().begin(), streams_[i].err->last_lines().end());
    return f;
  }

  void record_failure() {
    const std::size_t i = first_to_fail();
    pending_failure_ = -1;
    RankProcess& r = ranks_[i];
    // Drain what it already wrote, so the summary shows its last words.
    while (r.stderr_fd() >= 0 && read_stream(i, true)) {
    }
    RankFailure f = ended_rank(i);
    if (i < options_.rank_dirs.size()) {
      f.error_file_path = options_.rank_dirs[i] / "error.json";
      f.error_file = read_error_file(f.error_file_path).value_or("");
    }
    if (first_clean_exit_ >= 0) {
      const RankProcess& early = ranks_[static_cast<std::size_t>(first_clean_exit_)];
      f.left_early = early.rank();
      f.left_early_seconds = seconds_between(early.started(), early.ended());
    }
    result_.first_failure = f;
    begin_stop(SIGTERM);
  }

  void begin_stop(int sig) {
    if (stopping_) return;
    stopping_ = true;
    stop_deadline_ = options_.clock->now() + options_.grace;
    for (auto& r : ranks_) r.signal(sig);
  }

  std::vector<RankProcess>& ranks_;
  int signal_fd_;
  const SupervisorOptions& options_;
  // The attempt's filtered log (opened on first use), shared by its ranks.
  std::FILE* filtered_file(std::unique_ptr<std::FILE, FileCloser>& file, const char* name) {
    if (!file) {
      std::filesystem::create_directories(options_.attempt_dir);
      file.reset(std::fopen((options_.attempt_dir / name).c_str(), "a"));
      if (!file)
        std::fprintf(stderr, "lockstep run: cannot write %s: %s\n", (options_.attempt_dir / name).c_str(),
                     std::strerror(errno));
    }
    return file.get();
  }

  std::unique_ptr<std::FILE, FileCloser> filtered_out_;  // declared before streams_: outlives the relays
  std::unique_ptr<std::FILE, FileCloser> filtered_err_;
  std::vector<Streams> streams_;
  AttemptResult result_;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point stop_deadline_{};
  int first_clean_exit_ = -1;  // index of the first rank that exited 0 before any failure
  int pending_failure_ = -1;   // index of the first failed rank, not yet recorded
  Clock::time_point settle_deadline_{};
  std::optional<RankFailure> first_loss_;  // --on-rank-failure continue: the first rank that died
  Clock::time_point first_loss_at_{};
  Clock::time_point last_loss_{};
  std::set<std::pair<int, int>> killed_dropped_;  // (rank, incarnation) killed by kill_dropped
  std::vector<int> incarnations_ =  // per local rank: its start in the round
      options_.incarnations.empty() ? std::vector<int>(ranks_.size(), 0) : options_.incarnations;
  int replacements_started_ = 0;

};

}  // namespace

AttemptResult supervise(std::vector<RankProcess>& ranks, int signal_fd, const SupervisorOptions& options) {
  return Attempt(ranks, signal_fd, options).run();
}

}  // namespace lockstep::cli
