// `lockstep bench`; see bench_command.h and docs/performance.md.
//
// Per size: (with -c 1) one checked run on known inputs, counting wrong
// elements on every rank; then -w warm-up and -n timed iterations between
// barriers. The time reported is the slowest rank's average per iteration.
// algbw = size / time; busbw = algbw x the collective's bus factor, so that
// busbw is comparable to the hardware's bandwidth whatever the rank count
// (nccl-tests' definition): allreduce 2(n-1)/n; allgather (also with
// per-rank counts, measured with equal ones), reduce_scatter, all_to_all,
// gather and scatter (n-1)/n; broadcast and reduce 1. For all of the
// (n-1)/n ones, size is the whole buffer (n blocks), as in nccl-tests.
#include "bench/bench_command.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <lockstep_option_checks/option_checks.h>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/env.h"
#include "common/format.h"
#include "common/half.h"
#include "ddp/bucket_memory.h"
#include "bench/busy_load.h"
#include "bench/device_memory.h"
#include "lockstep/affinity.h"
#include "lockstep/error.h"
#include "lockstep/process_group.h"
#include "run/run_command.h"

namespace lockstep::cli {
namespace {

// -b/-e in bytes (CLI11 checked them already; options built in code are
// checked here).
std::size_t parse_size(const std::string& text) {
  const auto bytes = option_checks::byte_size(text);
  if (!bytes) throw InvalidArgument(fmt::format("'{}' is not a size; use {}", text, option_checks::kByteSizeWords));
  return static_cast<std::size_t>(*bytes);
}

struct Row {
  std::size_t bytes = 0;
  std::size_t count = 0;
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  std::int64_t wrong = 0;
  double cpu_us = 0;  // CPU time of a rank's process (all its threads) per iteration, averaged over ranks
};

// User and system time of this process so far, in microseconds.
double process_cpu_us() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  const auto us = [](const timeval& t) { return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_usec); };
  return us(u.ru_utime) + us(u.ru_stime);
}

double bus_factor(Collective c, int n) {
  switch (c) {
    case Collective::allreduce: return 2.0 * (n - 1) / n;
    case Collective::allgather:
    case Collective::allgather_v:
    case Collective::reduce_scatter:
    case Collective::all_to_all:
    case Collective::gather:
    case Collective::scatter: return static_cast<double>(n - 1) / n;
    default: return 1.0;
  }
}

// Known input: small integers, so every dtype reduces exactly.
double pattern(int rank, std::size_t i) { return static_cast<double>((rank * 3 + i * 7) % 9) - 4; }

void fill(void* buf, DType dtype, std::size_t count, int rank, std::size_t offset = 0) {
  // uint8 is shifted by 4 so the -4..4 pattern stays non-negative.
  const double shift = dtype == DType::u8 ? 4 : 0;
  for (std::size_t i = 0; i < count; ++i) store_from_double(buf, dtype, i, pattern(rank, offset + i) + shift);
}

double value_at(const void* buf, DType dtype, std::size_t i) { return load_as_double(buf, dtype, i); }

// The value a correct collective leaves at index i (element `offset + i`
// of the full vector), for sum/avg/min/max/prod over n ranks.
double expected(DType dtype, ReduceOp op, int n, std::size_t index) {
  const auto in = [&](int r) { return dtype == DType::u8 ? pattern(r, index) + 4 : pattern(r, index); };
  double acc = in(0);
  for (int r = 1; r < n; ++r) {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
      case ReduceOp::premul_sum: acc += in(r); break;  // bench's premul_sum factor is 1
      case ReduceOp::min: acc = std::min(acc, in(r)); break;
      case ReduceOp::max: acc = std::max(acc, in(r)); break;
      case ReduceOp::prod: acc *= in(r); break;
    }
  }
  if (dtype == DType::u8 && (op == ReduceOp::sum || op == ReduceOp::avg || op == ReduceOp::prod))
    acc = static_cast<double>(static_cast<std::uint8_t>(static_cast<std::int64_t>(acc)));
  if (op == ReduceOp::avg) {
    if (is_floating(dtype)) {
      acc = dtype == DType::f64 ? acc / n : static_cast<double>(static_cast<float>(acc) / static_cast<float>(n));
      if (dtype == DType::f16) acc = half_to_float(float_to_half(static_cast<float>(acc)));
      if (dtype == DType::bf16) acc = bf16_to_float(float_to_bf16(static_cast<float>(acc)));
    } else {
      acc = static_cast<double>(static_cast<std::int64_t>(acc) / n);
    }
  }
  return acc;
}

// Products of many ranks overflow small types; check prod only where exact.
bool checkable(ReduceOp op, DType dtype, int n) {
  if (op != ReduceOp::prod) return true;
  return n <= 4 || dtype == DType::f64 || dtype == DType::i64;
}

class Bench {
 public:
  // `device`: buffers in CUDA memory (--device cuda); null: host memory.
  Bench(ProcessGroup& pg, const BenchOptions& o, DType dtype, ReduceOp op, DeviceMemory* device)
      : pg_(pg), o_(o), dtype_(dtype), op_(op), n_(pg.size()), r_(pg.rank()), device_(device) {}
  ~Bench() {
    if (device_ == nullptr) return;
    device_->release(a_.device);
    device_->release(b_.device);
  }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  // Buffers in the group's shared memory with --shared-buffers (single
  // copy on the shm backend), else ordinary memory. Same size on every
  // rank, so the collective allocation lines up. With --device cuda the
  // collective runs on a copy in CUDA memory; the host memory fills and
  // checks it.
  struct Buf {
    std::shared_ptr<std::byte[]> shared;
    std::vector<std::byte> plain;
    void* device = nullptr;
    std::size_t size = 0;
    std::byte* data() { return shared ? shared.get() : plain.data(); }
  };
  void allocate(Buf& b, std::size_t bytes) {
    b.size = bytes;
    if (o_.shared_buffers) {
      b.shared = pg_.allocate_shared(std::max<std::size_t>(bytes, 1));
    } else {
      b.plain.assign(std::max<std::size_t>(bytes, 1), std::byte{0});
    }
    if (device_ != nullptr) {
      device_->release(b.device);
      b.device = device_->allocate(bytes);
    }
  }
  // The host memory's contents to the device, and back.
  void upload(Buf& b) {
    if (device_ != nullptr) device_->upload(b.device, b.data(), b.size);
  }
  void download(Buf& b) {
    if (device_ != nullptr) device_->download(b.data(), b.device, b.size);
  }
  // The collective's view of `count` elements of `b`.
  Buffer at(Buf& b, std::size_t count) {
    if (device_ == nullptr) return Buffer{b.data(), count, dtype_};
    return Buffer{b.device, count, dtype_, device_->device(), nullptr};
  }
  // Waits for an operation; on the device until its result is there.
  static void finish(const std::shared_ptr<Work>& work) { work->synchronize(); }

  // Runs one collective on the current buffers.
  void once(Collective c, std::size_t count) {
    switch (c) {
      case Collective::allreduce:
        // Out of place when there is an output buffer (--out-of-place).
        finish(b_.size > 0 ? pg_.allreduce(at(a_, count), at(b_, count), op_) : pg_.allreduce(at(a_, count), op_));
        break;
      case Collective::broadcast: finish(pg_.broadcast(at(a_, count), o_.root)); break;
      case Collective::reduce: finish(pg_.reduce(at(a_, count), o_.root, op_)); break;
      case Collective::allgather:
        finish(pg_.allgather(at(a_, count), at(b_, count * static_cast<std::size_t>(n_))));
        break;
      case Collective::reduce_scatter:
        finish(pg_.reduce_scatter(at(a_, count * static_cast<std::size_t>(n_)), at(b_, count), op_));
        break;
      case Collective::allgather_v:
        finish(pg_.allgather(at(a_, count), at(b_, count * static_cast<std::size_t>(n_)),
                      std::vector<std::size_t>(static_cast<std::size_t>(n_), count)));
        break;
      case Collective::all_to_all:
        finish(pg_.all_to_all(at(a_, count * static_cast<std::size_t>(n_)),
                       at(b_, count * static_cast<std::size_t>(n_))));
        break;
      case Collective::gather:
        finish(pg_.gather(at(a_, count),
                   at(b_, r_ == o_.root ? count * static_cast<std::size_t>(n_) : 0), o_.root));
        break;
      case Collective::scatter:
        finish(pg_.scatter(at(a_, r_ == o_.root ? count * static_cast<std::size_t>(n_) : 0),
                    at(b_, count), o_.root));
        break;
      default: throw InvalidArgument(fmt::format("bench does not measure {}", c));
    }
  }

  // The value rank q's input holds at index i (u8 inputs are shifted to
  // stay non-negative).
  double input(int q, std::size_t i) const { return pattern(q, i) + (dtype_ == DType::u8 ? 4 : 0); }

  // One run on the inputs just filled, its results back in host memory.
  void run_checked(Collective c, std::size_t count) {
    upload(a_);
    once(c, count);
    download(a_);
    download(b_);
  }

  // Elements wrong on this rank after one run on known inputs.
  std::int64_t check(Collective c, std::size_t count) {
    const std::size_t n = static_cast<std::size_t>(n_);
    const std::size_t elem = dtype_size(dtype_);
    std::int64_t wrong = 0;
    switch (c) {
      case Collective::allreduce:
      case Collective::reduce: {
        fill(a_.data(), dtype_, count, r_);
        run_checked(c, count);
        if (c == Collective::reduce && r_ != o_.root) break;
        if (!checkable(op_, dtype_, n_)) break;
        Buf& result = b_.size > 0 ? b_ : a_;
        for (std::size_t i = 0; i < count; ++i)
          wrong += value_at(result.data(), dtype_, i) != expected(dtype_, op_, n_, i);
        // Out of place, the input must come back untouched.
        if (&result == &b_)
          for (std::size_t i = 0; i < count; ++i) wrong += value_at(a_.data(), dtype_, i) != input(r_, i);
        break;
      }
      case Collective::broadcast:
        fill(a_.data(), dtype_, count, r_);
        run_checked(c, count);
        for (std::size_t i = 0; i < count; ++i)
          wrong += value_at(a_.data(), dtype_, i) != (dtype_ == DType::u8 ? pattern(o_.root, i) + 4 : pattern(o_.root, i));
        break;
      case Collective::gather:
        fill(a_.data(), dtype_, count, r_);
        run_checked(c, count);
        if (r_ != o_.root) break;
        for (std::size_t q = 0; q < n; ++q)
          for (std::size_t i = 0; i < count; ++i)
            wrong += value_at(b_.data() + q * count * elem, dtype_, i) != input(static_cast<int>(q), i);
        break;
      case Collective::scatter:
        fill(a_.data(), dtype_, r_ == o_.root ? count * n : 0, r_);
        run_checked(c, count);
        for (std::size_t i = 0; i < count; ++i)
          wrong += value_at(b_.data(), dtype_, i) != input(o_.root, static_cast<std::size_t>(r_) * count + i);
        break;
      case Collective::all_to_all:
        fill(a_.data(), dtype_, count * n, r_);
        run_checked(c, count);
        for (std::size_t q = 0; q < n; ++q)
          for (std::size_t i = 0; i < count; ++i)
            wrong += value_at(b_.data() + q * count * elem, dtype_, i) !=
                     input(static_cast<int>(q), static_cast<std::size_t>(r_) * count + i);
        break;
      case Collective::allgather:
      case Collective::allgather_v:
        fill(a_.data(), dtype_, count, r_);
        run_checked(c, count);
        for (std::size_t q = 0; q < n; ++q)
          for (std::size_t i = 0; i < count; ++i) {
            const double want = pattern(static_cast<int>(q), i) + (dtype_ == DType::u8 ? 4 : 0);
            wrong += value_at(b_.data() + q * count * elem, dtype_, i) != want;
          }
        break;
      case Collective::reduce_scatter:
        fill(a_.data(), dtype_, count * n, r_);
        run_checked(c, count);
        if (!checkable(op_, dtype_, n_)) break;
        for (std::size_t i = 0; i < count; ++i)
          wrong += value_at(b_.data(), dtype_, i) != expected(dtype_, op_, n_, static_cast<std::size_t>(r_) * count + i);
        break;
      default: break;
    }
    return wrong;
  }

  Row measure(Collective c, std::size_t bytes) {
    const std::size_t elem = dtype_size(dtype_);
    const std::size_t n = static_cast<std::size_t>(n_);
    Row row;
    // nccl-tests' convention: size is the whole buffer (for allgather and
    // gather the output, for reduce_scatter and scatter the input, for
    // all_to_all either), so the per-rank block is size/n.
    const bool split = c != Collective::allreduce && c != Collective::broadcast && c != Collective::reduce;
    row.count = std::max<std::size_t>(1, bytes / elem / (split ? n : 1));
    row.bytes = row.count * elem * (split ? n : 1);
    const std::size_t block = row.count * elem;
    // a_: the input; b_: the output (a_ is reduced in place when b_ is empty).
    switch (c) {
      case Collective::reduce_scatter:
      case Collective::scatter: allocate(a_, block * n); allocate(b_, block); break;
      case Collective::allgather:
      case Collective::allgather_v:
      case Collective::gather: allocate(a_, block); allocate(b_, block * n); break;
      case Collective::all_to_all: allocate(a_, block * n); allocate(b_, block * n); break;
      case Collective::allreduce: allocate(a_, block); allocate(b_, o_.out_of_place ? block : 0); break;
      default: allocate(a_, block); allocate(b_, 0); break;
    }
    if (o_.check) row.wrong = check(c, row.count);
    fill(a_.data(), dtype_, a_.size / elem, r_);
    upload(a_);
    for (int i = 0; i < o_.warmup; ++i) once(c, row.count);
    pg_.barrier()->wait();
    const auto start = Clock::now();
    const double cpu_start = process_cpu_us();
    for (int i = 0; i < o_.iters; ++i) once(c, row.count);
    double us = seconds_between(start, Clock::now()) * 1e6 / std::max(1, o_.iters);
    row.cpu_us = (process_cpu_us() - cpu_start) / std::max(1, o_.iters);
    pg_.allreduce(Buffer{&row.cpu_us, 1, DType::f64}, ReduceOp::avg)->wait();
    // The slowest rank's time and the total of wrong elements.
    pg_.allreduce(Buffer{&us, 1, DType::f64}, ReduceOp::max)->wait();
    pg_.allreduce(Buffer{&row.wrong, 1, DType::i64}, ReduceOp::sum)->wait();
    row.time_us = us;
    row.algbw = static_cast<double>(row.bytes) / (us * 1e3);  // bytes/us/1e3 = GB/s
    row.busbw = row.algbw * bus_factor(c, n_);
    return row;
  }

 private:
  ProcessGroup& pg_;
  const BenchOptions& o_;
  DType dtype_;
  ReduceOp op_;
  int n_;
  int r_;
  DeviceMemory* device_;
  Buf a_, b_;
};

// Memory-copy bandwidth with every rank copying at once: the bound a
// one-host collective works against, and the rate of DDP's bucket copies
// (`lockstep simulate --calibrate` takes it). The median of single copies,
// so that one copy slowed by something else on the machine does not set it.
double memcpy_bandwidth(ProcessGroup& pg) {
  constexpr std::size_t kBytes = 64u << 20;
  std::vector<std::byte> src(kBytes, std::byte{1}), dst(kBytes, std::byte{0});
  std::memcpy(dst.data(), src.data(), kBytes);  // fault the pages in
  pg.barrier()->wait();
  constexpr int kReps = 9;
  std::vector<double> rates;
  for (int i = 0; i < kReps; ++i) {
    const auto start = Clock::now();
    std::memcpy(dst.data(), src.data(), kBytes);
    rates.push_back(static_cast<double>(kBytes) / seconds_between(start, Clock::now()) / 1e9);
  }
  std::nth_element(rates.begin(), rates.begin() + kReps / 2, rates.end());
  double gbps = rates[kReps / 2];
  pg.allreduce(Buffer{&gbps, 1, DType::f64}, ReduceOp::avg)->wait();
  return gbps;
}

// What the fp16 / bf16 compression hooks do to each bucket besides the
// all-reduce, at one rank's rates with every rank converting at once: the
// narrowing of fp32 gradients (scaled by 1/n) to 16 bits, and the widening
// of the reduced 16 bits back; in GB/s of fp32 bytes, medians of single
// passes over 64 MiB. `lockstep simulate --calibrate` charges them.
struct ConvertRates {
  double narrow = 0;
  double widen = 0;
};
ConvertRates conversion_rates(ProcessGroup& pg, DType wire) {
  constexpr std::size_t kCount = 16u << 20;
  constexpr int kReps = 7;
  const auto memory = detail::bucket_memory_for(Device::host());
  std::vector<float> wide(kCount, 1.5f);
  std::vector<std::byte> narrow(kCount * dtype_size(wire));
  const auto median_rate = [&](const auto& pass) {
    pass();  // fault the pages in
    pg.barrier()->wait();
    std::vector<double> rates;
    for (int i = 0; i < kReps; ++i) {
      const auto start = Clock::now();
      pass();
      rates.push_back(static_cast<double>(kCount * sizeof(float)) / seconds_between(start, Clock::now()) / 1e9);
    }
    std::nth_element(rates.begin(), rates.begin() + kReps / 2, rates.end());
    double gbps = rates[kReps / 2];
    pg.allreduce(Buffer{&gbps, 1, DType::f64}, ReduceOp::avg)->wait();
    return gbps;
  };
  ConvertRates r;
  r.narrow = median_rate([&] { memory->narrow(wide.data(), narrow.data(), kCount, 0.5f, wire, nullptr); });
  r.widen = median_rate([&] { memory->widen(narrow.data(), wide.data(), kCount, wire, nullptr); });
  return r;
}

std::string self_exe() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  return n > 0 ? std::string(path, static_cast<std::size_t>(n)) : "lockstep";
}

// The size sweep runs min, min x f, ... up to max: checked before any rank
// starts, since a sweep that cannot run would otherwise end with no rows and
// exit 0 (min > max), or never end (min 0 or f <= 1 never reach max).
void check_sizes(const BenchOptions& o) {
  const std::size_t min_bytes = parse_size(o.min_bytes), max_bytes = parse_size(o.max_bytes);
  if (min_bytes > max_bytes)
    throw InvalidArgument(fmt::format("-b {} ({} bytes) is larger than -e {} ({} bytes); the smallest size must not "
                                      "exceed the largest: swap them, or give -e at least {}",
                                      o.min_bytes, min_bytes, o.max_bytes, max_bytes, o.min_bytes));
  if (min_bytes == max_bytes) return;
  if (!(o.factor > 1))
    throw InvalidArgument(fmt::format("-f {} would never grow -b {} to -e {}; use a step factor greater than 1",
                                      o.factor, o.min_bytes, o.max_bytes));
  if (min_bytes == 0)
    throw InvalidArgument(fmt::format("-b 0 would never grow to -e {}; start the sweep at 1 byte or more, or set "
                                      "-e 0 too",
                                      o.max_bytes));
}

int bench_as_rank(const BenchOptions& o, const Config& config) {
  const auto dtype = parse_dtype(o.dtype);
  const auto op = parse_reduce_op(o.redop);
  if (!dtype) throw InvalidArgument(fmt::format("-d {}: unknown type; use float, double, half, bfloat16, int32, int64, uint8", o.dtype));
  if (!op) throw InvalidArgument(fmt::format("-o {}: unknown op; use sum, avg, min, max, prod", o.redop));
  std::vector<Collective> ops;
  if (o.op == "all") {
    ops = {Collective::allreduce,      Collective::broadcast,  Collective::reduce, Collective::allgather,
           Collective::reduce_scatter, Collective::all_to_all, Collective::gather, Collective::scatter,
           Collective::allgather_v};
  } else {
    const auto c = parse_collective(o.op);
    if (!c || *c == Collective::barrier || *c == Collective::send || *c == Collective::recv)
      throw InvalidArgument(fmt::format("--op {}: use allreduce, broadcast, reduce, allgather, reduce_scatter, "
                                        "all_to_all, gather, scatter, allgather_v or all",
                                        o.op));
    ops = {*c};
  }
  if (o.out_of_place && ops != std::vector<Collective>{Collective::allreduce})
    throw InvalidArgument(fmt::format("--out-of-place measures allreduce only (--op {}); the other collectives "
                                      "already write into a buffer of their own",
                                      o.op));
  // This rank's index on its host, from whichever launcher started it
  // (under mpirun LOCAL_RANK is not set, and every rank would pick the
  // first core).
  // The cores this rank's host gives its ranks, before pinning narrows them.
  const double cores_per_rank =
      static_cast<double>(usable_cores()) / std::max(1, config.placement().local_world_size);
  if (o.pin) pin_to_core_of_local_rank(config.placement().local_rank);
  GroupOptions group;
  group.config = config;
  group.backend = o.backend;
  auto pg = init_process_group(group);
  const bool printer = pg->rank() == 0;
  if (o.device != "host" && o.device != "cuda")
    throw InvalidArgument(fmt::format("--device {}: use host or cuda", o.device));
  const auto device = o.device == "cuda" ? open_device_memory(config.placement().local_rank) : nullptr;
  check_sizes(o);
  const std::size_t min_bytes = parse_size(o.min_bytes), max_bytes = parse_size(o.max_bytes);

  nlohmann::json report = {{"backend", pg->backend()}, {"ranks", pg->size()}, {"dtype", to_string(*dtype)},
                           {"redop", to_string(*op)}, {"iters", o.iters}, {"warmup", o.warmup}, {"results", nlohmann::json::array()}};
  if (device) report["device"] = to_string(device->device());
  if (printer) {
    std::printf("# lockstep bench: %d ranks, backend %s, %d iterations after %d warm-up, check %s, %s buffers, %s%s%s\n",
                pg->size(), pg->backend().c_str(), o.iters, o.warmup, o.check ? "on" : "off",
                o.shared_buffers ? "shared" : "ordinary", o.out_of_place ? "out of place" : "in place",
                device ? fmt::format(" in {} memory", to_string(device->device())).c_str() : "",
                o.busy > 0 ? fmt::format(", {} busy process(es) beside the ranks", o.busy).c_str() : "");
    std::printf("#\n# %10s %12s %8s %6s %6s %10s %8s %8s %7s\n", "size", "count", "type", "redop", "root", "time", "algbw",
                "busbw", "#wrong");
    std::printf("# %10s %12s %8s %6s %6s %10s %8s %8s %7s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "");
  }
  double busbw_sum = 0;
  int rows = 0;
  std::int64_t wrong_total = 0;
  double last_busbw = 0;
  Bench bench(*pg, o, *dtype, *op, device.get());
  for (Collective c : ops) {
    if (printer && ops.size() > 1) std::printf("# %s\n", std::string(to_string(c)).c_str());
    const bool reduces = c == Collective::allreduce || c == Collective::reduce || c == Collective::reduce_scatter;
    const bool rooted = c == Collective::broadcast || c == Collective::reduce || c == Collective::gather ||
                        c == Collective::scatter;
    // Each row at least a byte larger: -b 1 -f 1.5 would round back to 1
    // byte, row after row, and never reach -e.
    const auto next = [&](std::size_t bytes) {
      return std::max(bytes + 1, static_cast<std::size_t>(static_cast<double>(bytes) * o.factor));
    };
    for (std::size_t bytes = min_bytes;; bytes = next(bytes)) {
      const Row row = bench.measure(c, bytes);
      busbw_sum += row.busbw;
      wrong_total += row.wrong;
      last_busbw = row.busbw;
      ++rows;
      if (printer) {
        std::printf("  %10zu %12zu %8s %6s %6d %10.2f %8.2f %8.2f %7s\n", row.bytes, row.count,
                    std::string(to_string(*dtype)).c_str(), reduces ? std::string(to_string(*op)).c_str() : "none",
                    rooted ? o.root : -1, row.time_us, row.algbw, row.busbw, o.check ? std::to_string(row.wrong).c_str() : "N/A");
        std::fflush(stdout);
        report["results"].push_back({{"op", to_string(c)}, {"size", row.bytes}, {"count", row.count}, {"time_us", row.time_us},
                                     {"algbw", row.algbw}, {"busbw", row.busbw}, {"wrong", o.check ? row.wrong : -1},
                                     {"cpu_us", row.cpu_us}});
      }
      if (bytes >= max_bytes || o.factor <= 1) break;
    }
  }
  const double copy = memcpy_bandwidth(*pg);
  const bool sixteen = *dtype == DType::f16 || *dtype == DType::bf16;
  const ConvertRates convert = sixteen ? conversion_rates(*pg, *dtype) : ConvertRates{};
  if (printer) {
    const double avg = rows ? busbw_sum / rows : 0;
    std::printf("# Out of bounds values : %ld %s\n", static_cast<long>(wrong_total), wrong_total ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %.3f GB/s\n", avg);
    std::printf("# Memory copy bandwidth: %.3f GB/s per rank, all %d ranks copying at once\n", copy, pg->size());
    std::printf("# Largest size reached %.0f%% of the memory copy bandwidth\n", copy > 0 ? 100.0 * last_busbw / copy : 0);
    report["avg_busbw"] = avg;
    report["memcpy_gbps"] = copy;
    report["cores_per_rank"] = cores_per_rank;
    // The ranks of this rank's host, from its launcher: one rank on each of
    // two hosts is 1, not the world's 2.
    report["ranks_per_host"] = std::max(1, config.placement().local_world_size);
    report["shared_buffers"] = o.shared_buffers;
    report["out_of_place"] = o.out_of_place;
    // Spinning processes beside the ranks: rows of a collective competing
    // for the cores, as it does with compute in a step (simulate
    // --calibrate fits them apart from the idle rows).
    report["busy"] = o.busy;
    if (sixteen) {
      std::printf("# %s hook conversions  : narrow %.3f GB/s, widen %.3f GB/s of fp32 per rank\n",
                  std::string(to_string(*dtype)).c_str(), convert.narrow, convert.widen);
      report["narrow_gbps"] = convert.narrow;
      report["widen_gbps"] = convert.widen;
    }
    report["wrong"] = wrong_total;
    if (device) {
      // What staging is measured against: cudaMemcpy on pinned memory, the
      // largest size of the sweep (at most 256 MiB).
      const auto rates = device->pinned_copy_rates(std::min<std::size_t>(max_bytes, 256u << 20));
      std::printf("# cudaMemcpy, pinned   : %.3f GB/s to the device, %.3f GB/s to the host; both at once %.3f GB/s "
                  "each way\n",
                  rates.to_device, rates.to_host, rates.both_ways);
      report["pinned_copy_gbps"] = {
          {"to_device", rates.to_device}, {"to_host", rates.to_host}, {"both_ways", rates.both_ways}};
    }
    if (!o.json_path.empty()) std::ofstream(o.json_path) << report.dump(2) << "\n";
  }
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace

void add_bench_command(CLI::App& app, BenchOptions& o) {
  namespace checks = option_checks;
  auto* b = app.add_subcommand("bench", "Measure collectives the way nccl-tests does");
  b->add_option("--op", o.op,
                "allreduce, broadcast, reduce, allgather, reduce_scatter, all_to_all, gather, scatter, allgather_v "
                "(allgather with per-rank counts, all equal here), or all")
      ->capture_default_str();
  // No default here: an explicit --backend wins, else LOCKSTEP_BACKEND
  // (Config), else auto; as for any lockstep program.
  b->add_option("--backend", o.backend, "auto, tcp, shm, hier, mpi (default: LOCKSTEP_BACKEND, else auto)");
  b->add_option("--np,--nranks", o.nranks, "Start this many local ranks (ignored when already started by a launcher)")
      ->check(checks::whole_number_in(1, 1 << 16));
  b->add_option("-b,--minbytes", o.min_bytes, "Smallest size (K/M/G suffixes)")
      ->check(checks::byte_size_option())
      ->capture_default_str();
  b->add_option("-e,--maxbytes", o.max_bytes, "Largest size")->check(checks::byte_size_option())->capture_default_str();
  // Above 1 for a sweep; check_sizes says so, naming -b and -e.
  b->add_option("-f,--stepfactor", o.factor, "Multiply the size by this between rows")
      ->capture_default_str()
      ->check(checks::positive_number(1 << 20));
  b->add_option("-n,--iters", o.iters, "Timed iterations per size")->capture_default_str()->check(checks::positive_count());
  b->add_option("-w,--warmup_iters", o.warmup, "Untimed iterations first")
      ->capture_default_str()
      ->check(checks::non_negative_count());
  b->add_option("-c,--check", o.check, "Check results (count wrong elements): 0 or 1")
      ->capture_default_str()
      ->check(checks::whole_number_in(0, 1));
  b->add_option("-d,--datatype", o.dtype, "float, double, half, bfloat16, int32, int64, uint8")->capture_default_str();
  b->add_option("-o,--op_type", o.redop, "sum, avg, min, max, prod")->capture_default_str();
  b->add_option("-r,--root", o.root, "Root rank for broadcast, reduce, gather and scatter")
      ->capture_default_str()
      ->check(checks::non_negative_count());
  b->add_option("--json", o.json_path, "Also write the results to this JSON file");
  b->add_option("--pin", o.pin, "Pin each rank to its own core (1) or not (0)")->capture_default_str();
  b->add_option("--device", o.device,
                "host, or cuda: buffers in CUDA memory on cuda:(local rank % devices); each operation is timed until "
                "its result is in device memory")
      ->capture_default_str();
  b->add_option("--busy", o.busy,
                "With --np: start this many processes that spin beside the ranks while they run (cores shared)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  b->add_flag("--shared-buffers", o.shared_buffers,
              "Allocate buffers with ProcessGroup::allocate_shared (single copy on the shm backend)");
  b->add_flag("--out-of-place", o.out_of_place,
              "allreduce from one buffer into another (DDP's default reducer) instead of in place (its "
              "gradient_as_bucket_view)");
}

int run_bench(const BenchOptions& o, const std::vector<std::string>& argv) {
  check_sizes(o);
  // The one read of the environment for this command.
  const Config config = Config::from_environment();
  const bool launched = config.placement().source != LaunchSource::none;
  if (o.busy > 0 && !launched && o.nranks == 0)
    throw ConfigError("--busy starts its processes beside the ranks: give --np, or run bench under a launcher "
                      "(lockstep run, torchrun, mpirun), where each host's local rank 0 starts them");
  if (o.nranks > 0 && !launched) {
    const BusyLoad load(o.busy);
    RunOptions run;
    run.nproc_per_node = std::to_string(o.nranks);
    run.unprefixed_rank0 = true;
    run.program = argv;
    run.program[0] = self_exe();
    return run_job(run);
  }
  // Under a launcher (or as a rank of --np, whose processes are already
  // running beside it) each host's local rank 0 starts them, before it
  // pins itself: they share the cores the host's ranks may use.
  const bool starts_load = o.nranks == 0 && config.placement().local_rank == 0;
  const BusyLoad load(starts_load ? o.busy : 0);
  return bench_as_rank(o, config);
}

}  // namespace lockstep::cli
