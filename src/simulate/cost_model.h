// The time one all-reduce, all-gather or reduce-scatter takes, per
// algorithm, from the latency (alpha), per-byte (beta) and reduction
// (gamma) terms of the links it crosses: the Hockney model, with each
// algorithm's step counts and byte volumes as the shm and tcp backends
// implement them (docs/algorithms.md). Values and pure functions;
// thread-safe.
#pragma once

#include <string>
#include <vector>

namespace lockstep::sim {

// How long a message takes on a link: alpha_us + bytes * beta_us_per_byte.
struct Link {
  double alpha_us = 0;
  double beta_us_per_byte = 0;
  // Bandwidth in GB/s (1e9 bytes per second) <-> beta.
  static Link from_bandwidth(double alpha_us, double gb_per_s);
  double gb_per_s() const;
};

enum class Algorithm {
  ring,                // reduce-scatter + allgather around a ring: 2(n-1) steps
  recursive_doubling,  // log2 n rounds, each exchanging the whole buffer
  halving_doubling,    // recursive halving reduce-scatter + doubling allgather
  one_shot,            // every rank reads every input once (shm, small buffers)
  two_shot,            // each rank reduces its chunk from every input, then all copy (shm, large)
  hierarchical,        // reduce-scatter inside a host, ring between hosts, allgather inside
  tcp,                 // the tcp backend's choice: recursive doubling up to 64 KiB, else ring
  shm,                 // the shm backend's choice: one-shot up to 256 KiB / n, else two-shot
};

std::string to_string(Algorithm a);
// The algorithm a backend runs (shm, tcp); ring for others.
Algorithm backend_algorithm(const std::string& backend);
// Throws InvalidArgument naming the accepted names.
Algorithm parse_algorithm(const std::string& name);

// Where the ranks are and how they are connected. Ranks fill hosts in order
// (ranks_per_host on each); `intra` is the link between two ranks of a host,
// `inter` a rank's share of the network between hosts. `gamma_us_per_byte`
// is the reduction's cost per byte of input it reads.
struct Cluster {
  std::string name = "custom";
  int ranks_per_host = 1;
  Link intra;
  Link inter;
  double gamma_us_per_byte = 0;
  Algorithm algorithm = Algorithm::ring;
  // What the hosts' CPUs add (step_simulation.h, CpuCosts); 0 where unknown
  // or free: one rank's memory copy rate, the share of a collective's time
  // that occupies a core, and the cores each rank has.
  double copy_gb_per_s = 0;
  double comm_cpu_share = 0;
  double cores_per_rank = 0;
  // The cores of a host its ranks share (0: not known): a calibration's
  // cores per rank times the ranks it ran on its host. With more ranks on a
  // host than that (cores_per_rank_at), they take turns on the cores.
  double cores_per_host = 0;
  // The 16-bit compression hooks (fp16, bf16), where calibrated from
  // `lockstep bench -d half` / `-d bfloat16` on ordinary buffers: the hook
  // reduces a 16-bit copy of the bucket in memory of its own, not in the
  // shared buckets, so its all-reduce runs at that rate, not the fp32
  // shared-buffer one; it narrows the bucket (fp32 bytes at narrow_gb_per_s)
  // on the thread that runs backward and widens the result (widen_gb_per_s)
  // after the all-reduce, before the next bucket's. 0 where unknown: the
  // fp32 link at half the bytes, conversions free.
  struct Hook16 {
    bool calibrated = false;
    Link link;
    double gamma_us_per_byte = 0;
    double narrow_gb_per_s = 0;
    double widen_gb_per_s = 0;
  };
  Hook16 fp16;
  Hook16 bf16;
  // The fp32 all-reduce out of place, where calibrated from `lockstep bench
  // --out-of-place --shared-buffers`: DDP's default reducer reduces from
  // the set of buckets backward wrote into the other set, and on the shm
  // backend that runs at another rate than in place (gradient_as_bucket_view,
  // one set), which the links above are fitted to. Not calibrated: both
  // modes take the links above.
  struct FittedLink {
    bool calibrated = false;
    Link link;
    double gamma_us_per_byte = 0;
  };
  FittedLink out_of_place;
  // Fully sharded training's all-gather and reduce-scatter, where calibrated
  // from `lockstep bench --op allgather` / `--op reduce_scatter` rows (fp32):
  // the links above are fitted to the all-reduce, which on the shm backend
  // runs a single-copy path on shared buffers that these two do not have.
  // Not calibrated: the links above, with each collective's own steps and
  // volumes (allgather_terms, reduce_scatter_terms).
  FittedLink allgather;
  FittedLink reduce_scatter;
  // The same two measured beside compute (`lockstep bench --op allgather
  // --busy N`: N processes spin on the ranks' cores, as a step's compute
  // runs beside its collectives where a rank has no spare core). A fully
  // sharded step's collectives that overlap its compute on such a rank
  // take these (beside_compute); not calibrated: the idle ones above.
  FittedLink allgather_beside_compute;
  FittedLink reduce_scatter_beside_compute;
  // DDP's fp32 all-reduce beside compute (`lockstep bench --busy N`, on the
  // buffers its bucket rows were measured on): where calibrated, a bucket's
  // all-reduce overlapping backward on a rank without a spare core runs at
  // this rate instead of the one comm_cpu_share gives it (CpuCosts).
  FittedLink allreduce_beside_compute;
  // The calibration's mean relative error (0: not calibrated), so that a
  // poor fit is reported wherever the cluster is used.
  double fit_error = 0;
};

// The hosts `ranks` ranks fill, ranks_per_host on each.
int hosts_for(const Cluster& c, int ranks);

// The cores each of `ranks` ranks has: the host's cores shared by the
// ranks on one host, where the cluster knows them (cores_per_host), else
// the calibration's cores_per_rank; 0 where neither is known.
double cores_per_rank_at(const Cluster& c, int ranks);

// Whether `ranks` ranks (more than one) have less than two known cores
// each: none spare beside the compute for the group's thread, which then
// copies on the compute's core.
bool without_spare_core(const Cluster& c, int ranks);

// How many ranks take turns on the busiest core when `ranks` run: the
// ranks on a host over its cores, rounded up (three ranks on two cores put
// two on one, and a synchronous step waits for that core); 1 with a core
// each or where the cores are not known.
double turns_on_a_core(const Cluster& c, int ranks);

// The coefficients of one algorithm's cost on a single kind of link:
// time = steps * alpha + wire * S * beta + reduced * S * gamma.
struct CostTerms {
  double steps = 0;
  double wire = 0;     // bytes each rank sends (or copies) per byte of buffer
  double reduced = 0;  // bytes each rank reduces per byte of buffer
};

// For a flat (single-level) algorithm on n ranks. hierarchical and the
// backends' choices (tcp, shm) resolve to the flat algorithm they run for
// `bytes`; hierarchical on one level is a ring.
CostTerms flat_terms(Algorithm a, int n, double bytes);
double cost_us(const CostTerms& t, const Link& link, double gamma_us_per_byte, double bytes);

// One all-reduce of `bytes` over `world` ranks of the cluster. A flat
// algorithm spanning hosts is paced by the slower inter-host link; the
// hierarchical one adds its three phases. 0 for a world of one.
double allreduce_us(const Cluster& c, int world, double bytes);

// The all-gather and the reduce-scatter, `bytes` the whole buffer as in
// nccl-tests (the all-gather's output, the reduce-scatter's input), as the
// backends run them: the tcp backend's ring at every size (the two halves
// of the ring all-reduce: n-1 steps, (n-1)/n of the buffer sent, and for
// the reduce-scatter (n-1)/n reduced); the shm backend's rounds through
// slots of n x 128 KiB (one synchronisation a round; an all-gather copies
// the whole output through memory, a reduce-scatter (n-1)/n of its input
// in and reduces as much); recursive halving / doubling for
// recursive_doubling and halving_doubling (log2 p steps, the halves of
// halving_doubling's all-reduce). Flat algorithms; hierarchical on one
// level is the ring.
CostTerms allgather_terms(Algorithm a, int n, double bytes);
CostTerms reduce_scatter_terms(Algorithm a, int n, double bytes);

// On the cluster, with the calibrated all-gather / reduce-scatter links
// where the cluster has them. Across hosts, hierarchical runs the hier
// backend's two phases: the all-gather gathers a rank's blocks across
// hosts (a ring of the hosts on bytes / ranks per host), then the rows
// inside the host; the reduce-scatter reduces inside the host first, then
// a ring of the hosts on bytes / ranks per host. 0 for a world of one.
double allgather_us(const Cluster& c, int world, double bytes);
double reduce_scatter_us(const Cluster& c, int world, double bytes);

// The cluster whose all-gather and reduce-scatter are the ones measured
// beside compute, where calibrated; the others as they are.
Cluster beside_compute(const Cluster& c);

// Whether the rates measured beside compute apply to `ranks` ranks: where a
// rank has no spare core, no two ranks take turns on one (the turns charge
// that competition already), and the backend waits for its peers spinning
// (shm), so that a collective slowed by the compute beside it holds its
// core for all that time. A tcp wait blocks in the kernel and leaves the
// core to the compute: there the idle rates and comm_cpu_share hold
// (docs/scaling.md, measured both ways).
bool beside_compute_applies(const Cluster& c, int ranks);

// The bytes each rank moves per collective in a bandwidth-optimal
// algorithm, nccl-tests' bus bandwidth factor: 2(n-1)/n of the buffer for
// an all-reduce, (n-1)/n for an all-gather or a reduce-scatter. What a
// sharded step communicates is compared with DDP's in these.
double allreduce_bus_bytes(int world, double bytes);
double allgather_bus_bytes(int world, double bytes);
double reduce_scatter_bus_bytes(int world, double bytes);

}  // namespace lockstep::sim
