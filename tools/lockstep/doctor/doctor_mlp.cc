// The workload `lockstep doctor` measures when given no program: an MLP
// trained with DistributedDataParallel on random data. --batch is per rank
// (weak scaling); --global-batch splits a fixed batch across the ranks
// (strong scaling). Statistics go where LOCKSTEP_STATS says (set by the
// doctor). Started by the doctor through `lockstep run`.
#include <lockstep/process_group.h>
#include <lockstep/torch/ddp.h>
#include <torch/torch.h>

#include <chrono>

#include <CLI/CLI.hpp>

#include <lockstep_models/models.h>
#include <lockstep_option_checks/option_checks.h>

int main(int argc, char** argv) {
  CLI::App app{"lockstep doctor's built-in workload: an MLP trained with DDP"};
  int layers = 6, width = 2048, batch = 64, global_batch = 0, steps = 20;
  double bucket_cap_mb = 25;
  std::string hook = "none";
  int slow_rank = -1, slow_ms = 0;
  namespace checks = lockstep::option_checks;
  app.add_option("--layers", layers)->check(checks::positive_count());
  app.add_option("--width", width)->check(checks::positive_count());
  app.add_option("--batch", batch, "Samples per rank (weak scaling)")->check(checks::positive_count());
  app.add_option("--global-batch", global_batch, "Samples per step over all ranks (strong scaling)")
      ->check(checks::positive_count());
  app.add_option("--steps", steps)->check(checks::positive_count());
  app.add_option("--bucket-cap-mb", bucket_cap_mb)->check(checks::positive_number(1 << 20));
  app.add_option("--hook", hook)->check(CLI::IsMember({"none", "fp16", "bf16"}));
  app.add_option("--slow-rank", slow_rank, "Make this rank a straggler (with --slow-ms)")
      ->check(checks::non_negative_count());
  app.add_option("--slow-ms", slow_ms, "Extra milliseconds of work per step on --slow-rank")
      ->check(checks::non_negative_count());
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);
  auto pg = lockstep::init_process_group();
  const int per_rank = global_batch > 0 ? std::max(1, global_batch / pg->size()) : batch;
  torch::manual_seed(1);
  auto model = std::make_shared<examples::MlpImpl>(layers, width);
  lockstep::torch::DDPOptions options;
  options.bucket_cap_mb = bucket_cap_mb;
  options.stats_window = 5;
  if (hook == "fp16") options.comm_hook = lockstep::fp16_compress_hook();
  if (hook == "bf16") options.comm_hook = lockstep::bf16_compress_hook();
  lockstep::torch::DistributedDataParallel<examples::MlpImpl> ddp(model, pg, options);
  torch::optim::SGD opt(model->parameters(), 0.001);
  torch::manual_seed(100 + pg->rank());
  auto x = torch::randn({per_rank, width}), y = torch::randn({per_rank, width});
  const bool slow = pg->rank() == slow_rank && slow_ms > 0;
  for (int s = 0; s < steps; ++s) {
    // A busy-wait rather than a sleep: a straggler's extra time is work.
    if (slow)
      for (const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(slow_ms);
           std::chrono::steady_clock::now() < until;) {
      }
    opt.zero_grad();
    torch::mse_loss(ddp.forward(x), y).backward();
    opt.step();
  }
  const auto summary = ddp.summary();
  if (pg->rank() == 0)
    std::printf("%d rank(s): %.1f ms per step (compute %.1f, exposed communication %.1f)\n", pg->size(),
                summary.step_ms, summary.compute_ms, summary.exposed_ms);
  return 0;
}
