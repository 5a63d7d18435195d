#include "gasloc/optim/optimizer.hpp"

#include <torch/torch.h>

#include <set>

#include "gasloc/core/error.hpp"

namespace gasloc::optim {

void Optimizer::step(double lr) {
  if (in_eval())
    throw Error(name() + ": training step requested while the parameters hold the evaluation point",
                "leave evaluation mode (end the EvalScope) before stepping");
  ++step_;
  torch::NoGradGuard no_grad;
  update(lr);
}

void Optimizer::enter_eval() {
  if (eval_depth_++ == 0) {
    torch::NoGradGuard no_grad;
    to_eval();
  }
}

void Optimizer::leave_eval() {
  TORCH_CHECK(eval_depth_ > 0, "leave_eval without enter_eval");
  if (--eval_depth_ == 0) {
    torch::NoGradGuard no_grad;
    to_train();
  }
}

TensorMap Optimizer::state() {
  if (!in_eval())
    throw Error(name() + ": checkpoint state requested in training mode", "take it inside an EvalScope");
  TensorMap s = extra_state();
  for (auto& [key, t] : buffers()) s[key] = *t;
  s["step"] = torch::tensor(step_, torch::kInt64);
  return s;
}

void Optimizer::load_state(const TensorMap& s) {
  TORCH_CHECK(!in_eval(), "load_state in evaluation mode");
  std::set<std::string> expected = {"step"};
  for (auto& [key, t] : buffers()) expected.insert(key);
  for (const auto& k : extra_keys()) expected.insert(k);
  for (const auto& [k, t] : s)
    if (!expected.count(k))
      throw CheckpointError("the checkpoint's optimizer state has 'optim." + k + "', which " + name() + " does not use",
                            "it was written by another optimizer; resume with the optim.name it was trained with");
  for (const auto& k : expected)
    if (!s.count(k))
      throw CheckpointError("the checkpoint lacks 'optim." + k + "', which " + name() + " needs",
                            "it was written by another optimizer; resume with the optim.name it was trained with");
  torch::NoGradGuard no_grad;
  for (auto& [key, t] : buffers()) {
    const auto& src = s.at(key);
    if (src.numel() != t->numel())
      throw CheckpointError("optimizer buffer 'optim." + key + "' has " + std::to_string(src.numel()) +
                                " elements, expected " + std::to_string(t->numel()),
                            "the checkpoint is from a different model shape");
    t->copy_(src);
  }
  load_extra_state(s);
  step_ = s.at("step").item<int64_t>();
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (auto& [key, t] : const_cast<Optimizer*>(this)->buffers()) bytes += t->numel() * static_cast<int64_t>(t->element_size());
  return bytes;
}

double clip_grad_norm(torch::Tensor& flat_grad, double max_norm) {
  torch::NoGradGuard no_grad;
  const double norm = flat_grad.norm().item<double>();
  if (max_norm > 0.0 && norm > max_norm) flat_grad.mul_(max_norm / (norm + 1e-6));
  return norm;
}

}  // namespace gasloc::optim
