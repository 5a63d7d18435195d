// How many local steps H_i worker i takes in round t (docs/design.md section 5).
//
//   fixed:        H everywhere.
//   time_budget:  H_i = clamp(floor((R - C_i,t) / s_i), 1, H), R = H * s_ref + C_ref.
//
// With overlapped rounds (algo.overlap_steps = tau) the exchange hides behind tau steps, so a
// round costs H_i s_i + max(0, C_i,t - tau s_i): H_i = min(H, floor((R - max(0, C_i,t - tau s_i)) / s_i))
// with R = H s_ref + max(0, C_ref - tau s_ref), and every H_i must be at least tau + 1 (a
// ConfigError otherwise).
//
// s_i is worker i's step time and s_ref an unimpeded worker's; C_i,t is worker i's predicted
// exchange time with this round's neighbours (the graph is known ahead from the seed, the links
// from the network model), and C_ref that of an unimpeded worker with the topology's degree. A
// straggler (slow link or slow compute) then does fewer local steps instead of making its peers
// wait. Every worker computes every H_i alone, with no messages.
//
// For an all-reduce (diloco, or gasloc on the complete graph) C_i,t is the same for everyone: the
// ring runs at the slowest link's pace. A straggler then lowers every worker's H_i alike, so the
// round ends no sooner relative to the work done: fewer local steps cannot help an all-reduce.
#pragma once
#include <cstdint>
#include <optional>

#include "gasloc/comm/network_model.hpp"
#include "gasloc/topology/topology.hpp"

namespace gasloc::algo {

class LocalSteps {
 public:
  // The fixed policy.
  LocalSteps(int64_t H) : H_(H) {}  // NOLINT: implicit, an int is the fixed policy
  // The time-budget policy; no topology (or the complete graph) means an all-reduce round.
  LocalSteps(int64_t H, comm::NetworkModel model, std::optional<topology::Topology> topo, int world,
             int64_t overlap_steps = 0);

  int64_t H() const { return H_; }
  // H_i of `rank` in `round` when a round's message is `actual_bytes` long (priced through the
  // model's simulated_message_bytes). Sets *clamped when the budget left fewer than one step.
  // Throws ConfigError when overlapped rounds leave H_i < overlap_steps + 1.
  int64_t steps(int rank, int64_t round, int64_t actual_bytes, bool* clamped = nullptr) const;
  // C_i,t: predicted seconds of `rank`'s communication in `round`.
  double exchange_seconds(int rank, int64_t round, int64_t actual_bytes) const;
  // R: the round time of an unimpeded worker.
  double round_seconds(int64_t actual_bytes) const;

 private:
  int64_t H_;
  std::optional<comm::NetworkModel> model_;
  std::optional<topology::Topology> topo_;  // empty: all-reduce
  int world_ = 1;
  int64_t overlap_ = 0;  // tau
};

}  // namespace gasloc::algo
