// Gradients in plain vectors for the Reducer's tests (no libtorch).
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "lockstep/reducer.h"

namespace lockstep::testing {

// Gradients in vectors, or views into the reducer's buckets.
class VectorGradients final : public GradientSource {
 public:
  explicit VectorGradients(const std::vector<ParamSpec>& params) : storage_(params.size()), views_(params.size(), nullptr) {
    for (std::size_t i = 0; i < params.size(); ++i) storage_[i].assign(params[i].count, 0.0f);
  }
  void* gradient(std::size_t i) override {
    dropped_[i] = false;
    return views_[i] ? views_[i] : storage_[i].data();
  }
  bool has_gradient(std::size_t i) const override { return !dropped_[i]; }
  // As PyTorch's zero_grad(set_to_none=true): the next gradient starts from
  // zero in memory of its own.
  void drop(std::size_t i) {
    views_[i] = nullptr;
    owners_[i].reset();
    std::fill(storage_[i].begin(), storage_[i].end(), 0.0f);
    dropped_[i] = true;
  }
  void use_as_gradient(std::size_t i, void* slot, std::shared_ptr<void> owner) override {
    views_[i] = static_cast<float*>(slot);
    owners_[i] = std::move(owner);
  }
  void move_out_of(std::size_t i, const void* slot) override {
    if (views_[i] != slot) return;
    std::copy(views_[i], views_[i] + storage_[i].size(), storage_[i].begin());
    views_[i] = nullptr;
    owners_[i].reset();
  }
  float* grad(std::size_t i) { return static_cast<float*>(gradient(i)); }

 private:
  std::vector<std::vector<float>> storage_;
  std::vector<float*> views_;
  std::vector<std::shared_ptr<void>> owners_ = std::vector<std::shared_ptr<void>>(storage_.size());
  std::vector<bool> dropped_ = std::vector<bool>(storage_.size(), false);
};

}  // namespace lockstep::testing
