#include "gasloc/optim/adamw.hpp"

#include <torch/torch.h>

#include <cmath>

namespace gasloc::optim {

AdamW::AdamW(FlatParams& params, AdamWOptions opts) : params_(params), opts_(opts) {
  m_ = torch::zeros_like(params_.data());
  v_ = torch::zeros_like(params_.data());
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++step_;
  auto& p = params_.data();
  const auto& g = params_.grad();
  if (opts_.weight_decay != 0.0 && params_.decay_numel() > 0)
    p.narrow(0, 0, params_.decay_numel()).mul_(1.0 - lr * opts_.weight_decay);
  m_.mul_(opts_.beta1).add_(g, 1.0 - opts_.beta1);
  v_.mul_(opts_.beta2).addcmul_(g, g, 1.0 - opts_.beta2);
  const double bc1 = 1.0 - std::pow(opts_.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(opts_.beta2, static_cast<double>(step_));
  // Same operation order as torch.optim.AdamW's single-tensor path.
  auto denom = (v_.sqrt() / std::sqrt(bc2)).add_(opts_.eps);
  p.addcdiv_(m_, denom, -lr / bc1);
}

int64_t AdamW::state_bytes() const { return (m_.numel() + v_.numel()) * static_cast<int64_t>(m_.element_size()); }

double clip_grad_norm(torch::Tensor& flat_grad, double max_norm) {
  torch::NoGradGuard no_grad;
  const double norm = flat_grad.norm().item<double>();
  if (max_norm > 0.0 && norm > max_norm) flat_grad.mul_(max_norm / (norm + 1e-6));
  return norm;
}

}  // namespace gasloc::optim
