// Learning-rate schedules: linear warmup, then cosine (or constant / linear) decay to
// min_lr_ratio * lr by the last step.
#pragma once
#include <cstdint>
#include <string>

#include "gasloc/core/choice.hpp"

namespace gasloc::optim {

// The decays after warmup (optim.decay).
const config::Choices& decay_choices();

struct Schedule {
  double lr = 3e-3;            // peak learning rate
  int64_t warmup_steps = 0;    // linear ramp from lr/warmup to lr
  int64_t total_steps = 1;     // step count at which the decay ends
  double min_lr_ratio = 0.1;   // final lr = min_lr_ratio * lr
  config::Choice decay{decay_choices(), "cosine"};

  // Learning rate for step k (1-based: the k-th optimizer step).
  double at(int64_t k) const;
};

}  // namespace gasloc::optim
