// The algorithms that communicate at every step: All-Reduce AdamW (gradients) and DAdam
// (parameters), docs/design.md section 3.
#pragma once
#include "gasloc/algo/mix_sync.hpp"
#include "gasloc/algo/synchronizer.hpp"
#include "gasloc/topology/topology.hpp"

namespace gasloc::algo {

// What the algorithms that communicate at every step share: step k is round k - 1, taken part in
// from after_backward; a step a worker does not compute (dead or joining, in an elastic run)
// stands by in its round from after_step.
class StepSync : public MixSync {
 public:
  using MixSync::MixSync;
  bool wants_compute(int64_t step, comm::Communicator& comm) override { return mix().computes(comm.rank(), step - 1); }
  StateDict state() const override { return mix().state(); }
  void load_state(const StateDict& s) override { mix().load_state(s); }

 protected:
  int64_t current_round() const override { return steps_; }
  // after_backward's round: true when this worker stood by in it instead of mixing.
  bool enter_round(int64_t step, FlatParams& params, comm::Communicator& comm);
  // after_step: stands by if the step was not computed, and ends its round.
  void end_step(int64_t step, FlatParams& params, comm::Communicator& comm);

 private:
  int64_t steps_ = 0;     // steps done: the round of the next step
  int64_t handled_ = -1;  // the last round this worker took part in
};

// All-Reduce AdamW (DDP): gradients are averaged every step, so every worker takes the same
// AdamW step; equals one worker with n times the batch.
// In an elastic run each step is a round: the gradients are averaged over its members, retried
// over the survivors when one dies there, and a joiner takes a donor's state after the step.
class AllReduceSync final : public StepSync {
 public:
  explicit AllReduceSync(int world = 1, const Membership* membership = nullptr);
  std::string name() const override { return "allreduce"; }
  void after_backward(int64_t step, FlatParams& params, comm::Communicator& comm) override;
  bool after_step(int64_t step, FlatParams& params, comm::Communicator& comm) override {
    end_step(step, params, comm);
    return false;
  }
};

// DAdam, combine-then-adapt: every step x_i <- sum_j W_ij x_j - lr * d_i, with d_i computed
// from the gradient at the pre-mixing x_i. The mixing happens between backward and the AdamW
// step; Adam state is never exchanged.
// In an elastic run each step is a round over its view (round t = step - 1).
class DAdamSync final : public StepSync {
 public:
  explicit DAdamSync(topology::Topology topo, torch::ScalarType wire = torch::kFloat, const Membership* membership = nullptr)
      : StepSync(MixOptions{.topology = std::move(topo), .membership = membership}), wire_(wire) {}
  std::string name() const override { return "dadam"; }
  void after_backward(int64_t step, FlatParams& params, comm::Communicator& comm) override;
  bool after_step(int64_t step, FlatParams& params, comm::Communicator& comm) override {
    end_step(step, params, comm);
    return true;
  }

 private:
  torch::ScalarType wire_;
};

}  // namespace gasloc::algo
