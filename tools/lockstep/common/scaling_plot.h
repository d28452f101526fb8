// The step-time-and-efficiency plot of `lockstep doctor` and `lockstep
// simulate`: per world size, the step split into stacked parts, and the
// efficiency on a second axis; a PNG drawn by gnuplot when it is installed.
// Runs gnuplot in a child process; thread-compatible.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace lockstep::cli {

struct PlotRow {
  int ranks = 1;
  double compute_ms = 0;
  double exposed_ms = 0;
  double data_ms = 0;
  double rest_ms = 0;  // the doctor: waiting for the slowest rank; simulate: stragglers
  double efficiency = 1;
};

// Writes <dir>/scaling.{dat,gp,png}; returns the PNG's path, or "" when
// gnuplot is missing or failed (its output is in <dir>/gnuplot.log).
std::string plot_scaling(const std::vector<PlotRow>& rows, const std::filesystem::path& dir, const std::string& title,
                         const std::string& rest_title);

}  // namespace lockstep::cli
