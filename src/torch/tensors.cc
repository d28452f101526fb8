// Tensor helpers for the libtorch frontend: dtype mapping, coalesced
// broadcast (or sends to some ranks alone), and the cross-rank check that
// replicas have the same tensors.
// Stateless; thread-safe as far as the group is.
#include <fmt/format.h>

#include <functional>
#include <map>
#include <sstream>

#include "common/enforce.h"
#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "cuda_stream.h"
#include "receivers.h"

namespace lockstep::torch {

DType dtype_of(::torch::ScalarType type) {
  switch (type) {
    case ::torch::kFloat: return DType::f32;
    case ::torch::kDouble: return DType::f64;
    case ::torch::kHalf: return DType::f16;
    case ::torch::kBFloat16: return DType::bf16;
    case ::torch::kInt: return DType::i32;
    case ::torch::kLong: return DType::i64;
    case ::torch::kByte:
    case ::torch::kChar:
    case ::torch::kBool: return DType::u8;  // moved as bytes; never reduced
    default: break;
  }
  throw InvalidArgument(fmt::format("lockstep cannot communicate tensors of type {}", c10::toString(type)));
}

Buffer buffer_of(const ::torch::Tensor& t, std::string_view what) {
  const auto device = t.device();
  if (!device.is_cpu() && !device.is_cuda())
    throw InvalidArgument(fmt::format("{} is on {}: lockstep takes CPU and CUDA tensors", what, device.str()));
  Buffer b{t.data_ptr(), static_cast<std::size_t>(t.numel()), dtype_of(t.scalar_type())};
  if (device.is_cuda()) {
    b.device = Device::cuda(device.index());
    b.stream = current_stream(device);
  }
  return b;
}

namespace {

// `tensors` moved by `issue` (a broadcast, or sends and receives), each
// contiguous tensor of `in_place_bytes` or more in its own memory, the
// others packed, one transfer per dtype.
void move_coalesced(const std::vector<::torch::Tensor>& tensors, std::size_t in_place_bytes,
                    const std::function<void(Buffer, std::vector<std::shared_ptr<Work>>&)>& issue) {
  ::torch::NoGradGuard no_grad;
  std::vector<std::shared_ptr<Work>> transfers;
  std::map<::torch::ScalarType, std::vector<::torch::Tensor>> by_type;
  for (const auto& t : tensors) {
    if (t.numel() == 0) continue;
    if (t.is_contiguous() && t.nbytes() >= in_place_bytes)
      issue(buffer_of(t, "a tensor of the model"), transfers);
    else
      by_type[t.scalar_type()].push_back(t);
  }
  std::vector<::torch::Tensor> packed_by_type;
  for (auto& [type, group] : by_type) {
    std::vector<::torch::Tensor> flat;
    for (const auto& t : group) flat.push_back(t.reshape({-1}));
    packed_by_type.push_back(::torch::cat(flat).contiguous());
    issue(buffer_of(packed_by_type.back(), "a tensor of the model"), transfers);
  }
  // Every transfer waited for, even after one failed: none may write into
  // a tensor once the caller has the error. On a GPU, waiting orders the
  // current stream after the transfers, so the copies out of the packed
  // tensors below (queued there) see their result.
  wait_all(transfers);
  auto packed = packed_by_type.begin();
  for (auto& [type, group] : by_type) {
    std::int64_t offset = 0;
    for (auto& t : group) {
      t.copy_(packed->slice(0, offset, offset + t.numel()).view_as(t));
      offset += t.numel();
    }
    ++packed;
  }
  // The packed tensors' copy_ told autograd they changed; a tensor written
  // in its own memory must say so too, or a backward through a graph that
  // saved it would silently use the new values.
  for (const auto& t : tensors)
    if (t.numel() != 0 && t.is_contiguous() && t.nbytes() >= in_place_bytes)
      t.unsafeGetTensorImpl()->bump_version();
}

// The tag of send_coalesced's messages.
constexpr int kSendCoalescedTag = 0x5c00;

}  // namespace

void broadcast_coalesced(ProcessGroup& pg, const std::vector<::torch::Tensor>& tensors, int root,
                         std::size_t in_place_bytes) {
  if (pg.size() == 1 || tensors.empty()) return;
  move_coalesced(tensors, in_place_bytes, [&](Buffer b, std::vector<std::shared_ptr<Work>>& transfers) {
    transfers.push_back(pg.broadcast(b, root));
  });
}

void send_coalesced(ProcessGroup& pg, const std::vector<::torch::Tensor>& tensors, int root,
                    const std::vector<int>& receivers, std::size_t in_place_bytes) {
  send_coalesced(pg, tensors, Receivers(pg, root, receivers, "send_coalesced"), in_place_bytes);
}

void send_coalesced(ProcessGroup& pg, const std::vector<::torch::Tensor>& tensors, const Receivers& to,
                    std::size_t in_place_bytes) {
  if (tensors.empty() || to.empty() || !(to.sending(pg) || to.receiving(pg))) return;
  move_coalesced(tensors, in_place_bytes, [&](Buffer b, std::vector<std::shared_ptr<Work>>& transfers) {
    to.issue(pg, b, kSendCoalescedTag, transfers);
  });
}

namespace {

std::string describe(const ::torch::Tensor& t) {
  std::ostringstream shape;
  shape << t.sizes();
  return fmt::format("{} {}", shape.str(), c10::toString(t.scalar_type()));
}

}  // namespace

void verify_same_across_ranks(ProcessGroup& pg, const std::vector<std::pair<std::string, ::torch::Tensor>>& named,
                              const std::string& what) {
  std::vector<std::pair<std::string, std::string>> described;
  for (const auto& [name, t] : named) described.emplace_back(name, describe(t));
  verify_same_descriptions(pg, described, "the model's " + what,
                           "Every rank must build the same model before wrapping it in DistributedDataParallel.");
}

void verify_same_descriptions(ProcessGroup& pg, const std::vector<std::pair<std::string, std::string>>& described,
                              const std::string& what, const std::string& remedy) {
  if (pg.size() == 1) return;
  // Each rank publishes "name\tdescription" lines; every rank compares all
  // lists with rank 0's, so each reports the same differences.
  std::string mine;
  for (const auto& [name, desc] : described) mine += name + "\t" + desc + "\n";
  const auto instance = pg.store()->add(fmt::format("ddp/verify/{}/{}", what, pg.rank()), 1);
  const auto key = [&](int r) { return fmt::format("ddp/verify/{}/{}/{}", what, instance, r); };
  pg.store()->set(key(pg.rank()), mine);
  const auto parse = [](const std::string& text) {
    std::map<std::string, std::string> m;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      const auto tab = line.find('\t');
      if (tab != std::string::npos) m[line.substr(0, tab)] = line.substr(tab + 1);
    }
    return m;
  };
  const auto reference = parse(pg.store()->get(key(0)));
  std::vector<std::string> differences;
  for (int r = 1; r < pg.size(); ++r) {
    const auto other = parse(pg.store()->get(key(r)));
    for (const auto& [name, desc] : reference) {
      auto it = other.find(name);
      if (it == other.end())
        differences.push_back(fmt::format("rank {} has no '{}' (rank 0: {})", r, name, desc));
      else if (it->second != desc)
        differences.push_back(fmt::format("'{}' is {} on rank {} but {} on rank 0", name, it->second, r, desc));
    }
    for (const auto& [name, desc] : other)
      if (!reference.count(name)) differences.push_back(fmt::format("rank {} has an extra '{}' ({})", r, name, desc));
  }
  if (differences.empty()) return;
  std::string list;
  for (std::size_t i = 0; i < differences.size() && i < 20; ++i) list += "\n  " + differences[i];
  if (differences.size() > 20) list += fmt::format("\n  ... and {} more", differences.size() - 20);
  throw MismatchError(fmt::format("rank {}/{}: {} differ across ranks ({} difference(s)):{}\n{}", pg.rank(),
                                  pg.size(), what, differences.size(), list, remedy));
}

}  // namespace lockstep::torch
