// Cost per algorithm; see cost_model.h. The step counts and volumes follow
// the backends' code: src/comm/tcp/ring.h (ring), the tcp recursive doubling
// (non-powers of two fold the extra ranks first: one more exchange before
// and one after), and src/comm/shm (one-shot, pipelined two-shot in rounds of
// n x 128 KiB, each round two synchronisations).
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

}  // namespace

Link Link::from_bandwidth(double alpha_us, double gb_per_s) {
  if (gb_per_s <= 0) throw InvalidArgument(fmt::format("a link's bandwidth must be positive, not {} GB/s", gb_per_s));
  return Link{alpha_us, 1e6 / (gb_per_s * 1e9)};
}

double Link::gb_per_s() const { return beta_us_per_byte > 0 ? 1e6 / beta_us_per_byte / 1e9 : 0; }

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

}  // namespace lockstep::sim
