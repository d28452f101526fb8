// See etcd_process.h.
#include "harness/etcd_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace lockstep::testing {

EtcdProcess::EtcdProcess(const std::vector<std::string>& args, const std::string& log) : log_(log) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(kEtcd));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);  // the test died before the prctl
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execv(kEtcd, argv.data());
    ::_exit(127);
  }
}

void EtcdProcess::wait_listening(int client_port, std::chrono::seconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(client_port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool taken = fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
    if (fd >= 0) ::close(fd);
    if (taken) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::stringstream text;
      text << std::ifstream(log_).rdbuf();
      throw std::runtime_error("etcd did not listen on port " + std::to_string(client_port) + ": " + text.str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void EtcdProcess::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace lockstep::testing
