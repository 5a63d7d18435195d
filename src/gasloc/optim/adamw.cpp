#include "gasloc/optim/adamw.hpp"

#include <torch/torch.h>

#include <cmath>

namespace gasloc::optim {

AdamMoments::AdamMoments(const torch::Tensor& like, const AdamWOptions& o)
    : m(torch::zeros_like(like)), v(torch::zeros_like(like)), o_(o) {}

void AdamMoments::update(const torch::Tensor& g) {
  m.mul_(o_.beta1).add_(g, 1.0 - o_.beta1);
  v.mul_(o_.beta2).addcmul_(g, g, 1.0 - o_.beta2);
}

torch::Tensor AdamMoments::direction(int64_t k) const {
  const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(k));
  const double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(k));
  auto d = (v.sqrt() / std::sqrt(bc2)).add_(o_.eps);  // the denominator, then d in place
  return d.reciprocal_().mul_(m).div_(bc1);
}

void AdamMoments::apply(torch::Tensor& y, int64_t k, double lr) const {
  const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(k));
  const double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(k));
  // Same operation order as torch.optim.AdamW's single-tensor path.
  auto denom = (v.sqrt() / std::sqrt(bc2)).add_(o_.eps);
  y.addcdiv_(m, denom, -lr / bc1);
}

AdamW::AdamW(FlatParams& params, AdamWOptions opts) : Optimizer(params), opts_(opts), moments_(params.data(), opts) {}

void AdamW::update(double lr) {
  auto& p = params_.data();
  if (opts_.weight_decay != 0.0 && params_.decay_numel() > 0)
    p.narrow(0, 0, params_.decay_numel()).mul_(1.0 - lr * opts_.weight_decay);
  moments_.update(params_.grad());
  moments_.apply(p, step_, lr);
}

}  // namespace gasloc::optim
