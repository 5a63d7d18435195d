// AdamW over a FlatParams buffer: one fused update for the whole model. Numerically the same
// update as torch.optim.AdamW (decoupled decay p *= 1 - lr*wd before the Adam step), with weight
// decay on the matrices only (the flat buffer's decay prefix).
#pragma once
#include "gasloc/optim/optimizer.hpp"

namespace gasloc::optim {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // AdamW only: one pass over parameters, gradients and moments per step (fused_adamw_step)
  // instead of eight tensor operations; false runs the reference operations.
  bool fused = true;
};

// The whole AdamW update (decay on the first decay_numel elements, moments, step) in one pass,
// split across LibTorch's threads. Same formula and operation order as the reference; the
// results agree to a few ulps (the compiler may fuse multiply-adds). fp32 contiguous only.
void fused_adamw_step(torch::Tensor& p, const torch::Tensor& g, torch::Tensor& m, torch::Tensor& v, int64_t decay_numel,
                      int64_t k, double lr, const AdamWOptions& o);

// The bias-corrected Adam moments shared by AdamW and GPA.
class AdamMoments {
 public:
  AdamMoments(const torch::Tensor& like, const AdamWOptions& o);
  // Updates m and v with gradient g for step k (1-based).
  void update(const torch::Tensor& g);
  // d = (m / (1 - b1^k)) / (sqrt(v / (1 - b2^k)) + eps), as a new tensor.
  torch::Tensor direction(int64_t k) const;
  // y += scale * d, in torch.optim.AdamW's operation order (for AdamW's bitwise match).
  void apply(torch::Tensor& y, int64_t k, double lr) const;
  torch::Tensor m, v;

 private:
  AdamWOptions o_;
};

class AdamW final : public Optimizer {
 public:
  AdamW(FlatParams& params, AdamWOptions opts);
  std::string name() const override { return "adamw"; }
  const AdamWOptions& options() const { return opts_; }

 protected:
  void update(double lr) override;
  std::vector<std::pair<std::string, torch::Tensor*>> buffers() override {
    return {{"exp_avg", &moments_.m}, {"exp_avg_sq", &moments_.v}};
  }

 private:
  AdamWOptions opts_;
  AdamMoments moments_;
};

}  // namespace gasloc::optim
