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
#include "gasloc/comm/communicator.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/optim/optimizer.hpp"

namespace gasloc::algo {

using StateDict = std::map<std::string, torch::Tensor>;

// A peer whose message in a worker's last mix stood out, which a divergence right after it names
// instead of blaming the step size: faults.poison scaled it, or (gossip) its largest |value| was
// kOutlierRatio or more times the worker's own.
struct MessageSuspect {
  int sender = -1;
  int64_t round = -1;  // the mix's round (dadam: its step - 1)
  double ratio = 0;    // its largest |value| over the receiver's own; 0: not measured (an all-reduce)
  double poison = 1;   // faults.poison's factor on it
};
inline constexpr double kOutlierRatio = 10.0;

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
  // Compressed gossip's modulo codec: the chunks this worker resent in fp32 after a wrap, so far.
  virtual std::optional<int64_t> codec_resends() const { return std::nullopt; }
  // algo.clip_peers: the messages this worker clipped so far, by sender id; nullopt without it.
  virtual std::optional<std::vector<int64_t>> clipped_from() const { return std::nullopt; }
  // algo.clip_peers: the non-finite messages this worker dropped so far, by sender id.
  virtual std::optional<std::vector<int64_t>> dropped_from() const { return std::nullopt; }
  // The peer whose message stood out in this worker's last blocking mix (MessageSuspect), if one did.
  virtual std::optional<MessageSuspect> message_suspect() const { return std::nullopt; }
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
