// The inner optimizer of a worker, over one flat parameter buffer (AdamW, GPA, Schedule-Free).
//
// Training point and evaluation point. AdamW evaluates the parameters it trains. GPA and
// Schedule-Free take gradients at y but their model is the running average x. The flat buffer
// holds y while training; enter_eval() switches it to x and leave_eval() back to y. Everything
// that reads or replaces the model (evaluation, checkpoints, exports, parameters exchanged by a
// synchronizer) does so in evaluation mode, through an EvalScope. Switches nest: only the
// outermost one does work, so a checkpoint inside an evaluation costs one round trip, not two.
// While the buffer holds x, whatever replaces x (an average with other workers) moves the
// optimizer's other sequences with it; when nothing replaced it, leaving evaluation mode restores
// the training state bit for bit (see GPA).
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gasloc/core/flat_params.hpp"

namespace gasloc::optim {

using TensorMap = std::map<std::string, torch::Tensor>;

class Optimizer {
 public:
  explicit Optimizer(FlatParams& params) : params_(params) {}
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual std::string name() const = 0;
  // One step with learning rate `lr` from the gradients in params.grad(). Throws in evaluation
  // mode: the buffer then holds x, and stepping it would corrupt the run.
  void step(double lr);
  int64_t steps() const { return step_; }

  void enter_eval();
  void leave_eval();
  bool in_eval() const { return eval_depth_ > 0; }

  // Checkpoint state (keys without the caller's "optim." prefix), taken in evaluation mode:
  // with the buffer holding x, these tensors are everything needed to continue bit-exactly.
  TensorMap state();
  // Restores state() output, the buffer already holding the checkpoint's parameters (x); the
  // optimizer is in training mode after it. Throws CheckpointError if the keys are not this
  // optimizer's.
  void load_state(const TensorMap& state);
  // Bytes of the parameter-sized buffers this optimizer keeps between steps (moments, z).
  int64_t state_bytes() const;

 protected:
  virtual void update(double lr) = 0;
  virtual void to_eval() {}
  virtual void to_train() {}
  // The parameter-sized buffers kept between steps, named as in checkpoints; anything else a
  // checkpoint needs goes in extra_state (load_extra_state may rewrite the parameters: GPA's y).
  virtual std::vector<std::pair<std::string, torch::Tensor*>> buffers() = 0;
  virtual TensorMap extra_state() const { return {}; }
  virtual void load_extra_state(const TensorMap&) {}
  virtual std::vector<std::string> extra_keys() const { return {}; }

  FlatParams& params_;
  int64_t step_ = 0;

 private:
  int eval_depth_ = 0;
};

// RAII evaluation mode; a null optimizer (a synchronizer used alone, in tests) is a no-op.
class EvalScope {
 public:
  explicit EvalScope(Optimizer* opt) : opt_(opt) {
    if (opt_) opt_->enter_eval();
  }
  ~EvalScope() {
    if (opt_) opt_->leave_eval();
  }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  Optimizer* opt_;
};

// Scales gradients so that their global L2 norm is at most max_norm (no-op if max_norm <= 0).
// Returns the norm before clipping.
double clip_grad_norm(torch::Tensor& flat_grad, double max_norm);

}  // namespace gasloc::optim
