// lockstep's Store interface over the c10d::Store that init_process_group
// hands a backend (env://, tcp://, file://, torchrun's), so lockstep's
// rendezvous, diagnostics and abort flags go through PyTorch's own store.
// Thread-safe as far as the c10d store is; clone() gives the watchdog its
// own connection where the c10d store can clone.
#pragma once

#include <memory>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "lockstep/store.h"

namespace lockstep_torch {

class C10dStore final : public lockstep::Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store);

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected, std::string_view desired) override;
  void wait(const std::vector<std::string>& keys, lockstep::Duration timeout) override;
  using lockstep::Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(std::string_view key) override;
  std::int64_t num_keys() override;
  std::shared_ptr<lockstep::Store> clone() const override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace lockstep_torch
