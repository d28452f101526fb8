// The presets; see cluster_presets.h and the sources in docs/scaling.md.
// Bandwidths are what an all-reduce achieves per rank (nccl-tests' busbw),
// not line rates: the line rate times the efficiency measured on such
// links. GPU presets leave gamma at 0: NCCL's measured busbw includes its
// in-kernel reduction.
#include "simulate/cluster_presets.h"

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep::sim {
namespace {

Cluster make(const char* name, int per_host, Link intra, Link inter, double gamma_gbps, Algorithm a) {
  Cluster c;
  c.name = name;
  c.ranks_per_host = per_host;
  c.intra = intra;
  c.inter = inter;
  c.gamma_us_per_byte = gamma_gbps > 0 ? 1e-3 / gamma_gbps : 0;
  c.algorithm = a;
  return c;
}

std::vector<Preset> build() {
  const auto bw = Link::from_bandwidth;
  const Link nvlink3 = bw(3, 200);  // A100 NVLink: ~200 GB/s busbw in nccl-tests
  const Link nvlink4 = bw(3, 360);  // H100: 450 GB/s per direction x 0.8
  return {
      {make("dgx-a100", 8, nvlink3, bw(5, 23), 0, Algorithm::hierarchical),
       "8 x A100 per host (NVLink 3), one 200 Gbit/s HDR InfiniBand NIC per GPU"},
      {make("dgx-h100", 8, nvlink4, bw(5, 46), 0, Algorithm::hierarchical),
       "8 x H100 per host (NVLink 4), one 400 Gbit/s NDR InfiniBand NIC per GPU"},
      {make("a100-eth100", 8, nvlink3, bw(30, 12.5 * 0.9 / 8), 0, Algorithm::hierarchical),
       "8 x A100 per host (NVLink 3), one 100 Gbit/s Ethernet NIC per host (TCP)"},
      {make("h100-eth400", 8, nvlink4, bw(20, 50 * 0.9 / 8), 0, Algorithm::hierarchical),
       "8 x H100 per host (NVLink 4), one 400 Gbit/s Ethernet NIC per host (RoCE)"},
      {make("cpu-eth10", 1, bw(50, 1.17), bw(50, 1.17), 5, Algorithm::tcp),
       "one CPU rank per host, 10 Gbit/s Ethernet, lockstep's tcp backend"},
      {make("cpu-eth1", 1, bw(100, 0.117), bw(100, 0.117), 5, Algorithm::tcp),
       "one CPU rank per host, 1 Gbit/s Ethernet, lockstep's tcp backend"},
  };
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = build();  // immutable after first use
  return all;
}

Cluster preset(const std::string& name) {
  std::string names;
  for (const auto& p : presets()) {
    if (p.cluster.name == name) return p.cluster;
    names += (names.empty() ? "" : ", ") + p.cluster.name;
  }
  throw InvalidArgument(fmt::format("simulate: no preset '{}'; the presets are {}", name, names));
}

}  // namespace lockstep::sim
