// RankProcess; see rank_process.h.
#include "run/rank_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep::cli {

std::string ExitStatus::describe() const {
  if (code >= 0) return fmt::format("exit code {}", code);
  const char* name = sigabbrev_np(signal);
  return fmt::format("killed by signal {} (SIG{})", signal, name ? name : "?");
}

RankProcess::RankProcess(int rank, const std::vector<std::string>& argv, const std::map<std::string, std::string>& env)
    : rank_(rank), started_(Clock::now()) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0)
    throw Error(fmt::format("cannot create pipes for rank {}: {}", rank, std::strerror(errno)));
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq != std::string::npos && env.count(entry.substr(0, eq))) continue;
    env_strings.push_back(entry);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();

  pid_ = ::fork();
  if (pid_ < 0) throw Error(fmt::format("cannot start rank {}: fork: {}", rank, std::strerror(errno)));
  if (pid_ == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);  // the launcher blocks signals; its ranks must not
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::execvpe(args[0], args.data(), envp.data());
    const char* why = ::strerrordesc_np(errno);  // static text: safe after fork
    (void)!::write(STDERR_FILENO, "lockstep run: cannot execute ", 29);
    (void)!::write(STDERR_FILENO, args[0], std::strlen(args[0]));
    (void)!::write(STDERR_FILENO, ": ", 2);
    (void)!::write(STDERR_FILENO, why, std::strlen(why));
    (void)!::write(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);  // also here, so the group exists before we signal it
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  out_ = UniqueFd(out_pipe[0]);
  err_ = UniqueFd(err_pipe[0]);
  ::fcntl(out_.fd(), F_SETFL, O_NONBLOCK);
  ::fcntl(err_.fd(), F_SETFL, O_NONBLOCK);
}

void RankProcess::exited(int wait_status) {
  running_ = false;
  ended_ = Clock::now();
  if (WIFEXITED(wait_status)) status_.code = WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) status_.signal = WTERMSIG(wait_status);
}

void RankProcess::signal(int sig) const {
  if (!running_) return;
  if (::kill(-pid_, sig) != 0) ::kill(pid_, sig);
  // A stopped process (SIGSTOP, a debugger's stop, Ctrl-Z's SIGTSTP) only
  // acts on a terminating signal once it runs again: continue it, so it
  // ends now rather than at the grace period's SIGKILL.
  if (sig != SIGKILL && sig != SIGCONT && ::kill(-pid_, SIGCONT) != 0) ::kill(pid_, SIGCONT);
}

}  // namespace lockstep::cli
