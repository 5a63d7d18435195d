// Fault injection and the suspects it leaves; see poison.hpp.
#include "gasloc/algo/mix/poison.hpp"

#include <torch/torch.h>

#include <algorithm>

namespace gasloc::algo {

namespace {
// The largest |value| of t: two reductions, no copy of t.
double max_abs(const torch::Tensor& t) {
  const auto [lo, hi] = torch::aminmax(t);
  return std::max(-lo.item<double>(), hi.item<double>());
}
}  // namespace

torch::Tensor MessageWatch::sent(const torch::Tensor& x, int me, int64_t t) const {
  const double pf = poison_factor(poisons_, me, t);
  return pf == 1.0 ? x : x * pf;
}

void MessageWatch::note(int64_t t, const std::vector<int>& senders, const torch::Tensor& x, const std::vector<torch::Tensor>& recv) {
  MessageSuspect found;
  const double own = recv.empty() || !x.defined() ? 0.0 : max_abs(x);
  for (size_t k = 0; k < senders.size(); ++k) {
    MessageSuspect s{senders[k], t, 0.0, poison_factor(poisons_, senders[k], t)};
    if (k < recv.size() && recv[k].defined() && own > 0) s.ratio = max_abs(recv[k]) / own;
    const bool stands_out = s.poison != 1.0 || s.ratio >= kOutlierRatio;
    if (stands_out && (found.sender < 0 || s.ratio > found.ratio)) found = s;
  }
  last_ = found;
}

std::optional<MessageSuspect> MessageWatch::suspect() const {
  if (last_.sender < 0) return std::nullopt;
  return last_;
}

}  // namespace gasloc::algo
