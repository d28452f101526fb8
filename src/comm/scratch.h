// A grow-only byte buffer reused across operations, so steady-state
// collectives allocate nothing. Owned by one backend; not thread-safe.
#pragma once

#include <cstddef>
#include <memory>

namespace lockstep {

class Scratch {
 public:
  // At least `bytes` bytes, 64-byte aligned; contents are not preserved
  // across growth.
  std::byte* get(std::size_t bytes) {
    if (bytes > capacity_) {
      capacity_ = std::max(bytes, capacity_ * 2);
      data_.reset(static_cast<std::byte*>(::operator new[](capacity_, std::align_val_t(64))));
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t capacity_ = 0;
};

}  // namespace lockstep
