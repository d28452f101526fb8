// `lockstep simulate`: predicts a data-parallel job's step time, exposed
// communication, efficiency and throughput at many world sizes on a cluster
// that is not here, from a workload profile (a LOCKSTEP_TRACE or
// LOCKSTEP_STATS file, or a model description) and a cluster (a preset, a
// file, or one calibrated from `lockstep bench` results); names the
// bottleneck and the bucket size and compression that minimise the step.
// With --strategy fsdp it predicts the fully sharded step instead, beside
// DDP's, with each rank's memory.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "simulate/failure_report.h"

namespace lockstep::cli {

struct SimulateOptions {
  // Workload.
  std::string model;        // mlp, convnet, resnet50 (description; refines a trace's gradients)
  std::string layers;       // parameters per layer, forward order: "4194304,2048,..."
  double ms_per_sample = 0;  // 0: the model's own
  int batch = 0;             // 0: the model's own, or the trace's (--trace-batch)
  std::string trace;        // a LOCKSTEP_TRACE file
  int trace_batch = 0;      // the batch per rank the trace (or stats file) was recorded at; 0: not given
  int trace_rank = 0;
  // Forward/backward/rest from this trace (e.g. N ranks under no_sync);
  // several (separate runs) give the prediction a run-to-run interval.
  std::vector<std::string> compute_traces;
  std::string stats;        // a LOCKSTEP_STATS file
  double data_ms = -1;      // -1: the profile's
  // Cluster.
  std::string preset = "dgx-a100";
  std::string cluster_file;
  int ranks_per_host = 0;   // 0: the cluster's
  std::string algorithm;    // "": the cluster's
  // Calibration.
  std::vector<std::string> calibrate;  // `lockstep bench` outputs or --json files (fp32; half, bfloat16 for the hooks)
  std::string calibrate_min_bytes;  // "8M"; empty: the backend's large-message threshold
  // What to predict.
  std::string world_sizes = "1,2,4,8,16,32,64,128,256,512,1024";
  double bucket_cap_mb = 25;
  std::string hook = "none";
  int accumulation = 1;
  double jitter = 0;
  std::vector<std::string> jitter_from;  // LOCKSTEP_TRACE files to measure the jitter from
  bool bucket_view = false;  // gradient_as_bucket_view (in place in one set of buckets)
  // Fully sharded training (--strategy fsdp).
  std::string strategy = "ddp";  // ddp, fsdp
  // LOCKSTEP_TRACE files of a fully sharded run: its units (implies fsdp);
  // several (separate runs) give each step its run-to-run interval.
  std::vector<std::string> sharded_traces;
  int units = 0;                 // group the layers into at most this many units; 0: one per layer
  int prefetch = 1;
  bool no_reshard_after_forward = false;
  std::string param_dtype = "fp32";
  std::string reduce_dtype = "fp32";
  double optimizer_bytes = 8;
  // Failures and recovery (failure_report.h).
  FailureOptions failures;
  // A measured step instead of a workload (failures only): its time and
  // the share of it that is compute.
  double step_ms = 0;
  double compute_share = 0.8;
  double state_gb = 0;  // with step_ms: parameters and optimizer state, for a replacement and the checkpoint
  bool list_presets = false;
  std::string out = "lockstep-simulate";
  std::string json;
};

void add_simulate_command(CLI::App& app, SimulateOptions& options);
int run_simulate(const SimulateOptions& options);

}  // namespace lockstep::cli
