// One worker: a model replica with its flat parameters, inner optimizer, data sampler and
// synchronizer. The worker loop is algorithm-agnostic: each inner step it samples a batch,
// computes the loss and gradients, lets the synchronizer act, clips, steps the optimizer, and
// lets the synchronizer end a round when it wants to.
#pragma once
#include <torch/types.h>

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "gasloc/algo/membership.hpp"
#include "gasloc/algo/synchronizer.hpp"
#include "gasloc/comm/communicator.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/data/sampler.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/optim/optimizer.hpp"
#include "gasloc/optim/schedule.hpp"
#include "gasloc/train/batch_streams.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/job_config.hpp"
#include "gasloc/train/optimizers.hpp"

namespace gasloc::train {

// A worker whose training loss is not finite or far above a uniform guess: thrown before the
// step communicates, so a diverged worker never sends its parameters to a healthy one.
class TrainingDiverged : public Error {
  using Error::Error;
};

struct StepResult {
  double loss = 0.0;       // training loss of this step's batch (before the update)
  double grad_norm = 0.0;  // global gradient norm before clipping
  double lr = 0.0;
  bool round_done = false;  // the synchronizer communicated at this step
  bool computed = true;     // false: skipped by the local-step budget (loss repeats the last one)
  std::optional<algo::View> view_change;  // elastic: the round that ended here lost or gained workers
};

class ComputeGate;

class Worker {
 public:
  Worker(const JobConfig& job, const model::LlamaConfig& model_cfg, const data::Dataset& dataset,
         comm::Communicator& comm, std::unique_ptr<algo::Synchronizer> sync);

  // One inner step. Throws TrainingDiverged (before any communication of the step) when the
  // batch's loss is not finite or exceeds train.divergence_factor * ln(vocab).
  StepResult step();
  // Mean validation loss over the batches at the optimizer's evaluation point (GPA: x), always
  // in fp32 so that runs at different training dtypes are compared on the same footing. Throws
  // if another thread is inside step() on this worker.
  double evaluate(const std::vector<data::Batch>& batches);

  // Inner steps so far, skipped ones included (the schedule's position), and those computed.
  int64_t steps_done() const { return step_; }
  int64_t local_steps_done() const { return optimizer_->steps(); }
  // This worker's clock (virtual in the in-process cluster).
  double clock() const { return comm_.now(); }
  // Wall seconds this worker spent computing (batch, forward, backward, optimizer step) since it
  // was made: its compute time where the clock is real, for the utilization of process ranks.
  double compute_wall_s() const { return compute_wall_s_; }
  // Evaluation mode for a scope: optim::EvalScope scope(&worker.optimizer()).
  optim::Optimizer& optimizer() { return *optimizer_; }
  // Bytes kept between steps by the inner optimizer and by the synchronizer (from the tensors
  // they hold), for the memory report in run.json.
  int64_t optimizer_state_bytes() const { return optimizer_->state_bytes(); }
  int64_t sync_state_bytes() const;
  int64_t numel() const { return params_.numel(); }
  model::Llama& model() { return model_; }
  FlatParams& params() { return params_; }
  torch::Device device() const { return device_; }

  // Everything needed to continue bit-exactly, taken at the evaluation point (so a checkpoint's
  // "params" are the model to evaluate or export). Taken inside an EvalScope the tensors alias the
  // worker's buffers and are valid until the scope ends; otherwise they are copies.
  StateDict state();
  // Throws CheckpointError if the state does not fit this worker (other model shape, optimizer).
  void load_state(const StateDict& state);
  // The algorithm, for what it says of an elastic run (its view, who holds a model).
  const algo::Synchronizer& sync() const { return *sync_; }
  // Elastic runs: the state transfer after a round with joiners (algo::HealPlan). A donor sends
  // its whole state (model, inner and outer optimizer state, counters, data position) and a
  // joiner takes it, keeping only its own random generator: its data stream stays its own,
  // advanced to the donor's position. False when a joiner got nothing (its donor died at it).
  bool heal(const algo::HealPlan& plan);
  // In-process workers beyond the cores take turns at them (compute_gate.hpp): each step's compute,
  // each evaluation and each checkpoint's write then wait for a slot of `gate` (null: no gate).
  // The bits do not change.
  void share_cores(ComputeGate* gate) { gate_ = gate; }
  ComputeGate* shared_cores() const { return gate_; }

 private:
  // Elastic runs: after a round ended, its joiners' state transfer and its view, if it changed.
  void after_round(StepResult& r);
  // Throws TrainingDiverged: `what`, with the sender of a message that stood out in the mix just
  // before (Synchronizer::message_suspect), else the step size's hint.
  [[noreturn]] void throw_diverged(int64_t step, const std::string& what) const;
  // At train.steps: lands an overlapped round still in flight (Synchronizer::flush).
  void finish_if_last(int64_t step, StepResult& r);

  JobConfig job_;
  model::LlamaConfig model_cfg_;
  comm::Communicator& comm_;
  std::unique_ptr<algo::Synchronizer> sync_;
  torch::Device device_;
  model::Llama model_{nullptr};
  FlatParams params_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  optim::Schedule schedule_;
  std::unique_ptr<data::WindowSampler> sampler_;
  std::unique_ptr<BatchStreams> streams_;  // train.streams > 1: the batch's row groups on threads of their own
  std::atomic<bool> stepping_{false};
  ComputeGate* gate_ = nullptr;
  int64_t step_ = 0;
  double last_loss_ = 0.0;
  int64_t merged_at_ = -1;  // the step at which the last round ended (-1: none yet)
  double max_loss_ = 0.0;  // 0: no limit
  double compute_wall_s_ = 0.0;
};

// RAII: enables autocast to `dtype` on `device` for the current thread (no-op for fp32).
class AutocastGuard {
 public:
  AutocastGuard(torch::Device device, const std::string& dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_ = false;
  bool cuda_ = false;
  bool prev_ = false;
};

}  // namespace gasloc::train
