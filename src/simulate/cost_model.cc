// Cost per algorithm; see cost_model.h. The step counts and volumes follow
// the backends' code: src/comm/algorithms/ring.h (ring), the tcp recursive
// doubling (non-powers of two fold the extra ranks first: one more exchange
// before and one after), and src/comm/shm (one-shot, pipelined two-shot in
// rounds of n x 128 KiB, each round two synchronisations; all-gather and
// reduce-scatter in rounds through slots of n x 128 KiB, one each).
#include "simulate/cost_model.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep::sim {
namespace {

constexpr double kTcpSmallBytes = 64 * 1024;   // LOCKSTEP_TCP_SMALL_BYTES default
constexpr double kShmChunkBytes = 128 * 1024;  // LOCKSTEP_SHM_CHUNK_BYTES default

struct NamedAlgorithm {
  const char* name;
  Algorithm algorithm;
};
constexpr NamedAlgorithm kAlgorithms[] = {
    {"ring", Algorithm::ring},         {"recursive_doubling", Algorithm::recursive_doubling},
    {"halving_doubling", Algorithm::halving_doubling}, {"one_shot", Algorithm::one_shot},
    {"two_shot", Algorithm::two_shot}, {"hierarchical", Algorithm::hierarchical},
    {"tcp", Algorithm::tcp},           {"shm", Algorithm::shm},
};

// The largest power of two not above n, and whether n had extra ranks.
int lower_power_of_two(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// The shm backend's one-shot limit: 256 KiB / n, kept within 16-128 KiB.
double shm_one_shot_bytes(int n) { return std::clamp(256.0 * 1024 / n, 16.0 * 1024, 128.0 * 1024); }

// The shm backend's slots hold n x 128 KiB (LOCKSTEP_SHM_CHUNK_BYTES per
// rank). Its all-gather moves each rank's input (bytes / n) a slot at a
// time; its reduce-scatter each rank's block (bytes / n) 128 KiB at a time
// (a slot holds a piece of every block).
double shm_allgather_rounds(int n, double bytes) { return std::max(1.0, std::ceil(bytes / n / (n * kShmChunkBytes))); }
double shm_reduce_scatter_rounds(int n, double bytes) { return std::max(1.0, std::ceil(bytes / n / kShmChunkBytes)); }

// The cluster with a collective's own fitted link, where it has one.
Cluster with_fitted(const Cluster& c, const Cluster::FittedLink& fitted) {
  if (!fitted.calibrated) return c;
  Cluster out = c;
  out.intra = out.inter = fitted.link;
  out.gamma_us_per_byte = fitted.gamma_us_per_byte;
  return out;
}

// An all-gather or reduce-scatter on the cluster: flat, or the hier
// backend's two phases one after the other (a ring of the hosts on
// bytes / r, and the host's r ranks on all of it; the all-gather runs them
// in that order, the reduce-scatter in the other, for the same sum).
double sharded_collective_us(const Cluster& c, int world, double bytes, CostTerms (*terms)(Algorithm, int, double)) {
  if (world <= 1) return 0;
  const int per_host = std::max(1, std::min(c.ranks_per_host, world));
  const int hosts = (world + per_host - 1) / per_host;
  if (c.algorithm != Algorithm::hierarchical || hosts == 1 || per_host == 1) {
    const Link& pace = hosts > 1 ? c.inter : c.intra;
    return cost_us(terms(c.algorithm, world, bytes), pace, c.gamma_us_per_byte, bytes);
  }
  const double share = bytes / per_host;
  return cost_us(terms(Algorithm::ring, hosts, share), c.inter, c.gamma_us_per_byte, share) +
         cost_us(terms(Algorithm::ring, per_host, bytes), c.intra, c.gamma_us_per_byte, bytes);
}

}  // namespace

Link Link::from_bandwidth(double alpha_us, double gb_per_s) {
  if (gb_per_s <= 0) throw InvalidArgument(fmt::format("a link's bandwidth must be positive, not {} GB/s", gb_per_s));
  return Link{alpha_us, 1e6 / (gb_per_s * 1e9)};
}

double Link::gb_per_s() const { return beta_us_per_byte > 0 ? 1e6 / beta_us_per_byte / 1e9 : 0; }

int hosts_for(const Cluster& c, int ranks) {
  const int per_host = std::max(1, std::min(c.ranks_per_host, ranks));
  return (ranks + per_host - 1) / per_host;
}

double cores_per_rank_at(const Cluster& c, int ranks) {
  if (c.cores_per_host <= 0) return c.cores_per_rank;
  return c.cores_per_host / std::max(1, std::min(c.ranks_per_host, ranks));
}

bool without_spare_core(const Cluster& c, int ranks) {
  const double cores = cores_per_rank_at(c, ranks);
  return ranks > 1 && cores > 0 && cores < 2;
}

double turns_on_a_core(const Cluster& c, int ranks) {
  if (c.cores_per_host <= 0) return c.cores_per_rank > 0 ? std::max(1.0, 1 / c.cores_per_rank) : 1;
  const int on_host = std::max(1, std::min(c.ranks_per_host, ranks));
  return std::max(1.0, std::ceil(on_host / c.cores_per_host - 1e-9));
}

std::string to_string(Algorithm a) {
  for (const auto& n : kAlgorithms)
    if (n.algorithm == a) return n.name;
  return "?";
}

Algorithm backend_algorithm(const std::string& backend) {
  if (backend == "shm") return Algorithm::shm;
  if (backend == "tcp") return Algorithm::tcp;
  return Algorithm::ring;
}

Algorithm parse_algorithm(const std::string& name) {
  for (const auto& n : kAlgorithms)
    if (name == n.name) return n.algorithm;
  throw InvalidArgument(fmt::format("unknown algorithm '{}'; use ring, recursive_doubling, halving_doubling, one_shot, "
                                    "two_shot, hierarchical, tcp or shm",
                                    name));
}

CostTerms flat_terms(Algorithm a, int n, double bytes) {
  if (n <= 1) return {};
  const double k = n;
  const int p = lower_power_of_two(n);
  const double rounds = std::log2(static_cast<double>(p));
  const bool extra = p != n;
  switch (a) {
    case Algorithm::ring:
    case Algorithm::hierarchical:
      return {2 * (k - 1), 2 * (k - 1) / k, (k - 1) / k};
    case Algorithm::recursive_doubling:
      return {rounds + (extra ? 2 : 0), rounds + (extra ? 2 : 0), rounds + (extra ? 1 : 0)};
    case Algorithm::halving_doubling:
      return {2 * rounds + (extra ? 2 : 0), 2.0 * (p - 1) / p + (extra ? 2 : 0), (p - 1.0) / p + (extra ? 1 : 0)};
    case Algorithm::one_shot:
      // Copy in, one synchronisation to see every input and one to release
      // the slot; every rank then reads and reduces all n inputs.
      return {2, 1, k - 1};
    case Algorithm::two_shot: {
      const double round_count = std::max(1.0, std::ceil(bytes / (k * kShmChunkBytes)));
      return {2 * round_count, 2 * (k - 1) / k, (k - 1) / k};
    }
    case Algorithm::tcp:
      return flat_terms(bytes <= kTcpSmallBytes ? Algorithm::recursive_doubling : Algorithm::ring, n, bytes);
    case Algorithm::shm:
      return flat_terms(bytes <= shm_one_shot_bytes(n) ? Algorithm::one_shot : Algorithm::two_shot, n, bytes);
  }
  return {};
}

double cost_us(const CostTerms& t, const Link& link, double gamma_us_per_byte, double bytes) {
  return t.steps * link.alpha_us + t.wire * bytes * link.beta_us_per_byte + t.reduced * bytes * gamma_us_per_byte;
}

double allreduce_us(const Cluster& c, int world, double bytes) {
  if (world <= 1) return 0;
  const int per_host = std::max(1, std::min(c.ranks_per_host, world));
  const int hosts = (world + per_host - 1) / per_host;
  if (c.algorithm != Algorithm::hierarchical || hosts == 1 || per_host == 1) {
    const Link& pace = hosts > 1 ? c.inter : c.intra;
    return cost_us(flat_terms(c.algorithm, world, bytes), pace, c.gamma_us_per_byte, bytes);
  }
  // Reduce-scatter inside each host, an all-reduce of each rank's 1/r share
  // between hosts (r rings side by side), then an allgather inside the host.
  const double r = per_host;
  const CostTerms ring_inside = flat_terms(Algorithm::ring, per_host, bytes);
  const CostTerms half_inside{ring_inside.steps / 2, ring_inside.wire / 2, ring_inside.reduced};
  const CostTerms gather_inside{ring_inside.steps / 2, ring_inside.wire / 2, 0};
  const double share = bytes / r;
  return cost_us(half_inside, c.intra, c.gamma_us_per_byte, bytes) +
         cost_us(flat_terms(Algorithm::ring, hosts, share), c.inter, c.gamma_us_per_byte, share) +
         cost_us(gather_inside, c.intra, c.gamma_us_per_byte, bytes);
}

CostTerms allgather_terms(Algorithm a, int n, double bytes) {
  if (n <= 1) return {};
  const double k = n;
  const int p = lower_power_of_two(n);
  const bool extra = p != n;
  switch (a) {
    case Algorithm::ring:
    case Algorithm::hierarchical:
    case Algorithm::tcp:
      return {k - 1, (k - 1) / k, 0};
    case Algorithm::recursive_doubling:
    case Algorithm::halving_doubling:
      // Extra ranks hand their block to a neighbour first and receive the
      // whole output after.
      return {std::log2(static_cast<double>(p)) + (extra ? 1 : 0), (p - 1.0) / p + (extra ? 1 : 0), 0};
    case Algorithm::one_shot:
    case Algorithm::two_shot:
    case Algorithm::shm:
      // Each rank's piece into its slot (1/n), the others' out ((n-1)/n).
      return {shm_allgather_rounds(n, bytes), 1, 0};
  }
  return {};
}

CostTerms reduce_scatter_terms(Algorithm a, int n, double bytes) {
  if (n <= 1) return {};
  const double k = n;
  const int p = lower_power_of_two(n);
  const bool extra = p != n;
  switch (a) {
    case Algorithm::ring:
    case Algorithm::hierarchical:
    case Algorithm::tcp:
      return {k - 1, (k - 1) / k, (k - 1) / k};
    case Algorithm::recursive_doubling:
    case Algorithm::halving_doubling:
      // Extra ranks fold their whole input into a neighbour first.
      return {std::log2(static_cast<double>(p)) + (extra ? 1 : 0), (p - 1.0) / p + (extra ? 1 : 0),
              (p - 1.0) / p + (extra ? 1 : 0)};
    case Algorithm::one_shot:
    case Algorithm::two_shot:
    case Algorithm::shm:
      // The pieces of the other ranks' blocks into the slot, then this
      // rank's block reduced from all n.
      return {shm_reduce_scatter_rounds(n, bytes), (k - 1) / k, (k - 1) / k};
  }
  return {};
}

double allgather_us(const Cluster& c, int world, double bytes) {
  return sharded_collective_us(with_fitted(c, c.allgather), world, bytes, allgather_terms);
}

double reduce_scatter_us(const Cluster& c, int world, double bytes) {
  return sharded_collective_us(with_fitted(c, c.reduce_scatter), world, bytes, reduce_scatter_terms);
}

Cluster beside_compute(const Cluster& c) {
  Cluster out = c;
  if (c.allgather_beside_compute.calibrated) out.allgather = c.allgather_beside_compute;
  if (c.reduce_scatter_beside_compute.calibrated) out.reduce_scatter = c.reduce_scatter_beside_compute;
  return out;
}

bool beside_compute_applies(const Cluster& c, int ranks) {
  const bool spins = c.algorithm == Algorithm::shm || c.algorithm == Algorithm::one_shot ||
                     c.algorithm == Algorithm::two_shot;
  return without_spare_core(c, ranks) && turns_on_a_core(c, ranks) <= 1 && spins;
}

double allreduce_bus_bytes(int world, double bytes) { return world > 1 ? 2.0 * (world - 1) / world * bytes : 0; }
double allgather_bus_bytes(int world, double bytes) { return world > 1 ? (world - 1.0) / world * bytes : 0; }
double reduce_scatter_bus_bytes(int world, double bytes) { return allgather_bus_bytes(world, bytes); }

}  // namespace lockstep::sim
