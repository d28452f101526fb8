// The launcher's failure reports; see failure_report.h.
#include "run/failure_report.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep::cli {

void print_failure(const RankFailure& f, int node_rank, int attempt, std::size_t others) {
  if (!f.reported_by.empty()) {
    std::fprintf(stderr, "lockstep run: stopped this node's %zu rank(s): %s\n", others, f.reported_by.c_str());
    return;
  }
  if (f.left_early >= 0) {
    // The failure is most likely the consequence: name the rank that left.
    std::fprintf(stderr, "lockstep run: rank %d exited cleanly (exit code 0) while the other ranks still ran, after %.1f s; then rank %d failed: %s after %.1f s (node %d, attempt %d); stopped the other %zu rank(s) on this node\n",
                 f.left_early, f.left_early_seconds, f.rank, f.status.describe().c_str(), f.seconds, node_rank, attempt,
                 others);
    std::fprintf(stderr, "lockstep run: likely cause: rank %d left early. A rank that exits before the others has usually issued fewer collectives (e.g. fewer steps or batches), and the ranks still waiting for it fail; make every rank run the same steps\n",
                 f.left_early);
  } else {
    std::fprintf(stderr, "lockstep run: rank %d failed first: %s after %.1f s (node %d, attempt %d); stopped the other %zu rank(s) on this node\n",
                 f.rank, f.status.describe().c_str(), f.seconds, node_rank, attempt, others);
  }
  if (!f.error_file.empty())
    std::fprintf(stderr, "lockstep run: rank %d recorded its error (%s): %s\n", f.rank, f.error_file_path.c_str(),
                 f.error_file.c_str());
  if (!f.last_stderr.empty()) {
    std::fprintf(stderr, "lockstep run: last lines of rank %d's stderr:\n", f.rank);
    for (const auto& line : f.last_stderr) std::fprintf(stderr, "  | %s\n", line.c_str());
  }
}

std::string failure_line(const RankFailure& f, int node_rank) {
  if (f.left_early >= 0)
    return fmt::format("rank {} on node {} failed: {}, after rank {} exited cleanly while the others still ran (the "
                       "likely cause: it left early)",
                       f.rank, node_rank, f.status.describe(), f.left_early);
  if (!f.error_file.empty())
    return fmt::format("rank {} on node {} failed: {}: {}", f.rank, node_rank, f.status.describe(), f.error_file);
  return fmt::format("rank {} on node {} failed: {}", f.rank, node_rank, f.status.describe());
}

std::string round_failed_key(int round) { return fmt::format("launcher/{}/failed", round); }

std::string node_failed_key(int round, int node_rank) { return fmt::format("launcher/{}/failed/{}", round, node_rank); }

void print_other_nodes_failures(Store& store, const Round& round, Duration patience) {
  std::vector<bool> seen(static_cast<std::size_t>(round.nnodes), false);
  seen[static_cast<std::size_t>(round.node_rank)] = true;
  const Deadline give_up = Deadline::after(patience);
  try {
    for (;;) {
      for (int n = 0; n < round.nnodes; ++n) {
        const std::string key = node_failed_key(round.number, n);
        if (seen[static_cast<std::size_t>(n)] || !store.check({key})) continue;
        std::fprintf(stderr, "lockstep run: another node reported: %s\n", store.get(key).c_str());
        seen[static_cast<std::size_t>(n)] = true;
      }
      if (std::all_of(seen.begin(), seen.end(), [](bool b) { return b; }) || give_up.expired()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const Error&) {
    // The store's host has gone: what it had is printed.
  }
}

}  // namespace lockstep::cli
