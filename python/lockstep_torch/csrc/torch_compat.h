// What the c10d interface of each PyTorch release the package builds
// against offers, in one place: from 2.7 (the oldest supported, see
// scripts/torch-oldest-requirements.txt) to the newest. Thread-safety: the
// store's.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace lockstep_torch {

// A second connection to `store` where c10d's Store can make one (clone(),
// which 2.7 lacks; it throws for stores that cannot), else the store itself,
// shared.
template <typename Store>
c10::intrusive_ptr<Store> clone_or_share(const c10::intrusive_ptr<Store>& store) {
  if constexpr (requires { store->clone(); }) {
    try {
      return store->clone();
    } catch (const c10::Error&) {
      return store;
    }
  } else {
    return store;
  }
}

}  // namespace lockstep_torch
