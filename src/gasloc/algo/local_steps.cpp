#include "gasloc/algo/local_steps.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "gasloc/core/error.hpp"

#include "gasloc/topology/spectral.hpp"

namespace gasloc::algo {

LocalSteps::LocalSteps(int64_t H, comm::NetworkModel model, std::optional<topology::Topology> topo, int world,
                       int64_t overlap_steps)
    : H_(H), model_(std::move(model)), world_(world), overlap_(overlap_steps) {
  model_->validate(world);
  if (topo && !topo->is_all_reduce()) topo_ = std::move(topo);
}

double LocalSteps::exchange_seconds(int rank, int64_t round, int64_t actual_bytes) const {
  if (!model_ || world_ == 1) return 0.0;
  const auto& m = *model_;
  const double P = static_cast<double>(m.message_bytes(actual_bytes));
  if (!topo_) {
    std::vector<int> everyone(static_cast<size_t>(world_));
    for (int r = 0; r < world_; ++r) everyone[r] = r;
    return comm::members_allreduce_seconds(m, P, everyone);
  }
  // Transfers to all neighbours run at once; the worker is done when the slowest one is.
  const auto peers = topo_->peers(rank, round);
  double c = 0.0;
  for (int j : peers) {
    const int k_j = static_cast<int>(topo_->peers(j, round).size());
    const int k_i = static_cast<int>(peers.size());
    const double cap = m.link_cap(rank, j);  // as comm::exchange_clocks prices the link
    c = std::max(c, comm::pair_exchange_seconds(P, std::min(m.bandwidth(rank), cap * k_i), std::min(m.bandwidth(j), cap * k_j),
                                                k_i, k_j, m.link_latency(rank, j)));
  }
  return c;
}

double LocalSteps::round_seconds(int64_t actual_bytes) const {
  if (!model_) return 0.0;
  const auto& m = *model_;
  const double P = static_cast<double>(m.message_bytes(actual_bytes));
  double c_ref = 0.0;
  if (world_ > 1) {
    if (!topo_) {
      c_ref = comm::allreduce_seconds(m, P, world_, m.bandwidth_Bps);
    } else {
      const int k = topology::max_degree(*topo_);
      if (k > 0) c_ref = comm::pair_exchange_seconds(P, m.bandwidth_Bps, m.bandwidth_Bps, k, k, m.latency_s);
    }
  }
  const double hidden = static_cast<double>(overlap_) * m.step_time_s;
  return static_cast<double>(H_) * m.step_time_s + std::max(0.0, c_ref - hidden);
}

int64_t LocalSteps::steps(int rank, int64_t round, int64_t actual_bytes, bool* clamped) const {
  if (clamped) *clamped = false;
  if (!model_ || model_->step_time(rank) <= 0.0) return H_;
  const double s = model_->step_time(rank);
  const double budget =
      round_seconds(actual_bytes) - std::max(0.0, exchange_seconds(rank, round, actual_bytes) - static_cast<double>(overlap_) * s);
  // The small slack keeps an unimpeded worker's (H s + C - C) / s from rounding down to H - 1.
  const double fit = std::floor(budget / s + 1e-9);
  if (overlap_ > 0 && fit < static_cast<double>(overlap_ + 1))
    throw ConfigError(fmt::format("config key 'algo.overlap_steps': worker {}'s time budget gives it {} local steps in "
                                  "round {}, fewer than algo.overlap_steps + 1 = {} (its exchange would still be in "
                                  "flight at its next send)",
                                  rank, std::max(0.0, fit), round, overlap_ + 1),
                      "lower algo.overlap_steps, raise algo.H, or set algo.h_policy = \"fixed\"");
  if (fit < 1.0) {
    if (clamped) *clamped = true;
    return 1;
  }
  return std::min<int64_t>(H_, static_cast<int64_t>(fit));
}

}  // namespace gasloc::algo
