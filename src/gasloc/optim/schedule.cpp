#include "gasloc/optim/schedule.hpp"

#include <algorithm>
#include <cmath>

namespace gasloc::optim {

const config::Choices& decay_choices() {
  static const config::Choices c("decay", {{"cosine", "half a cosine down to min_lr_ratio * lr"}, {"linear", "a straight line down to it"}, {"constant", "none"}});
  return c;
}

double Schedule::at(int64_t k) const {
  if (warmup_steps > 0 && k <= warmup_steps) return lr * static_cast<double>(k) / static_cast<double>(warmup_steps);
  if (decay == "constant") return lr;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double progress = std::clamp(static_cast<double>(k - warmup_steps) / span, 0.0, 1.0);
  const double min_lr = min_lr_ratio * lr;
  if (decay == "linear") return lr - (lr - min_lr) * progress;
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace gasloc::optim
