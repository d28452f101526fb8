// The launchers' store: hosting, protection, the run id, reaching it again;
// see launcher_store.h.
#include "run/launcher_store.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "common/env.h"
#include "common/env_vars.h"
#include "common/host.h"
#include "common/socket.h"
#include "lockstep/error.h"
#if LOCKSTEP_WITH_ETCD
#include "run/etcd_connection.h"
#endif
#include "store/store_token.h"

namespace lockstep::cli {
namespace {

// The store: hosted by node 0 of a fixed job, or in an elastic job by the
// launcher that can listen on the endpoint's address (the first one there).
// Every other launcher is a client.
std::unique_ptr<TcpStoreServer> host_store(const JobPlan& plan, bool single, const TcpStoreOptions& options) {
  if (single) return std::make_unique<TcpStoreServer>("127.0.0.1", static_cast<std::uint16_t>(plan.store_port), options);
  if (!plan.elastic) {
    if (plan.node_rank != 0) return nullptr;
    // Several nodes with a loopback address are all on this host (tests).
    const std::string listen = is_loopback_host(plan.store_host) ? plan.store_host : std::string();
    return std::make_unique<TcpStoreServer>(listen, static_cast<std::uint16_t>(plan.store_port), options);
  }
  try {
    return std::make_unique<TcpStoreServer>(plan.store_host, static_cast<std::uint16_t>(plan.store_port), options);
  } catch (const ConfigError&) {
    return nullptr;  // not this host's address, or another launcher here hosts it
  }
}

// The token: random on one node. Several nodes must share one without
// talking first, and nothing they are all given is secret (the endpoint and
// --rdzv-id are on every command line): so a store other hosts can reach
// takes the user's LOCKSTEP_STORE_TOKEN or does not start. Launchers that
// are all on this host (a loopback endpoint) derive one, which keeps out
// other jobs; only this host's users could compute it.
std::string store_token(const RunOptions& o, const JobPlan& plan, bool single) {
  const auto user = env_string(env::kStoreToken);
  if (single) return user.value_or(random_hex(16));
  if (user) return *user;
  const std::string endpoint = format_endpoint(plan.store_host, static_cast<std::uint16_t>(plan.store_port));
  if (!is_loopback_host(plan.store_host))
    throw ConfigError(fmt::format(
        "the store at {} is reachable from other hosts and nothing would protect it: set LOCKSTEP_STORE_TOKEN to "
        "one secret on every node, e.g. `export LOCKSTEP_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' "
        "\\n')` where you start the job (a token derived from the endpoint and --rdzv-id, which every command line "
        "shows, would let anyone who reads them in)",
        endpoint));
  const std::string facts = !o.run_id.empty() ? "id/" + o.run_id : fmt::format("endpoint/{}/nnodes/{}", endpoint, o.nnodes);
  return shared_store_token(std::nullopt, facts);
}

}  // namespace

std::shared_ptr<Store> control_store(const RunOptions& o, const JobPlan& plan, bool single, JobIdentity& job,
                                     std::unique_ptr<TcpStoreServer>& server, Deadline deadline, int signal_fd) {
#if LOCKSTEP_WITH_ETCD
  if (plan.etcd) return connect_etcd(o, deadline, signal_fd);
#endif
  TcpStoreOptions store_options;
  store_options.token = store_token(o, plan, single);
  store_options.connect_timeout = plan.join_timeout;
  server = host_store(plan, single, store_options);
  job.token = store_options.token;
  job.store_addr = single ? "127.0.0.1" : plan.store_host;
  job.store_port = server ? server->port() : plan.store_port;
  if (!server) {
    std::fprintf(stderr, "lockstep run: waiting for the store at %s\n",
                 format_endpoint(job.store_addr, static_cast<std::uint16_t>(job.store_port)).c_str());
    wait_for_listener(job.store_addr, static_cast<std::uint16_t>(job.store_port), deadline, signal_fd);
  }
  return std::make_shared<TcpStore>(job.store_addr, static_cast<std::uint16_t>(job.store_port), store_options);
}

std::string store_protection(bool single, const JobPlan& plan) {
  if (single) return "loopback only, random token";
  if (env_string(env::kStoreToken)) return "protected by LOCKSTEP_STORE_TOKEN";
  return is_loopback_host(plan.store_host) ? "loopback only, token derived from the job" : "";
}

void keep_store_for_readers(TcpStoreServer* server) {
  if (!server) return;
  const Deadline linger = Deadline::after(std::chrono::seconds(2));
  while (server->num_clients() > 1 && !linger.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

void announce_interruption(Store& store, TcpStoreServer* server, const std::string& who, const Interrupted& e,
                           const std::string& key) {
  if (key.empty()) return;  // nobody waits for this launcher
  publish_interruption(store, fmt::format("{} was interrupted: {}", who, e.what()), key);
  keep_store_for_readers(server);
}

std::string agree_run_id(Store& store, const RunOptions& o, const JobPlan& plan, bool hosts_store,
                         const JobIdentity& job, const std::string& who, Deadline deadline, int signal_fd) {
  if (plan.elastic) return store.compare_set("launcher/run_id", "", o.run_id.empty() ? random_hex(6) : o.run_id);
  if (hosts_store) {
    const std::string run_id = o.run_id.empty() ? random_hex(6) : o.run_id;
    store.set("launcher/run_id", run_id);
    return run_id;
  }
  try {
    if (!wait_for_keys(store, {"launcher/run_id"}, deadline, signal_fd, "node 0 to publish the run id"))
      throw ConfigError(fmt::format("node 0's store at {}:{} never published the run id within {:.0f} s; is "
                                    "another program listening on that port?",
                                    job.store_addr, job.store_port, seconds_between(Clock::now(), deadline.at())));
  } catch (const Interrupted& e) {
    announce_interruption(store, nullptr, who, e);
    throw;
  }
  return store.get("launcher/run_id");
}

bool reach_store_again(Store& control, const JobIdentity& job, Duration within, int signal_fd) {
#if LOCKSTEP_WITH_ETCD
  if (auto* etcd = dynamic_cast<EtcdStore*>(&control)) return reach_etcd_again(*etcd, within, signal_fd);
#endif
  const std::string store = format_endpoint(job.store_addr, static_cast<std::uint16_t>(job.store_port));
  std::fprintf(stderr, "lockstep run: trying to reach the store at %s again for up to %.0f s (--rdzv-timeout), "
               "then joining the job's next round\n", store.c_str(), seconds(within));
  const Deadline deadline = Deadline::after(within);
  try {
    wait_for_listener(job.store_addr, static_cast<std::uint16_t>(job.store_port), deadline, signal_fd);
  } catch (const ConfigError&) {
    std::fprintf(stderr, "lockstep run: the store at %s did not answer for %.0f s; the job cannot go on without it\n",
                 store.c_str(), seconds(within));
    return false;
  }
  std::fprintf(stderr, "lockstep run: the store at %s answers again after %.1f s\n", store.c_str(),
               seconds(within) - seconds(deadline.remaining()));
  return true;
}

}  // namespace lockstep::cli
