// See companions_cases.h.
#include "torch/companions_cases.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "ddp/low_rank.h"
#include "lockstep/powersgd.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/sync_batchnorm.h"
#include "lockstep/torch/zero.h"
#include "torch/libtorch_version.h"

namespace lockstep::testing::companions {
namespace {

namespace nn = ::torch::nn;
using torch::DistributedDataParallel;

constexpr double kRtol = 1e-4;

std::shared_ptr<ProcessGroup> borrow(ProcessGroup& pg) { return {&pg, [](ProcessGroup*) {}}; }

Tensor draw(at::Generator& gen, std::vector<std::int64_t> shape) { return ::torch::randn(shape, gen); }

Batches draw_batches(int steps, std::uint64_t seed, std::vector<std::int64_t> input_shape, std::int64_t outputs) {
  Batches out;
  input_shape.insert(input_shape.begin(), kGlobalBatch);
  for (int step = 0; step < steps; ++step) {
    auto gen = at::detail::createCPUGenerator(seed + static_cast<std::uint64_t>(step));
    auto x = draw(gen, input_shape);
    out.emplace_back(x, draw(gen, {kGlobalBatch, outputs}));
  }
  return out;
}

std::vector<Tensor> to_cpu(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  for (const auto& t : tensors) out.push_back(t.detach().to(::torch::kCPU).clone());
  return out;
}

// Weights from a generator of the model's own, so that making one needs
// no process-wide state: the same numbers on any thread, in any order.
void init_from(nn::Module& net, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  ::torch::NoGradGuard no_grad;
  for (auto& p : net.parameters()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(p.dim() >= 2 ? p.numel() / p.size(0) : p.numel()));
    p.copy_(::torch::rand(p.sizes(), gen) * (2 * bound) - bound);
  }
}

}  // namespace

Batches make_batches(std::vector<std::int64_t> input_shape, std::int64_t outputs) {
  return draw_batches(kSteps, 1000, std::move(input_shape), outputs);
}

Batches powersgd_batches() { return draw_batches(kPowerSgdSteps, 2000, {6}, 3); }

nn::Sequential make_convnet() {
  nn::Sequential net(nn::Conv2d(nn::Conv2dOptions(2, 4, 3)), nn::BatchNorm2d(4), nn::ReLU(), nn::Flatten(),
                     nn::Linear(4 * 4 * 4, 3));
  init_from(*net, 7);
  return net;
}

nn::Sequential make_mlp() {
  nn::Sequential net(nn::Linear(6, 24), nn::Tanh(), nn::Linear(24, 12), nn::Tanh(), nn::Linear(12, 3));
  init_from(*net, 11);
  return net;
}

void expect_close(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto g = got[i].to(::torch::kDouble), w = want[i].to(::torch::kDouble);
    EXPECT_TRUE(::torch::allclose(g, w, kRtol, kRtol * 0.1))
        << what << ": tensor " << i << " differs by " << (g - w).abs().max().item<double>() << " (scale "
        << w.abs().max().item<double>() << ")";
  }
}

// ---- SyncBatchNorm ----------------------------------------------------------

namespace {

std::vector<Tensor> sync_batchnorm_result(nn::Sequential& net, const Tensor& first_input_grad) {
  std::vector<Tensor> out = to_cpu(net->parameters());
  for (const auto& b : to_cpu(net->buffers())) out.push_back(b);
  out.push_back(first_input_grad.to(::torch::kCPU));
  return out;
}

}  // namespace

std::vector<Tensor> train_sync_batchnorm(int rank, ProcessGroup& pg, ::torch::Device device, const Batches& batches,
                                         nn::Sequential net) {
  const int n = pg.size();
  net = torch::convert_sync_batchnorm(net, borrow(pg));
  net->to(device);
  DistributedDataParallel ddp(net, borrow(pg));
  ::torch::optim::SGD opt(net->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
  Tensor first_input_grad;
  for (int step = 0; step < kSteps; ++step) {
    const auto& [x, y] = batches[static_cast<std::size_t>(step)];
    auto xs = x.chunk(n)[rank].to(device).clone().requires_grad_(true);
    opt.zero_grad();
    ::torch::mse_loss(ddp.forward(xs), y.chunk(n)[rank].to(device)).backward();
    if (step == 0) first_input_grad = xs.grad().detach().clone();
    opt.step();
  }
  return sync_batchnorm_result(net, first_input_grad);
}

std::vector<Tensor> sync_batchnorm_reference(int ranks, const Batches& batches) {
  auto net = make_convnet();
  ::torch::optim::SGD opt(net->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
  Tensor first_input_grad;
  for (int step = 0; step < kSteps; ++step) {
    const auto& [x, y] = batches[static_cast<std::size_t>(step)];
    auto xg = x.clone().requires_grad_(true);
    opt.zero_grad();
    ::torch::mse_loss(net->forward(xg), y).backward();
    if (step == 0) first_input_grad = xg.grad().chunk(ranks)[0] * ranks;
    opt.step();
  }
  return sync_batchnorm_result(net, first_input_grad);
}

// ---- ZeroRedundancyOptimizer ------------------------------------------------

namespace {

::torch::optim::AdamOptions adam() { return ::torch::optim::AdamOptions(1e-2); }

std::vector<Tensor> zero_result(const std::vector<Tensor>& params, ::torch::optim::Optimizer& optimizer) {
  std::vector<Tensor> out = to_cpu(params);
  for (const auto& p : params) {
    auto& state = static_cast<::torch::optim::AdamParamState&>(
        *optimizer.state().at(torch::libtorch::optimizer_state_key(p)));
    out.push_back(state.exp_avg().to(::torch::kCPU));
    out.push_back(state.exp_avg_sq().to(::torch::kCPU));
  }
  return out;
}

}  // namespace

std::vector<Tensor> train_zero(int rank, ProcessGroup& pg, ::torch::Device device, const Batches& batches,
                               nn::Sequential net) {
  const int n = pg.size();
  net->to(device);
  DistributedDataParallel ddp(net, borrow(pg));
  torch::ZeroRedundancyOptimizer opt(net->parameters(), borrow(pg), adam());
  for (int step = 0; step < kSteps; ++step) {
    const auto& [x, y] = batches[static_cast<std::size_t>(step)];
    opt.zero_grad();
    ::torch::mse_loss(ddp.forward(x.chunk(n)[rank].to(device)), y.chunk(n)[rank].to(device)).backward();
    opt.step();
  }
  opt.consolidate_state_dict(0);
  if (rank != 0) return {};
  return zero_result(net->parameters(), opt.consolidated());
}

std::vector<Tensor> zero_reference(const Batches& batches) {
  auto net = make_mlp();
  ::torch::optim::Adam opt(net->parameters(), adam());
  for (int step = 0; step < kSteps; ++step) {
    const auto& [x, y] = batches[static_cast<std::size_t>(step)];
    opt.zero_grad();
    ::torch::mse_loss(net->forward(x), y).backward();
    opt.step();
  }
  return zero_result(net->parameters(), opt);
}

// ---- PowerSGD -----------------------------------------------------------------

namespace {

PowerSGDOptions powersgd_options() {
  PowerSGDOptions o;
  o.matrix_approximation_rank = 2;
  o.start_powersgd_iter = 1;
  o.min_compression_rate = 0;
  return o;
}

constexpr double kLearningRate = 0.1;
constexpr double kMomentum = 0.9;

// Makes p's columns orthonormal in order (modified Gram-Schmidt, in
// double); a column left with nothing of its own (it lay in the span of the
// earlier ones) becomes zero, as PowerSGD's orthogonalisation does.
Tensor orthonormal_columns(Tensor p) {
  p = p.to(::torch::kDouble).clone();
  for (std::int64_t c = 0; c < p.size(1); ++c) {
    auto col = p.select(1, c);
    const double before = col.norm().item<double>();
    for (int pass = 0; pass < 2; ++pass)
      for (std::int64_t k = 0; k < c; ++k) col -= (col * p.select(1, k)).sum() * p.select(1, k);
    const double norm = col.norm().item<double>();
    if (norm <= before * 1e-12 || norm == 0)
      col.zero_();
    else
      col /= norm;
  }
  return p;
}

// The hook's first Q for a matrix of `cols` columns at rank r: Gaussian
// numbers from the seed the hook derives from the bucket's index and how
// many Qs that bucket drew before (random_seed 0), made orthonormal.
Tensor first_q(std::size_t bucket, std::uint64_t draw, std::int64_t cols, std::int64_t r) {
  std::vector<float> drawn(static_cast<std::size_t>(cols * r));
  low_rank::fill_gaussian(drawn.data(), drawn.size(), bucket * 1000003ull + draw);
  return orthonormal_columns(::torch::from_blob(drawn.data(), {cols, r}, ::torch::kFloat).clone());
}

// One matrix (or padded bucket) across the ranks: each rank's M (n x m,
// double), its error from the last step and the warm-started Q; returns the
// approximation every rank ends with, updating errors and Q.
Tensor compress(const std::vector<Tensor>& m, std::vector<Tensor>& error, Tensor& q) {
  std::vector<Tensor> with_error;
  for (std::size_t r = 0; r < m.size(); ++r) {
    if (!error[r].defined()) error[r] = ::torch::zeros_like(m[r]);
    with_error.push_back(m[r] + error[r]);
  }
  Tensor p = ::torch::zeros({m[0].size(0), q.size(1)}, ::torch::kDouble);
  for (const auto& mr : with_error) p += mr.matmul(q);
  p = orthonormal_columns(p);
  Tensor q_new = ::torch::zeros_like(q);
  for (const auto& mr : with_error) q_new += mr.t().matmul(p);
  q = q_new / static_cast<double>(m.size());
  const Tensor approx = p.matmul(q.t());
  for (std::size_t r = 0; r < m.size(); ++r) error[r] = with_error[r] - approx;
  return approx;
}

// What PowerSGD's state holds across steps in the reference.
struct ReferenceState {
  std::map<std::string, Tensor> q;                   // per matrix (per tensor) or "bucket N" (batched)
  std::map<std::string, std::vector<Tensor>> error;  // the same keys, one per rank
  std::map<std::size_t, std::uint64_t> draws;        // per bucket
};

// Per tensor: each gradient of two or more dimensions as an n x m matrix at
// rank min(n, m, 2); vectors averaged.
void combine_per_tensor(const BucketLayout& layout, const std::map<std::string, std::vector<Tensor>>& grads,
                        const std::map<std::string, Tensor>& params, ReferenceState& s,
                        std::map<std::string, Tensor>& out) {
  for (std::size_t b = 0; b < layout.size(); ++b) {
    for (const auto& name : layout[b]) {
      const auto& per_rank = grads.at(name);
      const Tensor& param = params.at(name);
      if (param.dim() < 2) {
        out[name] = ::torch::stack(per_rank).mean(0);
        continue;
      }
      const std::int64_t n = param.size(0), m = param.numel() / n, r = std::min<std::int64_t>({n, m, 2});
      if (!s.q[name].defined()) s.q[name] = first_q(b, s.draws[b]++, m, r);
      std::vector<Tensor> matrices;
      for (const auto& g : per_rank) matrices.push_back(g.reshape({n, m}));
      s.error[name].resize(per_rank.size());
      out[name] = compress(matrices, s.error[name], s.q[name]).reshape(param.sizes());
    }
  }
}

// Batched: each bucket's gradients, in bucket order, as one zero-padded
// square matrix at rank min(side, 2).
void combine_batched(const BucketLayout& layout, const std::map<std::string, std::vector<Tensor>>& grads,
                     const std::map<std::string, Tensor>& params, ReferenceState& s,
                     std::map<std::string, Tensor>& out) {
  const std::size_t ranks = grads.begin()->second.size();
  for (std::size_t b = 0; b < layout.size(); ++b) {
    std::int64_t count = 0;
    for (const auto& name : layout[b]) count += params.at(name).numel();
    const auto side = static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(count))));
    std::vector<Tensor> matrices;
    for (std::size_t r = 0; r < ranks; ++r) {
      std::vector<Tensor> flat;
      for (const auto& name : layout[b]) flat.push_back(grads.at(name)[r].reshape(-1));
      flat.push_back(::torch::zeros({side * side - count}, ::torch::kDouble));
      matrices.push_back(::torch::cat(flat).reshape({side, side}));
    }
    const std::string key = "bucket " + std::to_string(b);
    if (!s.q[key].defined()) s.q[key] = first_q(b, s.draws[b]++, side, std::min<std::int64_t>(side, 2));
    s.error[key].resize(ranks);
    const Tensor approx = compress(matrices, s.error[key], s.q[key]).reshape(-1);
    std::int64_t at = 0;
    for (const auto& name : layout[b]) {
      const Tensor& param = params.at(name);
      out[name] = approx.slice(0, at, at + param.numel()).reshape(param.sizes());
      at += param.numel();
    }
  }
}

}  // namespace

PowerSgdRun train_powersgd(int rank, ProcessGroup& pg, ::torch::Device device, const Batches& batches, bool batched,
                           nn::Sequential net) {
  const int n = pg.size();
  net->to(device);
  torch::DDPOptions options;
  auto hook = batched ? batched_powersgd_hook(powersgd_options()) : powersgd_hook(powersgd_options());
  options.comm_hook = hook;
  DistributedDataParallel ddp(net, borrow(pg), options);
  ::torch::optim::SGD opt(net->parameters(), ::torch::optim::SGDOptions(kLearningRate).momentum(kMomentum));
  for (int step = 0; step < kPowerSgdSteps; ++step) {
    const auto& [x, y] = batches[static_cast<std::size_t>(step)];
    opt.zero_grad();
    ::torch::mse_loss(ddp.forward(x.chunk(n)[rank].to(device)), y.chunk(n)[rank].to(device)).backward();
    opt.step();
  }
  return {to_cpu(net->parameters()), static_cast<double>(hook->compression_stats().elements_sent),
          ddp.bucket_layout()};
}

PowerSgdRun powersgd_reference(int ranks, const Batches& batches, bool batched, const BucketLayout& layout,
                               int first_compressed_step) {
  auto net = make_mlp();
  std::map<std::string, Tensor> params;
  for (const auto& item : net->named_parameters()) params[item.key()] = item.value();
  ::torch::optim::SGD opt(net->parameters(), ::torch::optim::SGDOptions(kLearningRate).momentum(kMomentum));
  ReferenceState state;
  for (int step = 0; step < kPowerSgdSteps; ++step) {
    const auto& [x, y] = batches[static_cast<std::size_t>(step)];
    // Every rank's gradient on its shard (the replicas are equal).
    std::map<std::string, std::vector<Tensor>> grads;
    for (int r = 0; r < ranks; ++r) {
      net->zero_grad();
      ::torch::mse_loss(net->forward(x.chunk(ranks)[r]), y.chunk(ranks)[r]).backward();
      for (const auto& [name, p] : params) grads[name].push_back(p.grad().to(::torch::kDouble).clone());
    }
    std::map<std::string, Tensor> combined;
    if (step < first_compressed_step) {
      for (const auto& [name, per_rank] : grads) combined[name] = ::torch::stack(per_rank).mean(0);
    } else if (batched) {
      combine_batched(layout, grads, params, state, combined);
    } else {
      combine_per_tensor(layout, grads, params, state, combined);
    }
    for (auto& [name, p] : params) p.mutable_grad() = combined.at(name).to(::torch::kFloat);
    opt.step();
  }
  return {to_cpu(net->parameters()), 0, layout};
}

void save(const PowerSgdRun& run, const std::string& path) {
  ::torch::save(run.params, path + ".pt");
  std::ofstream out(path + ".txt");
  out << run.elements_sent << "\n";
  for (const auto& bucket : run.layout) {
    for (const auto& name : bucket) out << name << " ";
    out << "\n";
  }
}

PowerSgdRun load_powersgd_run(const std::string& path) {
  PowerSgdRun run;
  ::torch::load(run.params, path + ".pt");
  std::ifstream in(path + ".txt");
  in >> run.elements_sent;
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream names(line);
    run.layout.emplace_back();
    for (std::string name; names >> name;) run.layout.back().push_back(name);
  }
  return run;
}

}  // namespace lockstep::testing::companions
