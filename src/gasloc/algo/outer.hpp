// The outer optimizer shared by DiLoCo and GASLoC: SGD with Nesterov momentum (dampening 0)
// on the pseudo-gradient Delta = theta - m, where m is the (global or gossip) average of the
// workers' live parameters after their local steps:
//   b <- mu * b + Delta;  theta <- theta - eta * (Delta + mu * b)
// mu = 0 skips the momentum buffer (and its memory) entirely.
#pragma once
#include <torch/types.h>

namespace gasloc::algo {

struct OuterOptions {
  double lr = 0.7;        // eta
  double momentum = 0.9;  // mu
};

class OuterNesterov {
 public:
  OuterNesterov(const torch::Tensor& theta0, OuterOptions opts);
  // Applies one outer step towards `mixed` (m). `theta` is updated in place.
  void step(const torch::Tensor& mixed);
  // The step towards `target` without applying it: returns theta's next value and sets
  // `b_next` to the buffer's (undefined when mu = 0). step() is propose() then commit(), so both
  // give the same bits.
  torch::Tensor propose(const torch::Tensor& target, torch::Tensor& b_next) const;
  // Sets theta and b (b_next as propose() gave it).
  void commit(const torch::Tensor& theta, const torch::Tensor& b_next);
  torch::Tensor& theta() { return theta_; }
  const torch::Tensor& theta() const { return theta_; }
  torch::Tensor& momentum() { return b_; }  // undefined when mu = 0
  const torch::Tensor& momentum() const { return b_; }
  const OuterOptions& options() const { return opts_; }

 private:
  OuterOptions opts_;
  torch::Tensor theta_, b_;
};

}  // namespace gasloc::algo
