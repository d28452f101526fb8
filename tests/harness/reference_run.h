// Runs the reference side of a parity test: a program of PyTorch alone (no
// lockstep in it) whose results a lockstep run is compared with. Such a
// program hung now and then on a loaded machine (gloo processes under
// multiprocessing); the scripts print every thread's stack and exit when
// they hang (Python's faulthandler, "Timeout (0:01:00)!"). A hang, so
// reported or caught at the deadline, is retried once, saying why on the
// test's output; the second run's result is what the test judges. A
// reference that does not answer fails the test with its output: it is
// never a skip. Not thread-safe.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "harness/launcher.h"

namespace lockstep::testing {

// Whether run `r` of a reference hung: killed at its deadline, or its own
// watchdog (faulthandler) reported it.
inline bool reference_hung(const RankResult& r) {
  return r.hit_deadline || r.output.find("Timeout (0:") != std::string::npos;
}

inline RankResult run_reference(const std::string& program, const std::vector<std::string>& args,
                                Duration deadline) {
  RankResult r = run_program(program, args, EnvMap{}, deadline);
  if (!reference_hung(r)) return r;
  std::printf("the reference (%s) hung; running it once more. What it printed:\n%s\n", program.c_str(),
              describe(r).c_str());
  std::fflush(stdout);
  return run_program(program, args, EnvMap{}, deadline);
}

}  // namespace lockstep::testing
