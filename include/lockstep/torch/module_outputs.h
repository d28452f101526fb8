// The tensors inside what a module's forward returned (a tensor, a vector
// of them, a tuple or pair of either), for the wrappers that act on a
// module's outputs: DDP follows them to find unused parameters,
// fully_shard hooks their gradients. Other types hold no tensors to follow.
#pragma once

#include <torch/torch.h>

#include <tuple>
#include <utility>
#include <vector>

namespace lockstep::torch::detail {

// Declared first so that each form finds the others inside it.
template <typename... Ts>
void collect(std::vector<::torch::Tensor>& out, const std::tuple<Ts...>& t);
template <typename A, typename B>
void collect(std::vector<::torch::Tensor>& out, const std::pair<A, B>& p);

inline void collect(std::vector<::torch::Tensor>& out, const ::torch::Tensor& t) { out.push_back(t); }
inline void collect(std::vector<::torch::Tensor>& out, const std::vector<::torch::Tensor>& v) {
  out.insert(out.end(), v.begin(), v.end());
}
template <typename... Ts>
void collect(std::vector<::torch::Tensor>& out, const std::tuple<Ts...>& t) {
  std::apply([&](const auto&... e) { (collect(out, e), ...); }, t);
}
template <typename A, typename B>
void collect(std::vector<::torch::Tensor>& out, const std::pair<A, B>& p) {
  collect(out, p.first);
  collect(out, p.second);
}
template <typename T>
void collect(std::vector<::torch::Tensor>&, const T&) {}  // no tensors to follow

}  // namespace lockstep::torch::detail
