// ShardBackup: every rank's copy of its ring predecessor's shards holds,
// after every step, exactly the bytes its predecessor holds (parameters and
// optimizer state), for 2, 3 and 4 thread ranks, SGD with momentum, Adam
// and AdamW with a learning rate changed halfway; training is unchanged by
// it; a backup made after a resume from a checkpoint takes the loaded
// optimizer state along; a copy that drifts is named; what cannot be
// copied is refused. And the step that will use the copy: a group that lost
// a rank, its shard held by the next, computes over logical shards the
// reduced gradients of every shard bit for bit as the full group's fully
// sharded step does, by hand and through the units' held step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "comm/shard_map.h"
#include "lockstep/error.h"
#include "lockstep/torch/fully_shard.h"
#include "lockstep/torch/shard_backup.h"
#include "torch/fsdp_fixtures.h"
#include "torch/fsdp_unit.h"
#include "torch/optimizer_state.h"
#include "torch/thread_ranks.h"

namespace lockstep::torch {
namespace {

using testing::per_rank;
using testing::TorchThreadWorld;

using namespace fsdp_fixtures;

// A rank's parameter pieces with elements, then their optimizer state
// tensors, all cloned: what its successor's copy must hold.
struct Held {
  std::vector<Tensor> params;
  std::vector<Tensor> state;
  std::vector<std::int64_t> steps;
};

void add_state(Held& held, ::torch::optim::Optimizer& optimizer, const Tensor& p) {
  const auto* state = state_of(optimizer, p);
  ASSERT_NE(state, nullptr) << "a piece with elements was never stepped";
  const auto tensors = state_tensors(*state);
  ASSERT_TRUE(tensors.has_value());
  for (const auto& t : tensors->first)
    if (t.defined()) held.state.push_back(t.clone());
  held.steps.push_back(tensors->second);
}

Held own_of(::torch::optim::Optimizer& optimizer) {
  Held held;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params())
      if (p.numel() > 0) {
        held.params.push_back(p.detach().clone());
        add_state(held, optimizer, p);
      }
  return held;
}

Held copy_of(ShardBackup& backup) {
  Held held;
  for (const auto& group : backup.optimizer().param_groups())
    for (const auto& p : group.params()) {
      held.params.push_back(p.detach().clone());
      add_state(held, backup.optimizer(), p);
    }
  return held;
}

void expect_same_bits(const Held& got, const Held& want, const std::string& what) {
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  ASSERT_EQ(got.state.size(), want.state.size()) << what;
  EXPECT_EQ(got.steps, want.steps) << what;
  for (std::size_t i = 0; i < want.params.size(); ++i)
    EXPECT_TRUE(::torch::equal(got.params[i], want.params[i])) << what << ": parameter piece " << i;
  for (std::size_t i = 0; i < want.state.size(); ++i)
    EXPECT_TRUE(::torch::equal(got.state[i], want.state[i])) << what << ": state tensor " << i;
}

std::unique_ptr<::torch::optim::Optimizer> optimizer_for(const std::string& kind, std::vector<Tensor> params) {
  if (kind == "adamw")
    return std::make_unique<::torch::optim::AdamW>(params, ::torch::optim::AdamWOptions(0.02).weight_decay(0.1));
  return make_optimizer(kind, std::move(params));
}

void set_learning_rate(::torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    auto& options = group.options();
    if (auto* sgd = dynamic_cast<::torch::optim::SGDOptions*>(&options)) sgd->lr(lr);
    if (auto* adam = dynamic_cast<::torch::optim::AdamOptions*>(&options)) adam->lr(lr);
    if (auto* adamw = dynamic_cast<::torch::optim::AdamWOptions*>(&options)) adamw->lr(lr);
  }
}

using Case = std::tuple<int, std::string>;  // ranks, optimizer

class EveryCopy : public ::testing::TestWithParam<Case> {};

TEST_P(EveryCopy, HoldsItsPredecessorsPiecesAndStateBitForBitAfterEveryStep) {
  const int ranks = std::get<0>(GetParam());
  const std::string optimizer = std::get<1>(GetParam());
  const auto data = batches(kWidths.front(), 21);
  auto plains = per_rank(ranks, [](int) { return plain_mlp(); });
  std::vector<Held> own(static_cast<std::size_t>(ranks)), copies(static_cast<std::size_t>(ranks));
  std::vector<int> kept(static_cast<std::size_t>(ranks));
  TorchThreadWorld world(ranks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    auto opt = optimizer_for(optimizer, model->parameters());
    ShardBackup backup(*model, *opt);
    backup.verify();  // the parameters as sharded, before any step
    for (std::size_t s = 0; s < data.size(); ++s) {
      if (s == data.size() / 2) set_learning_rate(*opt, 0.005);  // a scheduler's change
      opt->zero_grad();
      ::torch::mse_loss(model->forward(shard_of(data[s].x, rank, ranks)), shard_of(data[s].y, rank, ranks))
          .backward();
      if (s % 2 == 1) backup.send_gradients();  // the transfer overlapping the optimizer's step
      opt->step();
      backup.step();
      backup.verify();
    }
    own[static_cast<std::size_t>(rank)] = own_of(*opt);
    copies[static_cast<std::size_t>(rank)] = copy_of(backup);
    kept[static_cast<std::size_t>(rank)] = backup.kept_rank();
  });
  for (int r = 0; r < ranks; ++r) {
    const int predecessor = (r + ranks - 1) % ranks;
    EXPECT_EQ(kept[static_cast<std::size_t>(r)], predecessor);
    expect_same_bits(copies[static_cast<std::size_t>(r)], own[static_cast<std::size_t>(predecessor)],
                     "rank " + std::to_string(r) + "'s copy of rank " + std::to_string(predecessor));
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndOptimizers, EveryCopy,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values("sgd", "adam", "adamw")),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param);
                         });

// Shards of megabytes: sends that wait for their receivers, around rings
// of even and odd size (every rank sending first would wait forever).
constexpr std::int64_t kWide = 1024;  // a block's weight: 4 MiB

TEST(ShardBackup, MegabyteShardsGoAroundRingsOfEvenAndOddSize) {
  for (const auto& backend : {"shm", "tcp"})
    for (const int ranks : {2, 3}) {
      SCOPED_TRACE(std::string(backend) + ", " + std::to_string(ranks) + " ranks");
      const auto data = batches(kWide, 26);
      auto plains = per_rank(ranks, [](int) {
        nn::Sequential net(Block(kWide, kWide), Block(kWide, kWide), nn::Linear(kWide, kOutputs));
        init_from(*net, 6);
        return net;
      });
      TorchThreadWorld world(ranks, backend);
      world.run([&](int rank, ProcessGroup& pg) {
        auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
        auto opt = optimizer_for("adam", model->parameters());
        ShardBackup backup(*model, *opt);
        for (int s = 0; s < 2; ++s) {
          opt->zero_grad();
          ::torch::mse_loss(model->forward(shard_of(data[s].x, rank, ranks)), shard_of(data[s].y, rank, ranks))
              .backward();
          opt->step();
          backup.step();
        }
        backup.verify();
      });
    }
}

// Gradients the user replaced after backward (new tensors, not views of
// the reduced shard; one left without) go through a buffer, and the copy
// still steps as its owner did.
TEST(ShardBackup, GradientsTheUserReplacedAreSentToo) {
  const auto data = batches(kWidths.front(), 27);
  auto plains = per_rank(3, [](int) { return plain_mlp(); });
  TorchThreadWorld world(3, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    auto opt = optimizer_for("adam", model->parameters());
    ShardBackup backup(*model, *opt);
    for (const auto& [x, y] : data) {
      opt->zero_grad();
      ::torch::mse_loss(model->forward(shard_of(x, rank, 3)), shard_of(y, rank, 3)).backward();
      auto params = model->parameters();
      for (auto& p : params)
        if (p.grad().defined()) p.mutable_grad() = p.grad().clone() * 0.5;
      params.front().mutable_grad() = Tensor();  // not stepped this time
      opt->step();
      backup.step();
      backup.verify();
    }
  });
}

// The copy only reads what the model and optimizer hold: training with it
// gives the same bits as training without (on shm, whose reduce-scatter
// folds in shard order anyway; on tcp and hier a backup's model reduces in
// shard order, reduce_in_shard_order, another fold than their own).
TEST(ShardBackup, TrainingWithItEqualsTrainingWithout) {
  const auto data = batches(kWidths.front(), 22);
  std::vector<std::vector<State>> got(2, std::vector<State>(3));
  for (const bool with_backup : {false, true}) {
    auto plains = per_rank(3, [](int) { return plain_mlp(); });
    TorchThreadWorld world(3, "shm");
    world.run([&](int rank, ProcessGroup& pg) {
      auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
      auto opt = optimizer_for("adam", model->parameters());
      std::unique_ptr<ShardBackup> backup;
      if (with_backup) backup = std::make_unique<ShardBackup>(*model, *opt);
      for (const auto& [x, y] : data) {
        opt->zero_grad();
        ::torch::mse_loss(model->forward(shard_of(x, rank, 3)), shard_of(y, rank, 3)).backward();
        opt->step();
        if (backup) backup->step();
      }
      got[with_backup ? 1 : 0][static_cast<std::size_t>(rank)] = model->full_state_dict(rank);
    });
  }
  for (const auto& [name, want] : got[0][0]) EXPECT_TRUE(::torch::equal(got[1][0].at(name), want)) << name;
}

// A copy changed by one bit is found and its holder named, on every rank.
TEST(ShardBackup, VerifyNamesTheRankWhoseCopyDiffers) {
  const auto data = batches(kWidths.front(), 23);
  auto plains = per_rank(3, [](int) { return plain_mlp(); });
  std::vector<std::string> messages(3);
  TorchThreadWorld world(3, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    auto opt = optimizer_for("adam", model->parameters());
    ShardBackup backup(*model, *opt);
    opt->zero_grad();
    ::torch::mse_loss(model->forward(shard_of(data[0].x, rank, 3)), shard_of(data[0].y, rank, 3)).backward();
    opt->step();
    backup.step();
    if (rank == 2) {
      ::torch::NoGradGuard no_grad;
      Tensor piece = backup.pieces().back();
      auto* bits = reinterpret_cast<std::int32_t*>(piece.data_ptr<float>());
      bits[0] ^= 1;  // the last bit of one element
    }
    try {
      backup.verify();
    } catch (const Error& e) {
      messages[static_cast<std::size_t>(rank)] = e.what();
    }
  });
  for (const auto& message : messages) EXPECT_NE(message.find("rank(s) 2 differ"), std::string::npos) << message;
}

TEST(ShardBackup, RefusesWhatItCannotCopy) {
  auto plains = per_rank(2, [](int) { return plain_mlp(); });
  const auto data = batches(kWidths.front(), 24);
  {
    auto plain = plain_mlp();
    TorchThreadWorld alone(1, "shm");
    alone.run([&](int, ProcessGroup& pg) {
      auto model = sharded_mlp(plain, borrow(pg), {});
      auto opt = optimizer_for("sgd", model->parameters());
      EXPECT_THROW((ShardBackup{*model, *opt}), InvalidArgument);
    });
  }
  TorchThreadWorld world(2, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    ::torch::optim::LBFGS lbfgs(model->parameters());
    EXPECT_THROW((ShardBackup{*model, lbfgs}), ConfigError);
  });
}

// A backup made after training started, as a job resumed from its sharded
// checkpoint makes one: the copies take the loaded optimizer state along,
// each rank's step count included, and stay exact from there. Rank 0
// steps alone once before the checkpoint, so the ranks' counts differ.
class MadeLate : public ::testing::TestWithParam<std::string> {};

TEST_P(MadeLate, TakesTheOptimizerStateAlongAndStaysExact) {
  constexpr int kRanks = 3;
  const auto data = batches(kWidths.front(), 26);
  const auto dir = std::filesystem::temp_directory_path() / ("shard_backup_ckpt." + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model").string();
  auto plains = per_rank(kRanks, [](int) { return plain_mlp(); });
  auto fresh = per_rank(kRanks, [](int) { return plain_mlp(); });
  std::vector<Held> own(kRanks), copies(kRanks), at_start(kRanks);
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    const auto train = [&](auto& model, std::size_t s) {
      ::torch::mse_loss(model->forward(shard_of(data[s].x, rank, kRanks)), shard_of(data[s].y, rank, kRanks))
          .backward();
    };
    {
      auto first = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
      auto opt = optimizer_for(GetParam(), first->parameters());
      for (std::size_t s = 0; s < 3; ++s) {
        opt->zero_grad();
        train(first, s);
        opt->step();
      }
      if (rank == 0) opt->step();  // once more on its own, with the last gradients
      save_sharded_checkpoint(*first, path, opt.get());
    }
    auto model = sharded_mlp(fresh[static_cast<std::size_t>(rank)], borrow(pg), {});
    auto opt = optimizer_for(GetParam(), model->parameters());
    ASSERT_TRUE(load_sharded_checkpoint(*model, path, opt.get()));
    ShardBackup backup(*model, *opt);
    at_start[static_cast<std::size_t>(rank)] = copy_of(backup);
    backup.verify();
    for (std::size_t s = 3; s < data.size(); ++s) {
      opt->zero_grad();
      train(model, s);
      opt->step();
      backup.step();
      backup.verify();
    }
    own[static_cast<std::size_t>(rank)] = own_of(*opt);
    copies[static_cast<std::size_t>(rank)] = copy_of(backup);
  });
  std::filesystem::remove_all(dir);
  EXPECT_EQ(at_start[1].steps.front(), GetParam() == "sgd" ? 0 : 4) << "rank 0's own count, as its copy holds it";
  for (int r = 0; r < kRanks; ++r) {
    const int predecessor = (r + kRanks - 1) % kRanks;
    expect_same_bits(copies[static_cast<std::size_t>(r)], own[static_cast<std::size_t>(predecessor)],
                     "rank " + std::to_string(r) + "'s copy of rank " + std::to_string(predecessor));
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, MadeLate, ::testing::Values("sgd", "adam"));

// One more shard in memory: the copy's parameters, gradients and state are
// its predecessor's own.
TEST(ShardBackup, KeepsOneMoreShardOfParametersGradientsAndState) {
  const auto data = batches(kWidths.front(), 25);
  auto plains = per_rank(4, [](int) { return plain_mlp(); });
  std::vector<std::size_t> copy_bytes(4), own_bytes(4), shard_bytes(4);
  TorchThreadWorld world(4, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    auto opt = optimizer_for("adam", model->parameters());
    ShardBackup backup(*model, *opt);
    opt->zero_grad();
    ::torch::mse_loss(model->forward(shard_of(data[0].x, rank, 4)), shard_of(data[0].y, rank, 4)).backward();
    opt->step();
    backup.step();
    for (const auto& m : model->modules())
      if (auto* unit = dynamic_cast<FullyShardModule*>(m.get()))
        shard_bytes[static_cast<std::size_t>(rank)] += static_cast<std::size_t>(unit->shard_elements()) * sizeof(float);
    own_bytes[static_cast<std::size_t>(rank)] = state_bytes(*opt);
    copy_bytes[static_cast<std::size_t>(rank)] = backup.bytes();
  });
  for (int r = 0; r < 4; ++r) {
    const auto p = static_cast<std::size_t>((r + 3) % 4);
    // Padded shards are the same size on every rank; the gradients leave
    // from where fully_shard put them, with no buffer of their own.
    EXPECT_EQ(copy_bytes[static_cast<std::size_t>(r)], 2 * shard_bytes[p] + own_bytes[p]) << "rank " << r;
  }
}

// The plan for a fully sharded step with a shard taken over (docs/fsdp.md,
// "Backup shards"): where a rank holds two logical shards, each unit's
// parameters whole, each shard's gradients apart, then one
// reduce_scatter_shards per unit. Its reduced gradients must be those of
// the full group's fully sharded step, bit for bit: 3 ranks step the
// sharded model; 2 ranks, the second holding shards 1 and 2 (rank 1 of 3
// lost, its shard with its successor), compute every shard's gradients on
// the whole model and reduce them over logical shards, over shm and tcp.
class TakenOverShard : public ::testing::TestWithParam<std::string> {};

TEST_P(TakenOverShard, ReducedOverLogicalShardsEqualsTheFullGroupsStep) {
  constexpr int kShards = 3;
  const auto data = batches(kWidths.front(), 27);
  const auto loss_of = [&](nn::Sequential& net, const Tensor& x, int shard) {
    return ::torch::mse_loss(net->forward(shard_of(x, shard, kShards)), shard_of(data[0].y, shard, kShards));
  };
  // The full group's step: each unit's layout, the model's parameters it
  // holds (by index), and every rank's reduced shard of it.
  struct Unit {
    ShardLayout layout{{1}, 1};
    std::vector<std::size_t> params;
    std::vector<Tensor> reduced;  // by shard
  };
  std::vector<Unit> units;
  auto plains = per_rank(kShards, [](int) { return plain_mlp(); });
  std::vector<std::vector<Tensor>> reduced(kShards);
  TorchThreadWorld full(kShards, "shm");
  full.run([&](int rank, ProcessGroup& pg) {
    auto& plain = plains[static_cast<std::size_t>(rank)];
    auto model = sharded_mlp(plain, borrow(pg), {});
    std::vector<detail::FsdpUnit*> mine;
    for (const auto& m : model->modules())
      if (auto* unit = dynamic_cast<FullyShardModule*>(m.get())) mine.push_back(&unit->unit());
    for (auto* unit : mine) unit->keep_gradient_memory();
    ::torch::mse_loss(model->forward(shard_of(data[0].x, rank, kShards)), shard_of(data[0].y, rank, kShards))
        .backward();
    for (auto* unit : mine) reduced[static_cast<std::size_t>(rank)].push_back(unit->gradient_memory().clone());
    if (rank != 0) return;
    const auto all = plain->parameters();
    for (auto* unit : mine) {
      Unit u;
      u.layout = unit->layout();
      for (const auto& p : unit->params())
        for (std::size_t i = 0; i < all.size(); ++i)
          if (all[i].unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) u.params.push_back(i);
      ASSERT_EQ(u.params.size(), unit->params().size()) << unit->name();
      units.push_back(std::move(u));
    }
  });
  ASSERT_EQ(units.size(), 4u);  // three blocks and the root
  for (std::size_t k = 0; k < units.size(); ++k)
    for (int r = 0; r < kShards; ++r) units[k].reduced.push_back(reduced[static_cast<std::size_t>(r)][k]);

  const std::vector<int> holder = {0, 1, 1};
  auto survivors = per_rank(2, [](int) { return plain_mlp(); });
  TorchThreadWorld left(2, GetParam());
  left.run([&](int rank, ProcessGroup& pg) {
    auto& net = survivors[static_cast<std::size_t>(rank)];
    const std::vector<int> held = shards_held(holder, rank);
    std::vector<std::vector<Tensor>> flats(units.size());  // [unit][held shard]
    for (int shard : held) {
      // Undefined, as the full group's first step found them: backward sets
      // them, with no zero added (libtorch 1.13's zero_grad keeps zeros).
      for (auto& p : net->parameters()) p.mutable_grad() = Tensor();
      loss_of(net, data[0].x, shard).backward();
      const auto all = net->parameters();
      for (std::size_t k = 0; k < units.size(); ++k) {
        const ShardLayout& layout = units[k].layout;
        Tensor flat = ::torch::zeros({layout.flat_elements()});
        for (std::size_t i = 0; i < units[k].params.size(); ++i)
          flat.narrow(0, layout.flat_offset(i), layout.numel(i)).copy_(all[units[k].params[i]].grad().reshape(-1));
        flats[k].push_back(flat);
      }
    }
    for (std::size_t k = 0; k < units.size(); ++k) {
      std::vector<ConstBuffer> inputs;
      for (const Tensor& f : flats[k]) inputs.push_back(ConstBuffer{f.data_ptr(), static_cast<std::size_t>(f.numel()), DType::f32});
      std::vector<Tensor> blocks;
      std::vector<Buffer> outputs;
      for (std::size_t j = 0; j < held.size(); ++j) {
        blocks.push_back(::torch::empty({units[k].layout.shard_elements()}));
        outputs.push_back(Buffer{blocks.back().data_ptr(), static_cast<std::size_t>(blocks.back().numel()), DType::f32});
      }
      pg.reduce_scatter_shards(inputs, holder, outputs, ReduceOp::avg)->wait();
      for (std::size_t j = 0; j < held.size(); ++j)
        EXPECT_TRUE(::torch::equal(blocks[j], units[k].reduced[static_cast<std::size_t>(held[j])]))
            << "unit " << k << ", shard " << held[j] << " on rank " << rank << " of 2: differs by "
            << (blocks[j] - units[k].reduced[static_cast<std::size_t>(held[j])]).abs().max().item<float>();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, TakenOverShard, ::testing::Values("shm", "tcp"));

// A unit's gradient as the shard of logical rank `shard` holds it: each
// parameter's gradient (that rank's piece of it) in its place, zeros in
// the padding.
Tensor gradient_block(detail::FsdpUnit& unit, int shard) {
  Tensor block = ::torch::zeros({unit.layout().shard_elements()});
  for (std::size_t i = 0; i < unit.params().size(); ++i) {
    const ShardPiece piece = unit.layout().piece_of(shard, i);
    const Tensor& grad = unit.params()[i].grad();
    if (piece.count > 0 && grad.defined()) block.narrow(0, piece.shard_offset, piece.count).copy_(grad);
  }
  return block;
}

// The units themselves step with a shard taken over. Three ranks take a
// fully sharded step; rank 2 then leaves, its shards handed to rank 1 (as
// ShardBackup's copy holds them), and ranks 0 and 1, in a group of their
// own, take the next steps with begin_held_step, one forward and backward
// per held shard, and finish_held_step; SGD steps their own shards and
// rank 1 steps the taken-over blocks with the same arithmetic. Every
// step's gradients and parameters, the taken-over shard's included, equal
// the three ranks' run of the same steps, bit for bit; also in mixed
// precision (gathered and reduced in bf16).
class HeldStep : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(HeldStep, TwoRanksHoldingThreeShardsStepAsThreeRanksDo) {
  constexpr int kShards = 3;
  constexpr double kLr = 0.1;
  const std::vector<int> holder = {0, 1, 1};
  const auto data = batches(kWidths.front(), 31);
  const auto [backend, mixed] = GetParam();
  const auto loss_of = [&](auto& model, int step, int shard) {
    return ::torch::mse_loss(model.forward(shard_of(data[step].x, shard, kShards)).to(::torch::kFloat),
                             shard_of(data[step].y, shard, kShards));
  };
  const auto clear_gradients = [](auto& model) {
    for (auto& p : model.parameters()) p.mutable_grad() = Tensor();
  };
  // The three ranks' run: each step's gradient blocks and, after the
  // optimizer's step, shards, by rank, step and unit.
  using Blocks = std::vector<std::vector<std::vector<Tensor>>>;
  Blocks want_gradients(kShards), want_shards(kShards);
  auto plains = per_rank(kShards, [](int) { return plain_mlp(); });
  // As ShardBackup sets it: tcp's own reduce-scatter folds in another
  // order (the held step then differs by 4e-9 to 2e-8).
  FullyShardOptions options;
  options.reduce_in_shard_order = true;
  if (mixed) options.mp_policy.param_dtype = ::torch::kBFloat16;
  TorchThreadWorld world(kShards, backend);
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), options);
    ::torch::optim::SGD optimizer(model->parameters(), kLr);
    const auto units = model->unit().step().units;
    for (int s = 0; s < kSteps; ++s) {
      clear_gradients(*model);
      loss_of(*model, s, rank).backward();
      optimizer.step();
      auto& gradients = want_gradients[static_cast<std::size_t>(rank)].emplace_back();
      auto& shards = want_shards[static_cast<std::size_t>(rank)].emplace_back();
      for (auto* unit : units) {
        gradients.push_back(gradient_block(*unit, rank));
        shards.push_back(unit->shard().clone());
      }
    }
  });

  std::promise<std::vector<Tensor>> handed_over;
  auto handed = handed_over.get_future();
  const auto expect_equal = [](const Tensor& got, const Tensor& want, const std::string& what) {
    EXPECT_TRUE(::torch::equal(got, want)) << what << " differs by " << (got - want).abs().max().item<float>();
  };
  plains = per_rank(kShards, [](int) { return plain_mlp(); });
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), options);
    ::torch::optim::SGD optimizer(model->parameters(), kLr);
    auto& root = model->unit();
    const auto units = root.step().units;
    clear_gradients(*model);
    loss_of(*model, 0, rank).backward();
    optimizer.step();
    if (rank == 2) {
      std::vector<Tensor> shards;
      for (auto* unit : units) shards.push_back(unit->shard().clone());
      handed_over.set_value(std::move(shards));
      return;
    }
    std::vector<Tensor> taken_over = rank == 1 ? handed.get() : std::vector<Tensor>{};
    auto survivors = pg.new_group({0, 1});
    for (int s = 1; s < kSteps; ++s) {
      std::vector<std::vector<Tensor>> blocks(units.size());
      for (std::size_t k = 0; k < taken_over.size(); ++k) blocks[k].push_back(taken_over[k]);
      clear_gradients(*model);
      root.begin_held_step(survivors, holder, rank, blocks);
      for (int shard : shards_held(holder, rank)) loss_of(*model, s, shard).backward();
      const auto reduced = root.finish_held_step();
      optimizer.step();
      ASSERT_EQ(reduced.size(), units.size());
      for (std::size_t k = 0; k < units.size(); ++k) {
        const std::string at = "step " + std::to_string(s) + ", unit " + std::to_string(k);
        const auto& want_own = want_gradients[static_cast<std::size_t>(rank)][static_cast<std::size_t>(s)][k];
        expect_equal(gradient_block(*units[k], rank), want_own, at + ", rank " + std::to_string(rank) + "'s gradient");
        expect_equal(units[k]->shard(), want_shards[static_cast<std::size_t>(rank)][static_cast<std::size_t>(s)][k],
                     at + ", rank " + std::to_string(rank) + "'s shard");
        ASSERT_EQ(reduced[k].size(), taken_over.empty() ? 0u : 1u) << at;
        if (taken_over.empty()) continue;
        expect_equal(reduced[k][0], want_gradients[2][static_cast<std::size_t>(s)][k], at + ", shard 2's gradient");
        taken_over[k].add_(reduced[k][0], -kLr);  // SGD's step, as rank 2's optimizer takes it
        expect_equal(taken_over[k], want_shards[2][static_cast<std::size_t>(s)][k], at + ", shard 2");
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, HeldStep, ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Bool()));

// The whole take-over with ShardBackup: three ranks train with Adam and a
// backup; after the first step rank `dead` leaves, and its successor in the
// ring, which keeps its copy, holds its shard from then on: the held steps
// take the copy's blocks (kept_blocks), and the copy's optimizer steps
// them with the reduced gradients (step_kept). Every survivor's shard and
// the copy equal the three ranks' run after every step, bit for bit.
class BackupTakesOver : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(BackupTakesOver, TheSuccessorStepsTheLostShardAsItsOwnerWould) {
  constexpr int kShards = 3;
  const auto [backend, dead] = GetParam();
  const int successor = (dead + 1) % kShards;
  std::vector<int> survivors;  // old ranks, in the re-formed group's order
  for (int r = 0; r < kShards; ++r)
    if (r != dead) survivors.push_back(r);
  const auto new_rank = [&](int old) {
    return static_cast<int>(std::find(survivors.begin(), survivors.end(), old) - survivors.begin());
  };
  std::vector<int> holder;
  for (int shard = 0; shard < kShards; ++shard) holder.push_back(new_rank(shard == dead ? successor : shard));
  const auto data = batches(kWidths.front(), 41);
  // The three ranks' shards after each step, by rank, step and unit.
  std::vector<std::vector<std::vector<Tensor>>> want(kShards);
  auto plains = per_rank(kShards, [](int) { return plain_mlp(); });
  TorchThreadWorld world(kShards, backend);
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    auto optimizer = optimizer_for("adam", model->parameters());
    ShardBackup backup(*model, *optimizer);
    for (int s = 0; s < kSteps; ++s) {
      optimizer->zero_grad();
      backward_on_shards(*model, data, s, {rank}, kShards);
      optimizer->step();
      backup.step();
      want[static_cast<std::size_t>(rank)].push_back(unit_shards(*model));
    }
  });

  plains = per_rank(kShards, [](int) { return plain_mlp(); });
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    auto optimizer = optimizer_for("adam", model->parameters());
    ShardBackup backup(*model, *optimizer);
    auto& root = model->unit();
    const auto units = root.step().units;
    optimizer->zero_grad();
    backward_on_shards(*model, data, 0, {rank}, kShards);
    optimizer->step();
    backup.step();
    if (rank == dead) return;
    auto group = pg.new_group(survivors);
    const std::vector<int> held = shards_held(holder, group->rank());
    for (int s = 1; s < kSteps; ++s) {
      std::vector<std::vector<Tensor>> blocks(units.size());
      if (rank == successor) {
        const auto kept = backup.kept_blocks();
        for (std::size_t k = 0; k < units.size(); ++k) blocks[k].push_back(kept[k]);
      }
      optimizer->zero_grad();  // before the held step gathers, as before a forward
      root.begin_held_step(group, holder, rank, blocks);
      backward_on_shards(*model, data, s, held, kShards);
      const auto reduced = root.finish_held_step();
      optimizer->step();
      const std::string at = "step " + std::to_string(s) + ", rank " + std::to_string(rank);
      const auto mine = unit_shards(*model);
      for (std::size_t k = 0; k < units.size(); ++k)
        EXPECT_TRUE(::torch::equal(mine[k], want[static_cast<std::size_t>(rank)][static_cast<std::size_t>(s)][k]))
            << at << ", unit " << k;
      if (rank != successor) continue;
      std::vector<Tensor> gradients;
      for (const auto& r : reduced) gradients.push_back(r.empty() ? Tensor() : r.front());
      EXPECT_THROW(backup.step_kept({}), InvalidArgument);
      EXPECT_THROW(backup.step_kept(std::vector<Tensor>(units.size(), ::torch::zeros({3}))), InvalidArgument);
      backup.step_kept(gradients);
      const auto kept = backup.kept_blocks();
      for (std::size_t k = 0; k < units.size(); ++k)
        EXPECT_TRUE(::torch::equal(kept[k], want[static_cast<std::size_t>(dead)][static_cast<std::size_t>(s)][k]))
            << at << ", its copy of rank " << dead << "'s shard of unit " << k << " differs by "
            << (kept[k] - want[static_cast<std::size_t>(dead)][static_cast<std::size_t>(s)][k]).abs().max().item<float>();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(BackendsAndDeaths, BackupTakesOver,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Values(0, 1, 2)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_rank" + std::to_string(std::get<1>(info.param)) + "_dies";
                         });

// What a held step cannot start from is refused before anything changes,
// naming the cause.
TEST(HeldStepRefusals, AMapBlocksOrGradientsItCannotGoOnFromAreNamed) {
  auto plains = per_rank(2, [](int) { return plain_mlp(); });
  const auto data = batches(kWidths.front(), 37);
  TorchThreadWorld world(2, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    auto& root = model->unit();
    const std::size_t units = root.step().units.size();
    const auto refused = [&](const std::vector<int>& holder, int own, const std::vector<std::vector<Tensor>>& blocks,
                             const std::string& cause) {
      try {
        root.begin_held_step(borrow(pg), holder, own, blocks);
        ADD_FAILURE() << "not refused: " << cause;
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(cause), std::string::npos) << e.what();
      }
    };
    const std::vector<std::vector<Tensor>> none(units);
    if (rank == 0) {
      refused({0, 0, 1}, 0, none, "a map of 3 shards");
      refused({1, 0}, 0, none, "is not held by this rank");
      refused({0, 1}, 0, {{}}, "got blocks for 1 units; the model has 4");
      refused({0, 0}, 0, none, "got 0 blocks for the 1 shards this rank took over");
      std::vector<std::vector<Tensor>> misshapen(units, {::torch::zeros({3})});
      refused({0, 0}, 0, misshapen, "each must be a contiguous shard of");
      EXPECT_THROW(root.finish_held_step(), InvalidArgument);
    }
    model->set_requires_gradient_sync(false);
    ::torch::mse_loss(model->forward(shard_of(data[0].x, rank, 2)), shard_of(data[0].y, rank, 2)).backward();
    refused({0, 1}, rank, none, "keeps gradients of steps without gradient sync");
  });
}

}  // namespace
}  // namespace lockstep::torch
