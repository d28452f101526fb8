// Forming groups: init_process_group (the world) and make_group (any group,
// world or sub-group): store, rendezvous, backend choice, connection.
#include <netdb.h>

#include <algorithm>
#include <functional>
#include <thread>

#include <fmt/format.h>

#include "comm/backend_registry.h"
#include "comm/group_impl.h"
#include "comm/launch_env.h"
#include "comm/rendezvous.h"
#include "common/env_vars.h"
#include "common/host.h"
#include "common/launcher_keys.h"
#include "common/socket.h"
#include "lockstep/error.h"
#include "store/c10d_store.h"

namespace lockstep {
namespace {

// Keeps this process's store server running until every rank has reported
// the end of its world group, or every other client has disconnected (they
// failed and left), or a grace period passed; so rank 0 finishing or failing
// first does not cut the others off mid-teardown or before they read why.
// When `ends_job` says this process will end the whole job anyway (mpirun,
// after a failure: a backend's job_ends_at_exit, backend_registry.h), a rank stuck outside lockstep would
// only hold the end back: the others have read the verdict by now, so the
// wait is short.
class StoreHost {
 public:
  StoreHost(std::unique_ptr<TcpStoreServer> server, std::shared_ptr<Store> store, std::string finished_key, int size,
            std::function<bool()> ends_job = {})
      : server_(std::move(server)),
        store_(std::move(store)),
        finished_key_(std::move(finished_key)),
        size_(size),
        ends_job_(std::move(ends_job)) {}
  ~StoreHost() {
    const Deadline deadline = Deadline::after(ends_job_ && ends_job_() ? kGraceBeforeJobEnds : kGrace);
    try {
      while (store_->add(finished_key_, 0) < size_ && server_->num_clients() > 1 && !deadline.expired())
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } catch (const std::exception&) {
      // The store is going away anyway.
    }
  }
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;

 private:
  static constexpr Duration kGrace = std::chrono::seconds(30);
  static constexpr Duration kGraceBeforeJobEnds = std::chrono::seconds(2);
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Store> store_;
  std::string finished_key_;
  int size_;
  std::function<bool()> ends_job_;
};

bool all_same(const std::vector<std::string>& v) {
  return std::all_of(v.begin(), v.end(), [&](const std::string& s) { return s == v.front(); });
}

bool some_host_runs_several(const std::vector<std::string>& host_ids) {
  std::vector<std::string> sorted = host_ids;
  std::sort(sorted.begin(), sorted.end());
  return std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end();
}

// The address peers should connect to for the tcp backend.
std::string choose_listen_address(const GroupSpec& spec, const std::vector<std::string>& host_ids) {
  if (!spec.listen_address.empty()) return spec.listen_address;
  if (!spec.config.socket_addr.empty()) return spec.config.socket_addr;
  if (all_same(host_ids)) return "127.0.0.1";
  // The address this host uses to reach the store is one the store's host,
  // and so most likely every other host, can reach.
  const std::string local = spec.root_store->advertised_address();
  if (!local.empty() && local != "127.0.0.1" && local != "::1") return local;
  return host_name();
}

DiagnosticsSettings diagnostics_settings(const Config& config, Duration timeout) {
  DiagnosticsSettings s;
  s.timeout = timeout;
  s.stall_after = config.stall_warning.value_or(std::min<Duration>(timeout / 2, std::chrono::seconds(60)));
  s.detail = config.debug == DebugLevel::detail;
  s.flight_dir = config.flight_dir;
  s.settle = config.watchdog_settle.value_or(s.settle);
  return s;
}

// Under torchrun with TORCHELASTIC_USE_AGENT_STORE=True (1.x's static
// rendezvous, every rendezvous of 2.x) its agent already hosts a PyTorch
// TCPStore on MASTER_ADDR:MASTER_PORT: every rank, rank 0 included, is a
// client, under the prefix PyTorch 1.x's env:// rendezvous gives a restart
// attempt (2.x's drops it, saying each attempt gets a new store; the prefix
// costs nothing there), so that a restarted job never reads the keys of the
// attempt before. PyTorch's store has no authentication: no token.
std::shared_ptr<Store> join_agent_store(const LaunchInfo& launch, const Config& config) {
  C10dStoreOptions options;
  options.connect_timeout = launch.connect_timeout;
  options.timeout = launch.timeout;
  try {
    auto agent = std::make_shared<C10dStore>(launch.master_addr, static_cast<std::uint16_t>(launch.master_port),
                                             options);
    return std::make_shared<PrefixStore>(fmt::format("/worker/attempt_{}", config.restart_count), agent);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("rank {}: cannot reach torchrun's store at {}={} {}={} ({}=True): {}. Is torchrun's "
                                  "agent running there? LOCKSTEP_CONNECT_TIMEOUT sets how long to keep trying",
                                  launch.rank, env::kMasterAddr, launch.master_addr, env::kMasterPort,
                                  launch.master_port, env::kTorchelasticUseAgentStore, e.what()));
  }
}

}  // namespace

// auto: shm on one host; hier when the ranks span hosts and some host runs
// several (their traffic then crosses the wire once per host); tcp when every
// host runs one rank. An explicit hier on one host degenerates to shm (a
// sub-group of a hier world that lies inside one host).
std::string resolve_backend(const std::string& requested, const std::vector<std::string>& host_ids) {
  const bool one_host = all_same(host_ids);
  if (requested.empty() || requested == "auto") {
    if (one_host) return "shm";
    return some_host_runs_several(host_ids) ? "hier" : "tcp";
  }
  if (requested == "shm" && !one_host)
    throw ConfigError("backend 'shm' needs every rank on one host, but the ranks run on several hosts; use 'auto', "
                      "'hier' or 'tcp'");
  if (requested == "hier") return one_host ? "shm" : "hier";
  // Anything else by name (mpi, nccl: only when asked for; nccl needs one
  // GPU per rank, which "auto" cannot know).
  return std::string(registered_backend(requested).name);
}

std::shared_ptr<ProcessGroup> make_group(GroupSpec spec) {
  auto impl = std::make_unique<ProcessGroup::Impl>();
  impl->log = spec.log;
  impl->store = std::make_shared<PrefixStore>(spec.key, spec.root_store);
  impl->store->set_timeout(spec.timeout);
  if (spec.world_ranks.empty())
    for (int r = 0; r < spec.size; ++r) spec.world_ranks.push_back(r);
  const Duration rendezvous_timeout = spec.rendezvous_timeout.count() > 0 ? spec.rendezvous_timeout : spec.timeout;
  impl->host_ids = rendezvous(*impl->store, spec.rank, spec.size, rendezvous_timeout, spec.host_id, *spec.os);
  impl->backend_name = resolve_backend(spec.backend, impl->host_ids);

  BackendContext ctx;
  ctx.rank = spec.rank;
  ctx.size = spec.size;
  ctx.world = spec.world;
  ctx.store = impl->store;
  ctx.group_key = spec.key;
  ctx.timeout = spec.timeout;
  ctx.connect_timeout = spec.connect_timeout;
  ctx.host_ids = impl->host_ids;
  ctx.listen_address = choose_listen_address(spec, impl->host_ids);
  ctx.tcp_small_bytes = spec.tcp_small_bytes;
  ctx.config = spec.config;
  ctx.os = spec.os;
  ctx.log = spec.log;
  impl->backend = registered_backend(impl->backend_name).make(ctx);
  impl->diagnostics = std::make_unique<GroupDiagnostics>(impl->store, spec.rank, spec.size, spec.key, spec.log,
                                                         spec.tracer, spec.diagnostics, *spec.os);
  GroupDiagnostics* diagnostics = impl->diagnostics.get();
  impl->engine = std::make_unique<detail::ProgressEngine>(
      fmt::format("rank {}/{}", spec.rank, spec.size), spec.timeout, impl->backend->inline_max_bytes(),
      [diagnostics](std::exception_ptr error, std::uint64_t seq, const OpInfo& info) {
        std::exception_ptr reported = diagnostics->on_failure(error, seq, info);
        note_group_failed(reported);  // under mpirun, the job ends when this process exits
        return reported;
      },
      &diagnostics->recorder(), diagnostics->tracer(), *spec.os);
  detail::ProgressEngine* engine = impl->engine.get();
  diagnostics->start_watchdog([engine](std::exception_ptr error) {
    note_group_failed(error);
    engine->abort(error);
  });
  spec.log.info("joined group '{}' as rank {} of {} ({} backend)", spec.key, spec.rank, spec.size, impl->backend_name);
  impl->spec = std::move(spec);
  return std::make_shared<ProcessGroup>(std::move(impl));
}

std::shared_ptr<ProcessGroup> init_process_group(GroupOptions options) {
  // The one place a group reads the environment, and only when no Config
  // was given.
  Config config = options.config ? *options.config : Config::from_environment();
  const LaunchInfo launch = resolve_launch(options, config);
  GroupSpec spec;
  spec.rank = launch.rank;
  spec.size = launch.world_size;
  spec.world = true;
  spec.backend = !options.backend.empty() ? options.backend : config.backend;
  spec.timeout = launch.timeout;
  spec.connect_timeout = launch.connect_timeout;
  spec.listen_address = options.listen_address;
  spec.host_id = !options.host_id.empty() ? options.host_id : config.host_id;
  spec.tcp_small_bytes = options.tcp_small_bytes.value_or(config.tcp_small_bytes.value_or(0));
  spec.key = fmt::format("{}/{}", launch.run_id, options.name);
  spec.finished_key = fmt::format("{}/finished/{}", launch.run_id, options.name);
  spec.log = Logger(config.log_level).for_rank(launch.rank, launch.world_size);
  spec.diagnostics = diagnostics_settings(config, launch.timeout);
  spec.tracer = std::make_shared<diag::Tracer>(config.trace_prefix, launch.rank);
  if (options.os) spec.os = options.os;
  if (launch.source == LaunchSource::none) spec.log.info("no launcher environment found: running as a world of one");
  if (!launch.ignored_variables.empty())
    spec.log.warn("the launcher's variables are ignored, since the program gave this group's rank and size: {}",
                  launch.ignored_variables);

  TcpStoreOptions store_options;
  store_options.token = launch.token;
  store_options.connect_timeout = launch.connect_timeout;
  store_options.timeout = launch.timeout;
  store_options.os = options.os;
  if (options.store) {
    // The program's store has no StoreHost of ours waiting for the count,
    // and its host may be gone by the time this group ends (rank 0 leaves
    // right after destroy_process_group): reporting the end would only
    // reach for a closed socket.
    spec.root_store = options.store;
    spec.finished_key.clear();
  } else if (const BackendRegistration* runtime = store_bootstrap_for(launch.source);
             launch.master_addr.empty() && runtime != nullptr && launch.world_size > 1) {
    // Started by a launcher's runtime alone (mpirun): rank 0 hosts the
    // store on a free port and tells the others where through it.
    BootstrappedStore boot = runtime->bootstrap_store(launch, store_options);
    spec.root_store = boot.client;
    if (boot.server)
      spec.keepalive = std::make_shared<StoreHost>(std::move(boot.server), boot.client, spec.finished_key,
                                                   launch.world_size, [] { return job_ends_at_exit(); });
  } else if (launch.master_addr.empty()) {
    spec.root_store = std::make_shared<HashStore>();  // a world of one needs no network
  } else if (config.torchelastic_use_agent_store && !launch.store_hosted && options.master_addr.empty() &&
             options.master_port < 0) {
    spec.root_store = join_agent_store(launch, config);
  } else {
    // A store that other hosts can reach (MASTER_ADDR not loopback, rank 0
    // hosting it) needs a secret every rank shares: what they all share
    // otherwise (the address, the port, the job's size) anyone can read.
    if (store_options.token.empty() && !is_loopback_host(launch.master_addr) && !launch.store_hosted)
      throw ConfigError(fmt::format(
          "rank {}: rank 0 would host the rendezvous store at {}, which other hosts can reach, and nothing would "
          "protect it: set LOCKSTEP_STORE_TOKEN to one secret for every rank (or start the ranks with `lockstep run`){}",
          launch.rank, format_endpoint(launch.master_addr, static_cast<std::uint16_t>(launch.master_port)),
          launch.source == LaunchSource::slurm
              ? "; in a batch script, `export LOCKSTEP_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')` "
                "before srun (srun passes the environment on to every task)"
              : ""));
    std::unique_ptr<TcpStoreServer> server;
    // A loopback MASTER_ADDR means every rank is on this host: listen there
    // only, so the store (often without a token) is not reachable from the network.
    if (launch.rank == 0 && !launch.store_hosted)
      server = std::make_unique<TcpStoreServer>(is_loopback_host(launch.master_addr) ? launch.master_addr : "",
                                                static_cast<std::uint16_t>(launch.master_port), store_options);
    std::shared_ptr<TcpStore> client;
    try {
      client = std::make_shared<TcpStore>(launch.master_addr, static_cast<std::uint16_t>(launch.master_port),
                                          store_options);
    } catch (const ConfigError& e) {
      const char* addr_var = launch.store_hosted ? env::kStoreAddr : env::kMasterAddr;
      const char* port_var = launch.store_hosted ? env::kStorePort : env::kMasterPort;
      // Under srun the address may be Slurm's first node, not a variable.
      const bool from_slurm = !launch.store_hosted && !config.master_addr_from.empty() &&
                              launch.master_addr == config.master_addr;
      const std::string where =
          from_slurm ? fmt::format("{} ({}), port {}{}", launch.master_addr, config.master_addr_from,
                                   launch.master_port,
                                   config.master_port_from.empty() ? "" : " (" + config.master_port_from + ")")
                     : fmt::format("{}={} {}={}", addr_var, launch.master_addr, port_var, launch.master_port);
      throw ConfigError(fmt::format("rank {}: cannot reach the rendezvous store at {}: {}. "
                                    "Is rank 0 (or the launcher) running, and are {}/{} right? "
                                    "LOCKSTEP_CONNECT_TIMEOUT sets how long to keep trying",
                                    launch.rank, where, e.what(), addr_var, port_var));
    }
    spec.root_store = client;
    if (server)
      spec.keepalive = std::make_shared<StoreHost>(std::move(server), client, spec.finished_key, launch.world_size);
  }
  if (launch.store_hosted) {
    // The launcher says there when it stops the ranks on purpose (a node
    // joins the job), so that a rank that sees a peer go first does not
    // report it as a failure.
    spec.diagnostics.launcher_store = spec.root_store->clone();
    spec.diagnostics.launcher_stop_key = launcher_stop_key(config.restart_count);
  }
  spec.launcher_round = config.restart_count;
  spec.job_size = launch.world_size;
  spec.join_board = spec.key + "/join/";
  const int incarnation = config.incarnation;
  spec.config = std::move(config);
  if (incarnation > 0) return join_running_group(std::move(spec), incarnation);
  return make_group(std::move(spec));
}

}  // namespace lockstep
