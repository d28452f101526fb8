// A Config with nothing from this process's environment (defaults a test
// can rely on), except where flight-recorder dumps go: the directory the
// test runner gives each suite (scripts/run-suite.sh), so that a test whose
// group fails on purpose leaves its dumps beside its log, not in /tmp.
#pragma once

#include <cstdlib>

#include "lockstep/config.h"

namespace lockstep::testing {

inline Config bare_config() {
  Config config;
  if (const char* dir = std::getenv("LOCKSTEP_FLIGHT_DIR")) config.flight_dir = dir;
  return config;
}

}  // namespace lockstep::testing
