// connect_etcd and reach_etcd_again; see etcd_connection.h.
#include "run/etcd_connection.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include <fmt/format.h>

#include "common/env.h"
#include "lockstep/error.h"
#include "run/interruption.h"
#include "run/run_arguments.h"

namespace lockstep::cli {

std::shared_ptr<EtcdStore> connect_etcd(const RunOptions& o, Deadline deadline, int signal_fd) {
  const RendezvousConf conf = parse_rdzv_conf(o.rdzv_conf);
  EtcdOptions options;
  bool https = conf.protocol == "https";
  options.endpoints = parse_etcd_endpoints(o.rdzv_endpoint, &https);
  options.https = https;
  options.prefix = fmt::format("/lockstep/{}/", o.run_id);
  options.cacert = conf.cacert;
  options.cert = conf.cert;
  options.key = conf.key;
  options.username = conf.username;
  if (!conf.username.empty()) {
    const auto password = env_string("LOCKSTEP_ETCD_PASSWORD");
    if (!password)
      throw ConfigError(fmt::format("--rdzv-conf username={} needs its password in LOCKSTEP_ETCD_PASSWORD (kept "
                                    "off the command line, which every user of the host can read)",
                                    conf.username));
    options.password = *password;
  }
  bool said = false;
  for (;;) {
    throw_if_interrupted(signal_fd, "etcd to answer");
    try {
      return std::make_shared<EtcdStore>(options);
    } catch (const TimeoutError& e) {
      if (deadline.expired())
        throw ConfigError(fmt::format("etcd did not answer within the join timeout (--rdzv-timeout): {}; start "
                                      "etcd there or correct --rdzv-endpoint",
                                      e.what()));
      if (!said) std::fprintf(stderr, "lockstep run: waiting for etcd at %s\n", o.rdzv_endpoint.c_str());
      said = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }
}

bool reach_etcd_again(EtcdStore& etcd, Duration within, int signal_fd) {
  std::fprintf(stderr, "lockstep run: trying to reach etcd at %s again for up to %.0f s (--rdzv-timeout), then "
               "joining the job's next round\n", etcd.endpoints_text().c_str(), seconds(within));
  const Deadline deadline = Deadline::after(within);
  while (!etcd.reachable(std::chrono::seconds(1))) {
    throw_if_interrupted(signal_fd, "etcd to answer again");
    if (deadline.expired()) {
      std::fprintf(stderr, "lockstep run: no member of etcd at %s answered for %.0f s; the job cannot go on "
                   "without it\n", etcd.endpoints_text().c_str(), seconds(within));
      return false;
    }
  }
  return true;
}

}  // namespace lockstep::cli
