// One etcd member (/usr/bin/etcd) started by a test, killed and reaped by
// stop() or the destructor; it dies with the test too (PR_SET_PDEATHSIG),
// so none is left behind. Tests that use it skip where etcd-server is not
// installed (kEtcd absent).
// Thread-safety: owned by one test thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace lockstep::testing {

inline constexpr const char* kEtcd = "/usr/bin/etcd";

class EtcdProcess {
 public:
  // Runs etcd with `args`, its output into the file `log`.
  EtcdProcess(const std::vector<std::string>& args, const std::string& log);
  ~EtcdProcess() { stop(); }
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // Until a connection to 127.0.0.1:`client_port` is taken (etcd listens
  // for clients once it has started); throws after `timeout`, with the log.
  void wait_listening(int client_port, std::chrono::seconds timeout) const;

  void stop();
  const std::string& log() const { return log_; }

 private:
  pid_t pid_ = -1;
  std::string log_;
};

}  // namespace lockstep::testing
