// Named clusters for `lockstep simulate --preset`: GPU hosts with NVLink
// inside and InfiniBand or Ethernet between them, and CPU hosts on 1 and
// 10 Gbit/s Ethernet. Every number and its source is in docs/scaling.md.
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "simulate/cost_model.h"

namespace lockstep::sim {

struct Preset {
  Cluster cluster;
  std::string description;
};

const std::vector<Preset>& presets();
// Throws InvalidArgument listing the presets.
Cluster preset(const std::string& name);

}  // namespace lockstep::sim
