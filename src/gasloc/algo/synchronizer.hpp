// A Synchronizer is one distributed algorithm seen from one worker. The worker loop calls it at
// fixed points of every inner step and never knows which algorithm runs:
//
//   grads computed -> after_backward()  (DDP averages gradients here)
//   optimizer step -> after_step()      (DiLoCo/GASLoC end a round here every H_i steps)
//
// Algorithms with state of their own (anchors, outer momentum) expose it for checkpoints.
//
// Parameters travel between workers at the inner optimizer's evaluation point: with GPA or
// Schedule-Free the buffer holds the gradient point y while training, and a synchronizer that
// reads or replaces the parameters does so inside an optim::EvalScope on optimizer(), where the buffer holds
// the model x (optim/optimizer.hpp). Gradients (allreduce) need no switch.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gasloc/algo/membership.hpp"
#include "gasloc/algo/mix/stats.hpp"
#include "gasloc/comm/communicator.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/optim/optimizer.hpp"

namespace gasloc::algo {

using StateDict = std::map<std::string, torch::Tensor>;


class Synchronizer {
 public:
  virtual ~Synchronizer() = default;
  virtual std::string name() const = 0;
  // Once, before the first inner step, with the initial parameters (anchors start there).
  virtual void init(FlatParams& params) {}
  // After gradients of inner step `step` are in params.grad(), before clipping and the step.
  virtual void after_backward(int64_t step, FlatParams& params, comm::Communicator& comm) {}
  // Before inner step `step` (1-based): false skips its computation (no batch, no gradient, no
  // optimizer step, no compute time) while the step still counts towards the round. A worker
  // with a local-step budget H_i < H skips the last H - H_i steps of a round, so that rounds stay
  // aligned across workers (algo.h_policy = "time_budget").
  virtual bool wants_compute(int64_t step, comm::Communicator& comm) { return true; }
  // After the inner optimizer step `step` (1-based), or after a skipped step. Returns true if a
  // communication round finished at this step.
  virtual bool after_step(int64_t step, FlatParams& params, comm::Communicator& comm) = 0;
  // Overlapped rounds (algo.overlap_steps): a round whose exchange is still in flight lands its
  // outer step now, because the run ends at this step. True when one did.
  virtual bool flush(FlatParams& params, comm::Communicator& comm) { return false; }
  // Overlapped rounds: waits for an exchange in flight and keeps its result for the merge at its
  // usual step, so that state() is complete (a checkpoint calls it first).
  virtual void settle(comm::Communicator& comm) {}
  // Elastic runs (docs/design.md section 10). The view of the round that ended at this step, once
  // (the worker then hands the round's joiners their state), and the workers that hold a trained
  // model now (evaluation averages over them); nullopt when the run is not elastic.
  virtual std::optional<View> take_ended_view() { return std::nullopt; }
  virtual std::optional<std::vector<int>> holders() const { return std::nullopt; }
  // What this worker's exchanges counted (MixStats: the modulo codec's resends, algo.clip_peers'
  // clipped and dropped messages by sender, the suspect of its last blocking mix); each field
  // absent where its exchange does not count it.
  virtual MixStats mix_stats() const { return {}; }
  std::optional<int64_t> codec_resends() const { return mix_stats().codec_resends; }
  std::optional<std::vector<int64_t>> clipped_from() const { return mix_stats().clipped_from; }
  std::optional<std::vector<int64_t>> dropped_from() const { return mix_stats().dropped_from; }
  std::optional<MessageSuspect> message_suspect() const { return mix_stats().suspect; }
  // Elastic runs: a donor's state() (keys prefixed by `prefix`) as its joiner receives it: what
  // is the donor's own is removed, what the job shares kept (Mix::keep_for_joiner).
  virtual void keep_for_joiner(StateDict& state, const std::string& prefix, int64_t params) const {}
  // Algorithm state for checkpoints (keys are prefixed by the caller).
  virtual StateDict state() const { return {}; }
  virtual void load_state(const StateDict& state) {}
  // The worker's inner optimizer, for optim::EvalScope; without one the buffer is the model.
  void attach(optim::Optimizer* opt) { opt_ = opt; }

 protected:
  optim::Optimizer* optimizer() const { return opt_; }

 private:
  optim::Optimizer* opt_ = nullptr;
};

// Single worker, no communication: plain training.
class NoSync final : public Synchronizer {
 public:
  std::string name() const override { return "none"; }
  bool after_step(int64_t, FlatParams&, comm::Communicator&) override { return false; }
};

// make_synchronizer (algo_config.hpp) builds the one named by algo.name.

}  // namespace gasloc::algo
