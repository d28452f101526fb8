// Calibration; see calibration.h. Weighted least squares: each row is
// divided by its measured time, so a 4 KiB row counts as much as a 64 MiB
// one and the fit minimises relative error.
#include "simulate/calibration.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lockstep/error.h"

namespace lockstep::sim {
namespace {

using Row3 = std::array<double, 3>;

// Solves the k x k normal equations (k <= 3) by Gaussian elimination with
// partial pivoting; false when they are (nearly) singular.
bool solve(std::array<Row3, 3> a, Row3 b, int k, Row3& x) {
  for (int c = 0; c < k; ++c) {
    int pivot = c;
    for (int r = c + 1; r < k; ++r)
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    if (std::abs(a[pivot][c]) < 1e-12 * std::max(1.0, std::abs(a[c][c]))) return false;
    std::swap(a[c], a[pivot]);
    std::swap(b[c], b[pivot]);
    for (int r = c + 1; r < k; ++r) {
      const double f = a[r][c] / a[c][c];
      for (int j = c; j < k; ++j) a[r][j] -= f * a[c][j];
      b[r] -= f * b[c];
    }
  }
  for (int c = k - 1; c >= 0; --c) {
    double s = b[c];
    for (int j = c + 1; j < k; ++j) s -= a[c][j] * x[j];
    x[c] = s / a[c][c];
  }
  return true;
}

struct Sample {
  Row3 x;  // steps, wire bytes, reduced bytes; divided by the measured time
  double y = 1;
};

// Fits the first k coefficients; the columns are scaled to unit norm first
// so that microseconds and bytes condition alike.
bool fit_columns(const std::vector<Sample>& s, int k, Row3& coef) {
  Row3 norm{0, 0, 0};
  for (const auto& r : s)
    for (int j = 0; j < k; ++j) norm[j] += r.x[j] * r.x[j];
  for (int j = 0; j < k; ++j) {
    if (norm[j] <= 0) return false;
    norm[j] = std::sqrt(norm[j]);
  }
  std::array<Row3, 3> a{};
  Row3 b{0, 0, 0};
  for (const auto& r : s)
    for (int i = 0; i < k; ++i) {
      b[i] += r.x[i] / norm[i] * r.y;
      for (int j = 0; j < k; ++j) a[i][j] += r.x[i] / norm[i] * r.x[j] / norm[j];
    }
  // Columns that are (nearly) proportional make the scaled matrix singular.
  if (k == 2 && a[0][0] * a[1][1] - a[0][1] * a[1][0] < 1e-9) return false;
  if (k == 3) {
    const double minor = a[1][1] * a[2][2] - a[1][2] * a[2][1];
    if (minor < 1e-6) return false;
  }
  Row3 x{0, 0, 0};
  if (!solve(a, b, k, x)) return false;
  for (int j = 0; j < k; ++j) coef[j] = x[j] / norm[j];
  for (int j = k; j < 3; ++j) coef[j] = 0;
  return true;
}

double relative_error(const Sample& s, const Row3& c) {
  return std::abs(s.x[0] * c[0] + s.x[1] * c[1] + s.x[2] * c[2] - 1);
}

// The middle value (the upper one of an even count); `v` is not empty.
double middle_value(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double median_error(const std::vector<Sample>& s, const Row3& c) {
  std::vector<double> e;
  for (const auto& r : s) e.push_back(relative_error(r, c));
  return middle_value(std::move(e));
}

// A shared machine makes some rows fast or slow by whatever else ran while
// they were measured. Of the (alpha, beta) lines through two rows each, the
// one with the smallest median error over all rows marks the rows that
// agree; rows more than twice that median (and 5%) off it are left out.
std::vector<Sample> agreeing_rows(const std::vector<Sample>& s) {
  if (s.size() < 4) return s;
  Row3 best{0, 0, 0};
  double best_error = 1e300;
  const auto consider = [&](const Row3& c) {
    const double e = median_error(s, c);
    if (e < best_error) {
      best_error = e;
      best = c;
    }
  };
  for (std::size_t i = 0; i < s.size(); ++i) {
    // Bandwidth alone through one row (the only choice when latency grows
    // with the size, as two-shot's per-round synchronisation does).
    if (s[i].x[1] > 0) consider({0, 1 / s[i].x[1], 0});
    for (std::size_t j = i + 1; j < s.size(); ++j) {
      Row3 c{0, 0, 0};
      if (fit_columns({s[i], s[j]}, 2, c) && c[1] > 0 && c[0] >= 0) consider(c);
    }
  }
  if (best_error >= 1e300) return s;
  std::vector<Sample> kept;
  for (const auto& r : s)
    if (relative_error(r, best) <= std::max(2 * best_error, 0.05)) kept.push_back(r);
  return kept.size() >= 2 ? kept : s;
}

}  // namespace

Fit fit_allreduce(const std::vector<cli::BenchRow>& rows, Algorithm algorithm, double min_bytes) {
  return fit_collective(rows, "allreduce", algorithm, min_bytes);
}

Fit fit_collective(const std::vector<cli::BenchRow>& rows, const std::string& op, Algorithm algorithm,
                   double min_bytes) {
  CostTerms (*terms)(Algorithm, int, double) = op == "allreduce"   ? flat_terms
                                               : op == "allgather" ? allgather_terms
                                               : op == "reduce_scatter"
                                                   ? reduce_scatter_terms
                                                   : nullptr;
  if (terms == nullptr)
    throw InvalidArgument(fmt::format("calibrate: no cost model for '{}'; fit allreduce, allgather or reduce_scatter",
                                      op));
  std::vector<Sample> all;
  for (const auto& r : rows) {
    if (r.op != op || r.ranks < 2 || r.bytes < min_bytes || r.time_us <= 0) continue;
    const CostTerms t = terms(algorithm, r.ranks, r.bytes);
    all.push_back({{t.steps / r.time_us, t.wire * r.bytes / r.time_us, t.reduced * r.bytes / r.time_us}, 1});
  }
  if (all.size() < 2)
    throw InvalidArgument(fmt::format("calibrate: {} {} rows of 2 or more ranks at {} bytes or more; measure a range "
                                      "of sizes, e.g. lockstep bench -np 2 --op {} -b 64K -e 64M -f 2 --json FILE",
                                      all.size(), op, min_bytes, op));
  const std::vector<Sample> samples = agreeing_rows(all);
  Fit fit;
  fit.outliers = all.size() - samples.size();
  Row3 c{0, 0, 0};
  fit.gamma_separate = fit_columns(samples, 3, c) && c[0] >= 0 && c[1] > 0 && c[2] >= 0;
  if (!fit.gamma_separate && !(fit_columns(samples, 2, c) && c[0] >= 0 && c[1] > 0)) {
    // Latency too small to fit (or noise made it negative): bandwidth only.
    std::vector<Sample> bytes_only = samples;
    for (auto& s : bytes_only) s.x = {s.x[1], 0, 0};
    Row3 b{0, 0, 0};
    if (!fit_columns(bytes_only, 1, b) || b[0] <= 0) throw Error("calibrate: the measurements fit no positive cost");
    c = {0, b[0], 0};
  }
  fit.link = Link{c[0], c[1]};
  fit.gamma_us_per_byte = c[2];
  fit.rows = samples.size();
  for (const auto& r : samples) {
    const double error = relative_error(r, c);
    fit.mean_error += error / static_cast<double>(samples.size());
    fit.max_error = std::max(fit.max_error, error);
  }
  return fit;
}

std::string poor_fit_warning(double mean_error, const std::string& what) {
  if (!(mean_error > kPoorFitError)) return "";
  return fmt::format(
      "warning: the {} fit is poor: mean error {:.1f}% (above {:.0f}%); predictions from it will be off by about as "
      "much. The machine was probably busy while bench ran: run it again on a quiet machine with more iterations "
      "(-n 50), fit only the buckets' sizes (--calibrate-min-bytes 8M), and calibrate again",
      what, 100 * mean_error, 100 * kPoorFitError);
}

namespace {

std::vector<cli::BenchRow> rows_of(const std::vector<cli::BenchRow>& rows, const std::string& dtype) {
  std::vector<cli::BenchRow> out;
  for (const auto& r : rows)
    if (r.dtype == dtype) out.push_back(r);
  return out;
}

// A fitted link's note ("what: N rows: alpha, beta; errors") and, where
// the fit is poor, its warning; the link itself as the cluster keeps it.
Cluster::FittedLink noted_fit(const Fit& fit, const std::string& what, const std::string& poor_what,
                              Calibration& c) {
  c.notes.push_back(fmt::format("{}: {} rows: alpha {:.2f} us, beta {:.3f} GB/s; mean error {:.1f}%, max {:.1f}%",
                                what, fit.rows, fit.link.alpha_us, fit.link.gb_per_s(), 100 * fit.mean_error,
                                100 * fit.max_error));
  const std::string poor = poor_fit_warning(fit.mean_error, poor_what);
  if (!poor.empty()) c.warnings.push_back(poor);
  return {true, fit.link, fit.gamma_us_per_byte};
}

// The hook's 16-bit all-reduce and conversions from the rows of one
// 16-bit type (bench -d half / -d bfloat16, ordinary buffers).
void calibrate_hook(const std::vector<cli::BenchRow>& rows, const char* hook, Calibration& c) {
  if (rows.empty()) {
    c.notes.push_back(fmt::format("--hook {}: no 16-bit rows (bench -d {}); its all-reduce is taken as the fp32 "
                                  "one's on half the bytes, its conversions as free",
                                  hook, hook == std::string("fp16") ? "half" : "bfloat16"));
    return;
  }
  const Fit fit = fit_allreduce(rows, c.algorithm, c.min_bytes);
  Cluster::Hook16& h = hook == std::string("fp16") ? c.cluster.fp16 : c.cluster.bf16;
  h.calibrated = true;
  h.link = fit.link;
  h.gamma_us_per_byte = fit.gamma_us_per_byte;
  h.narrow_gb_per_s = rows.front().narrow_gb_per_s;
  h.widen_gb_per_s = rows.front().widen_gb_per_s;
  c.notes.push_back(fmt::format("--hook {}: {} rows of {}: alpha {:.2f} us, beta {:.3f} GB/s; mean error {:.1f}%, max "
                                "{:.1f}%; narrowing {:.2f} GB/s, widening {:.2f} GB/s of fp32",
                                hook, fit.rows, rows.front().dtype, fit.link.alpha_us, fit.link.gb_per_s(),
                                100 * fit.mean_error, 100 * fit.max_error, h.narrow_gb_per_s, h.widen_gb_per_s));
  if (rows.front().shared_buffers)
    c.warnings.push_back(fmt::format("warning: the {} rows were measured on shared buffers, but the {} hook reduces "
                                     "a copy in memory of its own: bench -d {} without --shared-buffers",
                                     rows.front().dtype, hook, rows.front().dtype));
  if (h.narrow_gb_per_s <= 0)
    c.warnings.push_back(fmt::format("warning: the {} rows carry no conversion rates (a table, or an older --json): "
                                     "the {} hook's narrowing and widening are taken as free; use bench --json",
                                     rows.front().dtype, hook));
  const std::string poor = poor_fit_warning(fit.mean_error, fmt::format("{} ({} hook)", rows.front().dtype, hook));
  if (!poor.empty()) c.warnings.push_back(poor);
  c.cluster.fit_error = std::max(c.cluster.fit_error, fit.mean_error);
}

}  // namespace

// The rows measured in place (in_place) or out of place (bench --out-of-place).
std::vector<cli::BenchRow> placed(const std::vector<cli::BenchRow>& rows, bool out_of_place) {
  std::vector<cli::BenchRow> out;
  for (const auto& r : rows)
    if (r.out_of_place == out_of_place) out.push_back(r);
  return out;
}

// DDP's default reducer reduces out of place: its own fit where the files
// have such fp32 rows besides in-place ones.
void calibrate_out_of_place(const std::vector<cli::BenchRow>& rows, Calibration& c) {
  if (rows.empty()) {
    c.notes.push_back("out of place: no rows (bench --out-of-place --shared-buffers); DDP's default reducer is taken "
                      "to reduce at the in-place rate of gradient_as_bucket_view");
    return;
  }
  const Fit fit = fit_allreduce(rows, c.algorithm, c.min_bytes);
  c.cluster.out_of_place = noted_fit(fit, "out of place (DDP's default reducer)", "fp32 all-reduce out of place", c);
  c.cluster.fit_error = std::max(c.cluster.fit_error, fit.mean_error);
}

namespace {

// Fully sharded training's all-gather or reduce-scatter from fp32 rows of
// that op, where the files have them.
void calibrate_sharded_collective(const std::vector<cli::BenchRow>& rows, const std::string& op,
                                  Cluster::FittedLink& fitted, Calibration& c) {
  const bool any = std::any_of(rows.begin(), rows.end(), [&](const cli::BenchRow& r) { return r.op == op; });
  if (!any) {
    // The tcp backend's ring all-gather and reduce-scatter are the two
    // halves of its ring all-reduce over the same link, so the all-reduce's
    // alpha and beta carry over; the shm backend reduces shared buffers
    // (DDP's buckets) on a single-copy path these two do not have.
    c.notes.push_back(fmt::format("{}: no rows (bench --op {} --json); fully sharded steps take the all-reduce's link "
                                  "with the {}'s own steps and volume{}",
                                  op, op, op,
                                  c.algorithm == Algorithm::shm ? " (on shm the all-reduce's shared-buffer rate is "
                                                                  "not theirs: measure them)"
                                                                : ""));
    return;
  }
  const Fit fit = fit_collective(rows, op, c.algorithm, c.min_bytes);
  fitted = noted_fit(fit, op + " (fully sharded training)", "fp32 " + op, c);
  c.cluster.fit_error = std::max(c.cluster.fit_error, fit.mean_error);
}

std::vector<cli::BenchRow> rows_of_op(const std::vector<cli::BenchRow>& rows, const std::string& op) {
  std::vector<cli::BenchRow> out;
  for (const auto& r : rows)
    if (r.op == op) out.push_back(r);
  return out;
}

// Rows measured with processes spinning beside the ranks (bench --busy N),
// or on an idle machine.
std::vector<cli::BenchRow> rows_beside_compute(const std::vector<cli::BenchRow>& rows, bool busy) {
  std::vector<cli::BenchRow> out;
  for (const auto& r : rows)
    if ((r.busy > 0) == busy) out.push_back(r);
  return out;
}

// The all-gather, reduce-scatter and all-reduce beside compute, from fp32
// rows of `bench --busy N`: the rates a step's collectives run at where
// they share a core with its compute (beside_compute_applies).
void calibrate_beside_compute(const std::vector<cli::BenchRow>& busy, Cluster& cl, Calibration& c) {
  bool any = false;
  for (auto [op, fitted] : {std::pair{"allgather", &cl.allgather_beside_compute},
                            std::pair{"reduce_scatter", &cl.reduce_scatter_beside_compute}}) {
    const std::vector<cli::BenchRow> rows = rows_of_op(busy, op);
    if (rows.empty()) continue;
    any = true;
    const Fit fit = fit_collective(rows, op, c.algorithm, c.min_bytes);
    *fitted = noted_fit(fit, fmt::format("{} beside compute ({} busy processes)", op, rows.front().busy),
                        fmt::format("fp32 {} beside compute", op), c);
  }
  // DDP's all-reduce: the rows of the buffers the links were fitted to (in
  // place where there are such rows).
  const std::vector<cli::BenchRow> reduce = rows_of_op(busy, "allreduce");
  const std::vector<cli::BenchRow> in_place = placed(reduce, false);
  if (!reduce.empty()) {
    any = true;
    const std::vector<cli::BenchRow>& rows = in_place.empty() ? reduce : in_place;
    const Fit fit = fit_allreduce(rows, c.algorithm, c.min_bytes);
    cl.allreduce_beside_compute =
        noted_fit(fit, fmt::format("allreduce beside compute ({} busy processes)", rows.front().busy),
                  "fp32 all-reduce beside compute", c);
  }
  if (!any)
    c.notes.push_back("beside compute: no rows (bench --op allgather --busy N --json); where a rank has no spare core "
                      "its collectives overlapping compute take the idle rates, and the core they share is charged "
                      "(comm_cpu_share)");
}

}  // namespace

Calibration calibrate_cluster(const std::vector<cli::BenchRow>& rows_given, const std::string& algorithm_name,
                              double min_bytes, int ranks_per_host) {
  Calibration c;
  // Every term but the collectives beside compute is the idle machine's.
  const std::vector<cli::BenchRow> all = rows_beside_compute(rows_given, false);
  const std::vector<cli::BenchRow> fp32 = rows_of_op(rows_of(all, "float"), "allreduce");
  // The links are fitted to the in-place rows (gradient_as_bucket_view,
  // and the hooks' own all-reduces); out-of-place rows alone serve too.
  const std::vector<cli::BenchRow> in_place = placed(fp32, false);
  const std::vector<cli::BenchRow> rows = in_place.empty() ? fp32 : in_place;
  if (rows.empty())
    throw InvalidArgument("calibrate: no fp32 (float) all-reduce rows measured without --busy; the links are "
                          "fitted to DDP's plain all-reduce: lockstep bench -np 2 -b 256K -e 64M -f 2 "
                          "--shared-buffers --json FILE");
  const std::string backend = rows.front().backend;
  c.algorithm = algorithm_name.empty() ? backend_algorithm(backend) : parse_algorithm(algorithm_name);
  // DDP buckets are large: by default fit the large-message algorithm only.
  c.min_bytes = min_bytes >= 0 ? min_bytes
                : c.algorithm == Algorithm::tcp ? 64 * 1024 + 1
                : c.algorithm == Algorithm::shm ? 256 * 1024 + 1
                                                : 0;
  c.fit = fit_allreduce(rows, c.algorithm, c.min_bytes);
  int ranks = 1;
  for (const auto& r : rows) ranks = std::max(ranks, r.ranks);
  Cluster& cl = c.cluster;
  cl.name = fmt::format("calibrated ({} {}, {} ranks)", backend.empty() ? "?" : backend, to_string(c.algorithm), ranks);
  if (ranks_per_host > 0) {
    cl.ranks_per_host = ranks_per_host;
  } else if (rows.front().ranks_per_host > 0) {
    cl.ranks_per_host = rows.front().ranks_per_host;
  } else {
    cl.ranks_per_host = ranks;
    c.notes.push_back(fmt::format("ranks per host: the bench table does not say; taking its {} ranks as one host's "
                                  "(give --ranks-per-host, or calibrate from bench --json, which records it)",
                                  ranks));
  }
  cl.intra = cl.inter = c.fit.link;
  cl.gamma_us_per_byte = c.fit.gamma_us_per_byte;
  cl.algorithm = c.algorithm;
  cl.copy_gb_per_s = rows.front().memcpy_gb_per_s;
  cl.cores_per_rank = rows.front().cores_per_rank;
  // The bench's own ranks on its host, whatever --ranks-per-host says of
  // the cluster's.
  cl.cores_per_host = cl.cores_per_rank * (rows.front().ranks_per_host > 0 ? rows.front().ranks_per_host : ranks);
  cl.comm_cpu_share = comm_cpu_share(rows, c.min_bytes);
  cl.fit_error = c.fit.mean_error;
  if (backend == "shm" && !rows.front().shared_buffers)
    c.warnings.push_back("warning: the fp32 rows were measured on ordinary buffers, which the shm backend copies in "
                         "and out; DDP's buckets are shared buffers: bench with --shared-buffers");
  const std::string poor = poor_fit_warning(c.fit.mean_error, "fp32 all-reduce");
  if (!poor.empty()) c.warnings.push_back(poor);
  if (!in_place.empty())
    calibrate_out_of_place(placed(fp32, true), c);
  else
    c.notes.push_back("in place: no rows (bench --shared-buffers without --out-of-place); gradient_as_bucket_view "
                      "is taken to reduce at the out-of-place rate of DDP's default reducer");
  calibrate_hook(rows_of_op(rows_of(all, "half"), "allreduce"), "fp16", c);
  calibrate_hook(rows_of_op(rows_of(all, "bfloat16"), "allreduce"), "bf16", c);
  calibrate_sharded_collective(rows_of(all, "float"), "allgather", cl.allgather, c);
  calibrate_sharded_collective(rows_of(all, "float"), "reduce_scatter", cl.reduce_scatter, c);
  calibrate_beside_compute(rows_of(rows_beside_compute(rows_given, true), "float"), cl, c);
  return c;
}

std::string cluster_json(const Cluster& c) {
  const auto link = [](const Link& l) { return nlohmann::json{{"alpha_us", l.alpha_us}, {"gb_per_s", l.gb_per_s()}}; };
  const auto hook = [&](const Cluster::Hook16& h) {
    nlohmann::json j = link(h.link);
    j["gamma_gb_per_s"] = h.gamma_us_per_byte > 0 ? 1e-3 / h.gamma_us_per_byte : 0;
    j["narrow_gb_per_s"] = h.narrow_gb_per_s;
    j["widen_gb_per_s"] = h.widen_gb_per_s;
    return j;
  };
  nlohmann::json j = {{"name", c.name},
                      {"ranks_per_host", c.ranks_per_host},
                      {"algorithm", to_string(c.algorithm)},
                      {"intra", link(c.intra)},
                      {"inter", link(c.inter)},
                      {"gamma_gb_per_s", c.gamma_us_per_byte > 0 ? 1e-3 / c.gamma_us_per_byte : 0},
                      {"copy_gb_per_s", c.copy_gb_per_s},
                      {"comm_cpu_share", c.comm_cpu_share},
                      {"cores_per_rank", c.cores_per_rank},
                      {"cores_per_host", c.cores_per_host},
                      {"fit_error", c.fit_error}};
  if (c.fp16.calibrated) j["fp16"] = hook(c.fp16);
  if (c.bf16.calibrated) j["bf16"] = hook(c.bf16);
  for (auto [key, fitted] : {std::pair{"out_of_place", &c.out_of_place}, std::pair{"allgather", &c.allgather},
                             std::pair{"reduce_scatter", &c.reduce_scatter},
                             std::pair{"allgather_beside_compute", &c.allgather_beside_compute},
                             std::pair{"reduce_scatter_beside_compute", &c.reduce_scatter_beside_compute},
                             std::pair{"allreduce_beside_compute", &c.allreduce_beside_compute}}) {
    if (!fitted->calibrated) continue;
    j[key] = link(fitted->link);
    j[key]["gamma_gb_per_s"] = fitted->gamma_us_per_byte > 0 ? 1e-3 / fitted->gamma_us_per_byte : 0;
  }
  return j.dump(1) + "\n";
}

Cluster parse_cluster_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("cluster file: not valid JSON ({})", e.what()));
  }
  const auto link = [&](const char* key) {
    if (!j.contains(key)) throw ConfigError(fmt::format("cluster file: no \"{}\" link (alpha_us, gb_per_s)", key));
    return Link::from_bandwidth(j[key].value("alpha_us", 0.0), j[key].value("gb_per_s", 0.0));
  };
  Cluster c;
  c.name = j.value("name", "custom");
  c.ranks_per_host = j.value("ranks_per_host", 1);
  c.algorithm = parse_algorithm(j.value("algorithm", "ring"));
  c.intra = link("intra");
  c.inter = j.contains("inter") ? link("inter") : c.intra;
  const double gamma_gbps = j.value("gamma_gb_per_s", 0.0);
  c.gamma_us_per_byte = gamma_gbps > 0 ? 1e-3 / gamma_gbps : 0;
  c.copy_gb_per_s = j.value("copy_gb_per_s", 0.0);
  c.comm_cpu_share = j.value("comm_cpu_share", 0.0);
  c.cores_per_rank = j.value("cores_per_rank", 0.0);
  c.cores_per_host = j.value("cores_per_host", 0.0);
  c.fit_error = j.value("fit_error", 0.0);
  for (auto [key, h] : {std::pair{"fp16", &c.fp16}, std::pair{"bf16", &c.bf16}}) {
    if (!j.contains(key)) continue;
    h->calibrated = true;
    h->link = link(key);
    const double g = j[key].value("gamma_gb_per_s", 0.0);
    h->gamma_us_per_byte = g > 0 ? 1e-3 / g : 0;
    h->narrow_gb_per_s = j[key].value("narrow_gb_per_s", 0.0);
    h->widen_gb_per_s = j[key].value("widen_gb_per_s", 0.0);
  }
  for (auto [key, fitted] : {std::pair{"out_of_place", &c.out_of_place}, std::pair{"allgather", &c.allgather},
                             std::pair{"reduce_scatter", &c.reduce_scatter},
                             std::pair{"allgather_beside_compute", &c.allgather_beside_compute},
                             std::pair{"reduce_scatter_beside_compute", &c.reduce_scatter_beside_compute},
                             std::pair{"allreduce_beside_compute", &c.allreduce_beside_compute}}) {
    if (!j.contains(key)) continue;
    fitted->calibrated = true;
    fitted->link = link(key);
    const double g = j[key].value("gamma_gb_per_s", 0.0);
    fitted->gamma_us_per_byte = g > 0 ? 1e-3 / g : 0;
  }
  if (c.copy_gb_per_s < 0 || c.comm_cpu_share < 0 || c.comm_cpu_share > 1 || c.cores_per_rank < 0 ||
      c.cores_per_host < 0)
    throw ConfigError(fmt::format("cluster file: copy_gb_per_s {}, comm_cpu_share {}, cores_per_rank {}, "
                                  "cores_per_host {}: the rate and the cores must not be negative and the share must "
                                  "lie in [0, 1] (0 for unknown)",
                                  c.copy_gb_per_s, c.comm_cpu_share, c.cores_per_rank, c.cores_per_host));
  return c;
}

double comm_cpu_share(const std::vector<cli::BenchRow>& rows, double min_bytes) {
  std::vector<double> shares;
  for (const auto& r : rows)
    if (r.op == "allreduce" && r.ranks >= 2 && r.bytes >= min_bytes && r.time_us > 0 && r.cpu_us > 0)
      shares.push_back(std::min(1.0, r.cpu_us / r.time_us));
  return shares.empty() ? 0 : middle_value(std::move(shares));
}

}  // namespace lockstep::sim
