#include "gasloc/algo/outer.hpp"

#include <torch/torch.h>

namespace gasloc::algo {

OuterNesterov::OuterNesterov(const torch::Tensor& theta0, OuterOptions opts) : opts_(opts) {
  theta_ = theta0.detach().clone();
  if (opts_.momentum != 0.0) b_ = torch::zeros_like(theta_);
}

torch::Tensor OuterNesterov::propose(const torch::Tensor& target, torch::Tensor& b_next) const {
  torch::NoGradGuard no_grad;
  auto delta = theta_ - target;
  if (opts_.momentum != 0.0) {
    b_next = b_.mul(opts_.momentum).add_(delta);
    delta.add_(b_next, opts_.momentum);  // Delta + mu * b
  }
  return theta_.sub(delta, opts_.lr);
}

void OuterNesterov::commit(const torch::Tensor& theta, const torch::Tensor& b_next) {
  torch::NoGradGuard no_grad;
  theta_.copy_(theta);
  if (opts_.momentum != 0.0) b_.copy_(b_next);
}

void OuterNesterov::step(const torch::Tensor& mixed) {
  torch::Tensor b_next;
  commit(propose(mixed, b_next), b_next);
}

}  // namespace gasloc::algo
