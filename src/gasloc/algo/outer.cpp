#include "gasloc/algo/outer.hpp"

#include <torch/torch.h>

namespace gasloc::algo {

OuterNesterov::OuterNesterov(const torch::Tensor& theta0, OuterOptions opts) : opts_(opts) {
  theta_ = theta0.detach().clone();
  if (opts_.momentum != 0.0) b_ = torch::zeros_like(theta_);
}

void OuterNesterov::step(const torch::Tensor& mixed) {
  torch::NoGradGuard no_grad;
  auto delta = theta_ - mixed;
  if (opts_.momentum != 0.0) {
    b_.mul_(opts_.momentum).add_(delta);
    delta.add_(b_, opts_.momentum);  // Delta + mu * b
  }
  theta_.sub_(delta, opts_.lr);
}

}  // namespace gasloc::algo
