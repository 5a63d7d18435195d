// Fault injection (faults.poison) and what it leaves behind for a divergence to name: a worker
// whose schedule poisons round t sends its message scaled (its own term stays x), and every
// receiver notes which sender of its last mix stood out (MessageSuspect). The defence against
// such a message (algo.clip_peers) is PeerClip's, apart from this.
#pragma once
#include <torch/types.h>

#include <optional>
#include <vector>

#include "gasloc/algo/mix/stats.hpp"
#include "gasloc/algo/peer_clip.hpp"

namespace gasloc::algo {

class MessageWatch {
 public:
  explicit MessageWatch(std::vector<Poison> poisons = {}) : poisons_(std::move(poisons)) {}
  // What worker `me` sends in round t for its own term x: x, or x times its poison factor.
  torch::Tensor sent(const torch::Tensor& x, int me, int64_t t) const;
  // Records which of `senders` (recv: what each sent, gossip; empty: an all-reduce, where only a
  // poison is known) stood out in round t's mix of x.
  void note(int64_t t, const std::vector<int>& senders, const torch::Tensor& x, const std::vector<torch::Tensor>& recv);
  // The sender whose message stood out in the last mix noted, if one did.
  std::optional<MessageSuspect> suspect() const;

 private:
  std::vector<Poison> poisons_;
  MessageSuspect last_;  // sender -1: none
};

}  // namespace gasloc::algo
