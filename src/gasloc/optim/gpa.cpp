#include "gasloc/optim/gpa.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "gasloc/core/config.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::optim {

void GpaOptions::validate() const {
  config::require(mu_y > 0 && mu_y <= 1, "optim.mu_y", fmt::format("must be in (0, 1], got {}", mu_y));
  config::require(mu_x >= 0 && mu_x <= 1, "optim.mu_x", fmt::format("must be in [0, 1], got {}", mu_x));
}

Gpa::Gpa(FlatParams& params, GpaOptions opts)
    : Optimizer(params), opts_(opts), moments_(params.data(), opts.adam), z_(params.data().clone()) {
  if (opts_.schedule_free) {
    moments_.m = torch::Tensor();  // no first moment: beta1 is the interpolation weight
    if (!(opts_.adam.beta1 > 0.0 && opts_.adam.beta1 <= 1.0))
      throw ConfigError("Schedule-Free's interpolation weight beta1 must be in (0, 1], got " + std::to_string(opts_.adam.beta1),
                        "set optim.beta1 (the reference's default is 0.9)");
    return;
  }
  opts_.validate();
}

void Gpa::update_schedule_free(double lr_sched) {
  auto& y = params_.data();
  const auto& g = params_.grad();
  const double b1 = opts_.adam.beta1, b2 = opts_.adam.beta2;
  auto& v = moments_.v;
  v.mul_(b2).addcmul_(g, g, 1.0 - b2);
  const double lr = lr_sched * std::sqrt(1.0 - std::pow(b2, static_cast<double>(step_)));
  lr_max_ = std::max(lr_max_, lr);
  const double w = lr_max_ * lr_max_;
  weight_sum_ += w;
  const double c = weight_sum_ > 0.0 ? w / weight_sum_ : 0.0;
  last_c_ = c;
  auto d = g / (v.sqrt().add_(opts_.adam.eps));
  const int64_t D = params_.decay_numel();
  const double wd = opts_.adam.weight_decay;
  if (wd != 0.0 && D > 0) {
    if (opts_.decay_on_y) {
      d.narrow(0, 0, D).add_(y.narrow(0, 0, D), wd);
    } else {
      auto zd = z_.narrow(0, 0, D);
      y.narrow(0, 0, D).add_(zd, -(1.0 - b1) * lr * wd);
      zd.mul_(1.0 - lr * wd);
    }
  }
  y.lerp_(z_, c);
  y.add_(d, lr * (b1 * (1.0 - c) - 1.0));
  z_.add_(d, -lr);
}

void Gpa::update(double lr) {
  if (opts_.schedule_free) return update_schedule_free(lr);
  auto& y = params_.data();
  moments_.update(params_.grad());
  auto d = moments_.direction(step_);
  const int64_t D = params_.decay_numel();
  const double wd = opts_.adam.weight_decay;
  if (wd != 0.0 && D > 0) {
    if (opts_.decay_on_y) d.narrow(0, 0, D).add_(y.narrow(0, 0, D), wd);
    else z_.narrow(0, 0, D).mul_(1.0 - lr * wd);
  }
  const double c = 1.0 - opts_.mu_x;
  last_c_ = c;
  y.lerp_(z_, c);
  y.add_(d, lr * (opts_.mu_y * (1.0 - c) - 1.0));
  z_.add_(d, -lr);
}

// One expression for x, so that to_train recomputes the very bits to_eval wrote.
static torch::Tensor eval_point(const torch::Tensor& y, const torch::Tensor& z, double mu_y) {
  return y.lerp(z, 1.0 - 1.0 / mu_y);
}

void Gpa::to_eval() {
  auto& buf = params_.data();
  y_saved_ = buf.clone();
  buf.copy_(eval_point(y_saved_, z_, interpolation()));
}

void Gpa::to_train() {
  auto& buf = params_.data();
  // delta = x now - x at the switch: zero unless a synchronizer replaced the model.
  auto delta = buf.sub_(eval_point(y_saved_, z_, interpolation()));
  z_.add_(delta);
  delta.add_(y_saved_);  // the buffer becomes y + delta
  y_saved_ = torch::Tensor();
}

std::vector<std::pair<std::string, torch::Tensor*>> Gpa::buffers() {
  if (opts_.schedule_free) return {{"exp_avg_sq", &moments_.v}, {"z", &z_}};
  return {{"exp_avg", &moments_.m}, {"exp_avg_sq", &moments_.v}, {"z", &z_}};
}

TensorMap Gpa::extra_state() const {
  TensorMap s = {{"y", y_saved_}};
  if (opts_.schedule_free) {
    s["sf_lr_max"] = torch::tensor(lr_max_, torch::kFloat64);
    s["sf_weight_sum"] = torch::tensor(weight_sum_, torch::kFloat64);
  }
  return s;
}

void Gpa::load_extra_state(const TensorMap& s) {
  const auto& y = s.at("y");
  if (y.numel() != params_.numel())
    throw CheckpointError("optimizer tensor 'optim.y' has " + std::to_string(y.numel()) + " elements, expected " +
                              std::to_string(params_.numel()),
                          "the checkpoint is from a different model shape");
  params_.data().copy_(y);  // the exact training point
  if (!opts_.schedule_free) return;
  lr_max_ = s.at("sf_lr_max").item<double>();
  weight_sum_ = s.at("sf_weight_sum").item<double>();
}

std::vector<std::string> Gpa::extra_keys() const {
  if (!opts_.schedule_free) return {"y"};
  return {"y", "sf_lr_max", "sf_weight_sum"};
}

}  // namespace gasloc::optim
