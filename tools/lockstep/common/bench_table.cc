// Parsing `lockstep bench` output; see bench_table.h.
#include "common/bench_table.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

std::vector<BenchRow> parse_json(const nlohmann::json& j) {
  std::vector<BenchRow> rows;
  for (const auto& r : j.value("results", nlohmann::json::array())) {
    BenchRow row{j.value("ranks", 0), j.value("backend", ""), r.value("op", "allreduce"), r.value("size", 0.0),
                 r.value("time_us", 0.0), r.value("cpu_us", 0.0), j.value("memcpy_gbps", 0.0),
                 j.value("cores_per_rank", 0.0)};
    row.dtype = j.value("dtype", "float");
    row.ranks_per_host = j.value("ranks_per_host", 0);
    row.shared_buffers = j.value("shared_buffers", false);
    row.out_of_place = j.value("out_of_place", false);
    row.busy = j.value("busy", 0);
    row.narrow_gb_per_s = j.value("narrow_gbps", 0.0);
    row.widen_gb_per_s = j.value("widen_gbps", 0.0);
    rows.push_back(row);
  }
  return rows;
}

std::vector<BenchRow> parse_table(const std::string& text) {
  std::vector<BenchRow> rows;
  std::istringstream in(text);
  int ranks = 0;
  std::string backend, op = "allreduce";
  bool shared = false, out_of_place = false;
  int busy = 0;
  for (std::string line; std::getline(in, line);) {
    int n = 0;
    char name[64] = {0};
    if (std::sscanf(line.c_str(), "# lockstep bench: %d ranks, backend %63[^,]", &n, name) == 2) {
      ranks = n;
      backend = name;
      shared = line.find(" shared buffers") != std::string::npos;
      out_of_place = line.find(" out of place") != std::string::npos;
      const auto spinning = line.find(" busy process(es) beside the ranks");
      const auto comma = line.rfind(", ", spinning);
      busy = 0;
      if (spinning != std::string::npos && comma != std::string::npos)
        std::sscanf(line.c_str() + comma + 2, "%d", &busy);
      continue;
    }
    if (std::sscanf(line.c_str(), "# %63s", name) == 1 && line.find(' ', 2) == std::string::npos) {
      op = name;  // "# allreduce" before each op's rows when several are measured
      continue;
    }
    double bytes = 0, count = 0, time = 0;
    char type[32], redop[32];
    int root = 0;
    if (line.rfind('#', 0) != 0 &&
        std::sscanf(line.c_str(), " %lf %lf %31s %31s %d %lf", &bytes, &count, type, redop, &root, &time) == 6) {
      BenchRow row{ranks, backend, op, bytes, time};
      row.dtype = type;
      row.shared_buffers = shared;
      row.out_of_place = out_of_place;
      row.busy = busy;
      rows.push_back(row);
    }
  }
  return rows;
}

}  // namespace

std::vector<BenchRow> parse_bench_output(const std::string& text) {
  std::vector<BenchRow> rows;
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') {
    try {
      rows = parse_json(nlohmann::json::parse(text));
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(fmt::format("bench results: not valid JSON ({})", e.what()));
    }
  } else {
    rows = parse_table(text);
  }
  if (rows.empty())
    throw ConfigError("bench results: no result rows; give the output of `lockstep bench` (its table or its --json file)");
  return rows;
}

std::vector<BenchRow> read_bench_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("cannot open the bench results {}", path));
  std::stringstream text;
  text << in.rdbuf();
  return parse_bench_output(text.str());
}

}  // namespace lockstep::cli
