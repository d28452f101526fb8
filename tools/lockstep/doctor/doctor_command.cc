// `lockstep doctor`; see doctor_command.h. For each world size: run the
// program under `lockstep run` with LOCKSTEP_STATS pointing into the output
// directory, read every rank's statistics, keep the slowest rank's step and
// the ranks' averages; then diagnose (diagnosis.h), write report.md, and
// plot with gnuplot when it is installed.
#include "doctor/doctor_command.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <lockstep_option_checks/option_checks.h>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "common/scaling_plot.h"
#include "doctor/diagnosis.h"
#include "lockstep/affinity.h"
#include "lockstep/error.h"
#include "lockstep/step_stats.h"

namespace lockstep::cli {
namespace {

namespace fs = std::filesystem;

std::string self_path() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  return n > 0 ? std::string(path, static_cast<std::size_t>(n)) : "lockstep";
}

// The largest world the doctor starts on one host (as --nproc-per-node).
constexpr int kMaxRanks = 1 << 16;

// Every item of --ranks is checked: "1,-2" or "2.5" used to pass (only the
// first was, and std::stoi stops at the '.'), and "1,x" ended in "stoi".
std::vector<int> world_sizes(const DoctorOptions& o, int cores) {
  std::vector<int> sizes;
  if (!o.ranks.empty()) {
    std::stringstream in(o.ranks);
    for (std::string item; std::getline(in, item, ',');) {
      const auto n = parse_int(item);
      if (!n || *n < 1 || *n > kMaxRanks)
        throw InvalidArgument(fmt::format("doctor: --ranks {}: '{}' is not a world size; give whole numbers from 1 to "
                                          "{}, e.g. 1,2,4",
                                          o.ranks, item, kMaxRanks));
      sizes.push_back(static_cast<int>(*n));
    }
  } else {
    const int top = o.max_ranks > 0 ? o.max_ranks : cores;
    for (int n = 1; n <= top; ++n) sizes.push_back(n);
  }
  if (sizes.empty()) throw InvalidArgument("doctor: --ranks needs positive world sizes, e.g. 1,2,4");
  return sizes;
}

// The built-in workload's command line for n ranks.
std::vector<std::string> builtin_program(const DoctorOptions& o, int n) {
  const std::string worker = (fs::path(self_path()).parent_path() / "lockstep-doctor-mlp").string();
  if (!fs::exists(worker))
    throw ConfigError(fmt::format("doctor: the built-in workload {} is missing (it is built with libtorch: install "
                                  "libtorch-dev and rebuild); or give a program: lockstep doctor -- PROGRAM ARGS",
                                  worker));
  std::vector<std::string> cmd{worker, "--layers", std::to_string(o.layers), "--width", std::to_string(o.width),
                               "--steps", std::to_string(o.steps), "--bucket-cap-mb", fmt::format("{}", o.bucket_cap_mb)};
  if (o.strong) {
    // In 64 bits: --batch may be up to INT_MAX, and batch x ranks must not wrap.
    cmd.insert(cmd.end(), {"--global-batch", std::to_string(static_cast<std::int64_t>(o.batch) * n)});
  } else {
    cmd.insert(cmd.end(), {"--batch", std::to_string(o.batch)});
  }
  return cmd;
}

// Runs `lockstep run --nproc-per-node n -- cmd` with LOCKSTEP_STATS set;
// its output goes to `log`. Returns the exit status.
int run_world(int n, const std::vector<std::string>& cmd, const std::string& stats_prefix, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("doctor: fork failed");
  if (pid == 0) {
    std::FILE* f = std::freopen(log.c_str(), "w", stdout);
    if (f) ::dup2(STDOUT_FILENO, STDERR_FILENO);
    ::setenv("LOCKSTEP_STATS", stats_prefix.c_str(), 1);
    std::vector<std::string> args{self_path(), "run", "--nproc-per-node", std::to_string(n), "--"};
    args.insert(args.end(), cmd.begin(), cmd.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(args[0].c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Combines every rank's statistics file into one point.
ScalePoint read_point(int n, const std::string& prefix) {
  ScalePoint p;
  p.ranks = n;
  std::vector<RankSummary> ranks;
  for (int r = 0; r < n; ++r) {
    std::ifstream in(fmt::format("{}.rank{}.json", prefix, r));
    if (!in)
      throw Error(fmt::format("doctor: no statistics from rank {} of {} ({}.rank{}.json); does the program train "
                              "with lockstep::torch::DistributedDataParallel?",
                              r, n, prefix, r));
    const auto j = nlohmann::json::parse(in);
    RankSummary s;
    s.rank = r;
    s.steps = j.value("steps", std::size_t{0});
    s.step_ms = j.value("step_ms", 0.0);
    s.compute_ms = j.value("compute_ms", 0.0);
    s.exposed_ms = j.value("exposed_ms", 0.0);
    s.comm_ms = j.value("comm_ms", 0.0);
    s.data_ms = j.value("data_ms", 0.0);
    s.bytes = j.value("bytes_per_step", 0.0);
    ranks.push_back(s);
    if (r == 0) {
      p.buckets = static_cast<int>(j.value("buckets", nlohmann::json::array()).size());
      p.bucket_cap_mb = j.value("bucket_cap_mb", 25.0);
      p.compression = j.value("compression", "none");
    }
  }
  const double k = static_cast<double>(n);
  for (const auto& s : ranks) {
    p.step_ms = std::max(p.step_ms, s.step_ms);
    p.compute_ms += s.compute_ms / k;
    p.exposed_ms += s.exposed_ms / k;
    p.comm_ms += s.comm_ms / k;
    p.data_ms += s.data_ms / k;
    p.bytes_per_step += s.bytes / k;
  }
  p.overlap = p.comm_ms > 0 ? std::clamp(1.0 - p.exposed_ms / p.comm_ms, 0.0, 1.0) : 1.0;
  const auto slow = slow_ranks(ranks);
  const std::string text = describe_stragglers(ranks, slow);
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) p.stragglers.push_back(line);
  return p;
}

// Step time split (stacked) and efficiency against world size, as a PNG.
std::string plot(const std::vector<ScalePoint>& points, const Diagnosis& d, const fs::path& dir) {
  std::vector<PlotRow> rows;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto& p = points[i];
    // The step is the slowest rank's; the parts are averages over the
    // ranks, so what remains is waiting for the slowest.
    rows.push_back({p.ranks, p.compute_ms, p.exposed_ms, p.data_ms,
                    std::max(0.0, p.step_ms - p.compute_ms - p.exposed_ms - p.data_ms), d.efficiency[i]});
  }
  return plot_scaling(rows, dir, "lockstep doctor: step time and efficiency", "slowest rank");
}

}  // namespace

void add_doctor_command(CLI::App& app, DoctorOptions& o) {
  namespace checks = option_checks;
  auto* d = app.add_subcommand("doctor", "Run a program at several world sizes and explain how it scales");
  d->add_option("--max-ranks", o.max_ranks, "Measure 1..N ranks (default: one per core)")
      ->check(checks::whole_number_in(1, kMaxRanks));
  d->add_option("--ranks", o.ranks, "Exact world sizes, e.g. 1,2,4");
  d->add_flag("--strong", o.strong, "Strong scaling: the global batch stays fixed (built-in workload)");
  d->add_option("--out", o.out, "Directory for the report, the plot and the logs")->capture_default_str();
  d->add_option("--layers", o.layers, "Built-in MLP: layers")->capture_default_str()->check(checks::positive_count());
  d->add_option("--width", o.width, "Built-in MLP: width")->capture_default_str()->check(checks::positive_count());
  d->add_option("--batch", o.batch, "Built-in MLP: batch per rank")->capture_default_str()->check(checks::positive_count());
  d->add_option("--steps", o.steps, "Built-in MLP: steps")->capture_default_str()->check(checks::positive_count());
  d->add_option("--bucket-cap-mb", o.bucket_cap_mb, "Built-in MLP: DDP bucket cap")
      ->capture_default_str()
      ->check(checks::positive_number(1 << 20));
  d->add_option("program", o.program, "A program training with DistributedDataParallel, and its arguments")->expected(-1);
}

int run_doctor(const DoctorOptions& o) {
  const int cores = usable_cores();
  const auto sizes = world_sizes(o, cores);
  const fs::path dir(o.out);
  fs::create_directories(dir);
  const bool builtin = o.program.empty();
  if (o.strong && !builtin)
    throw InvalidArgument("doctor: --strong needs the built-in workload; for your program, keep the global batch "
                          "fixed yourself and read the efficiency as strong scaling");
  std::vector<ScalePoint> points;
  for (int n : sizes) {
    const auto cmd = builtin ? builtin_program(o, n) : o.program;
    const std::string prefix = (dir / fmt::format("stats-{}ranks", n)).string();
    const std::string log = (dir / fmt::format("run-{}ranks.log", n)).string();
    std::fprintf(stderr, "lockstep doctor: %d rank(s)...\n", n);
    const int rc = run_world(n, cmd, prefix, log);
    if (rc != 0) throw Error(fmt::format("doctor: the run on {} rank(s) failed with exit code {}; see {}", n, rc, log));
    points.push_back(read_point(n, prefix));
  }
  const Diagnosis d = diagnose(points, o.strong, cores);
  std::string workload = builtin ? fmt::format("built-in MLP, {} x Linear({}, {}), batch {} {}", o.layers, o.width,
                                               o.width, o.batch, o.strong ? "x ranks" : "per rank")
                                 : fmt::format("{}", fmt::join(o.program, " "));
  std::string report = render_report(points, d, o.strong, workload, cores);
  const std::string png = plot(points, d, dir);
  report += png.empty() ? "\n(No plot: gnuplot is not installed.)\n" : fmt::format("\n![scaling]({})\n", fs::path(png).filename().string());
  std::ofstream(dir / "report.md") << report;
  std::printf("%s\nreport: %s\n", report.c_str(), (dir / "report.md").string().c_str());
  return 0;
}

}  // namespace lockstep::cli
