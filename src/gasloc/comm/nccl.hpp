// The NCCL backend: one rank per process and GPU, over c10d's ProcessGroupNCCL with the same
// rendezvous as Gloo (rendezvous.hpp). Built only against a CUDA LibTorch 2.x
// (GASLOC_WITH_NCCL, see CMakeLists.txt); the CPU build leaves nccl.cpp out.
//
// Rank r uses GPU LOCAL_RANK (or RANK) modulo the visible device count. Tensors may live on that
// GPU (no copy) or on the CPU (staged through the GPU and copied back: handy for checks, slower).
// Semantics, errors and stats are those of GlooCommunicator: all_reduce_mean = NCCL sum / world
// (NCCL's order, so fp32 rounding differs from the rank-order reference; integer-valued data is
// exact); exchange sends a (numel, dtype) header first and reports mismatched sizes; every wait
// has the timeout (c10d's blocking wait is switched on), and a failed group is unusable.
//
// NCCL itself refuses two ranks on one GPU ("Duplicate GPU detected"): a real run needs one GPU
// per rank.
#pragma once
#include <memory>

#include "gasloc/comm/communicator.hpp"
#include "gasloc/comm/rendezvous.hpp"

namespace gasloc::comm {

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const GlooOptions& o);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int world() const override;
  void all_reduce_mean(torch::Tensor& t) override;
  void exchange(const std::vector<int>& peers, const torch::Tensor& send, std::vector<torch::Tensor>& recv) override;
  void broadcast(torch::Tensor& t, int root) override;
  void barrier() override;
  double now() const override;
  void compute(int64_t) override {}
  CommStats stats() const override;
  // The GPU this rank uses.
  torch::Device device() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gasloc::comm
