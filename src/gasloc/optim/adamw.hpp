// AdamW over a FlatParams buffer: one fused update for the whole model. Numerically the same
// update as torch.optim.AdamW (decoupled decay p *= 1 - lr*wd before the Adam step), with weight
// decay on the matrices only (the flat buffer's decay prefix).
#pragma once
#include <torch/types.h>

#include <cstdint>

#include "gasloc/core/flat_params.hpp"

namespace gasloc::optim {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

class AdamW {
 public:
  AdamW(FlatParams& params, AdamWOptions opts);
  // One step with learning rate `lr` using the gradients in params.grad().
  void step(double lr);
  int64_t steps() const { return step_; }
  const AdamWOptions& options() const { return opts_; }
  // State for checkpoints: first and second moments [N] and the step count.
  torch::Tensor& exp_avg() { return m_; }
  torch::Tensor& exp_avg_sq() { return v_; }
  void set_steps(int64_t k) { step_ = k; }
  // Bytes of optimizer state held (moments), for memory reports.
  int64_t state_bytes() const;

 private:
  FlatParams& params_;
  AdamWOptions opts_;
  torch::Tensor m_, v_;
  int64_t step_ = 0;
};

// Scales gradients so that their global L2 norm is at most max_norm (no-op if max_norm <= 0).
// Returns the norm before clipping.
double clip_grad_norm(torch::Tensor& flat_grad, double max_norm);

}  // namespace gasloc::optim
