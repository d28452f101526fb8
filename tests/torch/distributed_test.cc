// The tensor-level collectives (lockstep/torch/distributed.h) against the
// raw ProcessGroup API and known values, on shm and tcp thread ranks; and
// the checks on tensors: device, dtype, contiguity, list sizes.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "torch/thread_ranks.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/distributed.h"

namespace lockstep {
namespace {

namespace dist = lockstep::torch;
using testing::TorchThreadWorld;
using ::torch::Tensor;

class TensorCollectives : public ::testing::TestWithParam<std::string> {};

// Rank r's tensor: r * 100 + 0, 1, 2, ... as `type`.
Tensor ramp(int r, std::int64_t n, ::torch::ScalarType type = ::torch::kFloat) {
  return (::torch::arange(n, ::torch::kDouble) + r * 100).to(type);
}

TEST_P(TensorCollectives, AllReduceMatchesTheRawApiInEveryDType) {
  TorchThreadWorld world(3, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    for (auto type : {::torch::kFloat, ::torch::kDouble, ::torch::kHalf, ::torch::kBFloat16, ::torch::kInt,
                      ::torch::kLong, ::torch::kByte}) {
      Tensor t = ramp(rank, 37, type) % 50;
      Tensor raw = t.clone();
      dist::all_reduce(pg, t, ReduceOp::max);
      pg.allreduce(Buffer{raw.data_ptr(), 37, dist::dtype_of(type)}, ReduceOp::max)->wait();
      EXPECT_TRUE(::torch::equal(t, raw)) << c10::toString(type);
    }
  });
}

TEST_P(TensorCollectives, AsyncOpsReturnWorkAndFinishOnWait) {
  TorchThreadWorld world(2, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    Tensor t = ::torch::full({1000}, static_cast<float>(rank + 1));
    auto work = dist::all_reduce(pg, t, Reduction::premul_sum(0.5), /*async_op=*/true);
    work->wait();
    EXPECT_TRUE(work->done());
    EXPECT_TRUE(::torch::allclose(t, ::torch::full({1000}, 1.5f)));  // (1 + 2) / 2
    Tensor b = rank == 1 ? ::torch::arange(10, ::torch::kLong) : ::torch::zeros({10}, ::torch::kLong);
    dist::broadcast(pg, b, /*src=*/1, true)->wait();
    EXPECT_TRUE(::torch::equal(b, ::torch::arange(10, ::torch::kLong)));
    Tensor r = ::torch::ones({4, 4});
    dist::reduce(pg, r, /*dst=*/0)->wait();
    EXPECT_TRUE(::torch::equal(r, ::torch::full({4, 4}, rank == 0 ? 2.0f : 1.0f)));
  });
}

TEST_P(TensorCollectives, AllGatherIntoListsEqualOrUneven) {
  TorchThreadWorld world(3, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    std::vector<Tensor> list;
    for (int q = 0; q < 3; ++q) list.push_back(::torch::empty({2, 3}));
    dist::all_gather(pg, list, ramp(rank, 6).view({2, 3}));
    for (int q = 0; q < 3; ++q) EXPECT_TRUE(::torch::equal(list[static_cast<std::size_t>(q)], ramp(q, 6).view({2, 3})));
    // Uneven: rank q contributes q + 1 elements.
    std::vector<Tensor> uneven;
    for (int q = 0; q < 3; ++q) uneven.push_back(::torch::empty({q + 1}, ::torch::kLong));
    dist::all_gather(pg, uneven, ramp(rank, rank + 1, ::torch::kLong), /*async_op=*/true)->wait();
    for (int q = 0; q < 3; ++q) EXPECT_TRUE(::torch::equal(uneven[static_cast<std::size_t>(q)], ramp(q, q + 1, ::torch::kLong)));
    Tensor into = ::torch::empty({3, 4});
    dist::all_gather_into_tensor(pg, into, ramp(rank, 4));
    for (int q = 0; q < 3; ++q) EXPECT_TRUE(::torch::equal(into[q], ramp(q, 4)));
  });
}

TEST_P(TensorCollectives, ReduceScatterGatherAndScatter) {
  TorchThreadWorld world(3, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    Tensor out = ::torch::empty({2});
    dist::reduce_scatter_tensor(pg, out, ::torch::arange(6, ::torch::kFloat));
    EXPECT_TRUE(::torch::equal(out, ::torch::arange(6, ::torch::kFloat).slice(0, 2 * rank, 2 * rank + 2) * 3));
    std::vector<Tensor> gathered;
    if (rank == 1)
      for (int q = 0; q < 3; ++q) gathered.push_back(::torch::empty({5}, ::torch::kInt));
    dist::gather(pg, ramp(rank, 5, ::torch::kInt), gathered, /*dst=*/1);
    if (rank == 1)
      for (int q = 0; q < 3; ++q) EXPECT_TRUE(::torch::equal(gathered[static_cast<std::size_t>(q)], ramp(q, 5, ::torch::kInt)));
    std::vector<Tensor> parts;
    if (rank == 2)
      for (int q = 0; q < 3; ++q) parts.push_back(ramp(q, 7, ::torch::kDouble));
    Tensor mine = ::torch::empty({7}, ::torch::kDouble);
    dist::scatter(pg, mine, parts, /*src=*/2);
    EXPECT_TRUE(::torch::equal(mine, ramp(rank, 7, ::torch::kDouble)));
  });
}

TEST_P(TensorCollectives, AllToAllSingleWithAndWithoutSplitSizes) {
  TorchThreadWorld world(2, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    // Equal: rows [2r, 2r+1] of every rank's 4 x 3 input come to rank r.
    Tensor in = ramp(rank, 12).view({4, 3});
    Tensor out = ::torch::empty({4, 3});
    dist::all_to_all_single(pg, out, in);
    for (int q = 0; q < 2; ++q)
      EXPECT_TRUE(::torch::equal(out.slice(0, 2 * q, 2 * q + 2), ramp(q, 12).view({4, 3}).slice(0, 2 * rank, 2 * rank + 2)));
    // Split sizes: rank 0 sends 1 row to itself and 3 to rank 1; rank 1 sends 2 and 2.
    const std::vector<std::int64_t> in_splits = rank == 0 ? std::vector<std::int64_t>{1, 3} : std::vector<std::int64_t>{2, 2};
    const std::vector<std::int64_t> out_splits = rank == 0 ? std::vector<std::int64_t>{1, 2} : std::vector<std::int64_t>{3, 2};
    Tensor uneven_out = ::torch::empty({rank == 0 ? 3 : 5, 3});
    dist::all_to_all_single(pg, uneven_out, in, out_splits, in_splits, /*async_op=*/true)->wait();
    Tensor want = rank == 0 ? ::torch::cat({ramp(0, 12).view({4, 3}).slice(0, 0, 1), ramp(1, 12).view({4, 3}).slice(0, 0, 2)})
                            : ::torch::cat({ramp(0, 12).view({4, 3}).slice(0, 1, 4), ramp(1, 12).view({4, 3}).slice(0, 2, 4)});
    EXPECT_TRUE(::torch::equal(uneven_out, want));
    // Lists: input_list[q] goes to rank q.
    std::vector<Tensor> inputs{::torch::full({rank + 1}, rank * 10.0f), ::torch::full({rank + 2}, rank * 10.0f + 1)};
    std::vector<Tensor> outputs{::torch::empty({1 + rank}), ::torch::empty({2 + rank})};
    dist::all_to_all(pg, outputs, inputs);
    EXPECT_TRUE(::torch::equal(outputs[0], ::torch::full({1 + rank}, static_cast<float>(rank))));
    EXPECT_TRUE(::torch::equal(outputs[1], ::torch::full({2 + rank}, 10.0f + static_cast<float>(rank))));
  });
}

TEST_P(TensorCollectives, MismatchedSplitSizesAreAMismatchError) {
  TorchThreadWorld world(2, GetParam(), std::chrono::seconds(10));
  auto errors = world.run_collecting([](int rank, ProcessGroup& pg) {
    Tensor in = ::torch::zeros({4});
    Tensor out = ::torch::zeros({4});
    // Rank 0 sends 1 element to rank 1, which expects 2 from it.
    if (rank == 0) dist::all_to_all_single(pg, out, in, {3, 1}, {3, 1});
    else dist::all_to_all_single(pg, out, in, {2, 2}, {1, 3});
  });
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    EXPECT_THROW(std::rethrow_exception(e), MismatchError);
  }
}

TEST_P(TensorCollectives, PointToPointAndBatches) {
  TorchThreadWorld world(3, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    // A ring in one batch, listed receive-first on purpose, with messages
    // large enough to wait for their receiver.
    const int right = (rank + 1) % 3, left = (rank + 2) % 3;
    Tensor got = ::torch::empty({300000});
    auto works = dist::batch_isend_irecv(pg, {{dist::P2POp::Kind::irecv, got, left, 0},
                                              {dist::P2POp::Kind::isend, ramp(rank, 300000), right, 0}});
    for (auto& w : works) w->wait();
    EXPECT_TRUE(::torch::equal(got, ramp(left, 300000)));
    if (rank == 0) dist::send(pg, ::torch::arange(5, ::torch::kLong), 2, /*tag=*/7);
    if (rank == 2) {
      Tensor r = ::torch::empty({5}, ::torch::kLong);
      dist::recv(pg, r, 0, 7);
      EXPECT_TRUE(::torch::equal(r, ::torch::arange(5, ::torch::kLong)));
    }
    dist::barrier(pg);
    dist::monitored_barrier(pg, std::chrono::seconds(10));
  });
}

TEST_P(TensorCollectives, NonContiguousInputsAreCopiedAndOutputsRefused) {
  TorchThreadWorld world(2, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    Tensor wide = ramp(rank, 12).view({3, 4});
    Tensor column = wide.t();  // a non-contiguous view
    Tensor out = ::torch::empty({2, 4, 3});
    dist::all_gather_into_tensor(pg, out, column);
    for (int q = 0; q < 2; ++q) EXPECT_TRUE(::torch::equal(out[q], ramp(q, 12).view({3, 4}).t()));
    EXPECT_THROW(dist::all_reduce(pg, wide.slice(1, 0, 2)), InvalidArgument) << "every other column: not dense";
    EXPECT_THROW(dist::all_gather_into_tensor(pg, ::torch::empty({4, 6}).t(), column), InvalidArgument)
        << "a transposed output is dense but not in the order all_gather writes";
    // A channels-last tensor is dense: elementwise collectives take it as it is.
    Tensor image = ::torch::ones({1, 2, 3, 3}).contiguous(::torch::MemoryFormat::ChannelsLast);
    dist::all_reduce(pg, image);
    EXPECT_TRUE(::torch::equal(image, ::torch::full({1, 2, 3, 3}, 2.0f)));
  });
}

TEST_P(TensorCollectives, WrongDeviceDTypeOrListSizeIsInvalidArgument) {
  TorchThreadWorld world(2, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    Tensor meta = ::torch::empty({4}, ::torch::TensorOptions().device(::torch::kMeta));
    EXPECT_THROW(dist::all_reduce(pg, meta), InvalidArgument);
    EXPECT_THROW(dist::all_reduce(pg, ::torch::zeros({4}, ::torch::kComplexFloat)), InvalidArgument);
    EXPECT_THROW(dist::all_reduce(pg, ::torch::zeros({4}, ::torch::kBool)), InvalidArgument);
    EXPECT_THROW(dist::all_reduce(pg, ::torch::zeros({4}, ::torch::kInt), Reduction::premul_sum(2)), InvalidArgument);
    EXPECT_THROW(dist::all_gather_into_tensor(pg, ::torch::empty({8}, ::torch::kDouble), ::torch::zeros({4})),
                 InvalidArgument);
    std::vector<Tensor> one{::torch::empty({4})};
    EXPECT_THROW(dist::all_gather(pg, one, ::torch::zeros({4})), InvalidArgument);
    EXPECT_THROW(dist::all_to_all_single(pg, ::torch::empty({3}), ::torch::zeros({3})), InvalidArgument);
    EXPECT_FALSE(pg.aborted());
  });
}

TEST_P(TensorCollectives, ArchivesTravelThroughTheObjectCollectives) {
  TorchThreadWorld world(2, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    ::torch::serialize::OutputArchive out;
    out.write("weights", ramp(rank, 3));
    const auto all = all_gather_object(pg, dist::archive_bytes(out));
    for (int q = 0; q < 2; ++q) {
      ::torch::serialize::InputArchive in;
      dist::load_archive(in, all[static_cast<std::size_t>(q)]);
      Tensor w;
      in.read("weights", w);
      EXPECT_TRUE(::torch::equal(w, ramp(q, 3)));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, TensorCollectives, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lockstep
