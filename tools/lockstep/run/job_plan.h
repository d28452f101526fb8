// What `lockstep run` makes of its options before anything starts (JobPlan:
// the nodes, the rendezvous, the store's address, the timeouts), and what
// its launchers then agree on at the store (JobIdentity). Plain data and a
// pure function; thread-safe.
#pragma once

#include <filesystem>
#include <string>

#include "common/clock.h"
#include "run/run_arguments.h"
#include "run/run_command.h"

namespace lockstep::cli {

// What run_job() resolved from the options.
struct JobPlan {
  NodeRange nodes;
  bool elastic = false;
  bool etcd = false;  // the rendezvous in etcd (--rdzv-backend etcd)
  std::string store_host;  // the store's address
  int store_port = 0;
  int node_rank = 0;  // fixed --nnodes only
  Duration join_timeout{0};
  Duration last_call{0};
};

// Where every rank finds the store, and what identifies the job.
struct JobIdentity {
  std::filesystem::path run_dir;  // <log dir or a temporary one>/<run id>: attempts' logs and error files
  std::string store_addr;
  int store_port = 0;
  std::string run_id;
  std::string token;
  std::string shm_tag;
};

// Checks every option against the others (and the values only parsed at a
// rank's start: --tee, --local-ranks-filter, --signals-to-handle, ...) and
// resolves the nodes, the rendezvous and the store's address. Throws
// ConfigError naming the option and the fix; torchrun options lockstep does
// not support are refused with the reason rather than ignored.
JobPlan plan_job(const RunOptions& o);

}  // namespace lockstep::cli
