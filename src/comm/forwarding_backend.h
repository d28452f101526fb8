// A backend that hands every operation to another one. A backend built
// over another (hier over its flat tcp mesh, staging over a host backend)
// derives from it and overrides only what it does differently, so the
// list of operations is written out once here rather than in every
// wrapper. One trap: Backend::allreduce_into (copy, then this->allreduce)
// is forwarded too, so a wrapper that overrides allreduce overrides
// allreduce_into as well (hier does), or the out-of-place form would skip it.
//
// Thread-safety: as Backend; the wrapped backend is used from the same thread.
#pragma once

#include "comm/backend.h"

namespace lockstep {

class ForwardingBackend : public Backend {
 public:
  std::string_view name() const override { return inner_->name(); }
  void allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) override {
    inner_->allreduce(op, data, reduce_op);
  }
  void allreduce_into(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) override {
    inner_->allreduce_into(op, input, output, reduce_op);
  }
  void broadcast(const OpContext& op, Buffer data, int root) override { inner_->broadcast(op, data, root); }
  void allgather(const OpContext& op, ConstBuffer input, Buffer output) override {
    inner_->allgather(op, input, output);
  }
  void reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) override {
    inner_->reduce_scatter(op, input, output, reduce_op);
  }
  void reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) override {
    inner_->reduce(op, data, root, reduce_op);
  }
  void barrier(const OpContext& op) override { inner_->barrier(op); }
  void gather(const OpContext& op, ConstBuffer input, Buffer output, int root) override {
    inner_->gather(op, input, output, root);
  }
  void scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) override {
    inner_->scatter(op, input, output, root);
  }
  void all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts) override {
    inner_->all_to_all(op, input, output, counts);
  }
  void allgather_v(const OpContext& op, ConstBuffer input, Buffer output,
                   const std::vector<std::size_t>& counts) override {
    inner_->allgather_v(op, input, output, counts);
  }
  void send(const OpContext& op, ConstBuffer data, int dst, int tag) override { inner_->send(op, data, dst, tag); }
  void recv(const OpContext& op, Buffer data, int src, int tag) override { inner_->recv(op, data, src, tag); }
  int recv_any(const OpContext& op, Buffer data, int tag) override { return inner_->recv_any(op, data, tag); }
  std::string why_no_recv_any() const override { return inner_->why_no_recv_any(); }
  bool supports(Collective c, DType t, ReduceOp o) const override { return inner_->supports(c, t, o); }
  bool handles_device_memory() const override { return inner_->handles_device_memory(); }
  std::size_t inline_max_bytes() const override { return inner_->inline_max_bytes(); }
  void shutdown(Deadline deadline) override { inner_->shutdown(deadline); }
  std::shared_ptr<std::byte[]> allocate_shared(std::size_t bytes, Deadline deadline) override {
    return inner_->allocate_shared(bytes, deadline);
  }

 protected:
  // `inner` outlives this backend; it may be a member of the derived class
  // (only its address is taken here, before it is constructed).
  explicit ForwardingBackend(Backend& inner) : inner_(&inner) {}
  Backend& inner() const { return *inner_; }

 private:
  Backend* inner_;
};

}  // namespace lockstep
