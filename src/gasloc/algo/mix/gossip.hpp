// The gossip mix (docs/design.md section 3): m_i = sum_j W_t[i, j] x_j over round t's graph, x
// sent as the wire dtype, j ascending, so that every backend gives the same bits. A failed edge
// (a peer that died at this exchange, in an elastic round) moves its weight onto W_ii; a
// non-finite message is refused naming its sender, or with algo.clip_peers dropped as a failed
// edge, and every finite one clipped (PeerClip::clip_received).
#pragma once
#include <memory>
#include <vector>

#include "gasloc/algo/mix/mix.hpp"
#include "gasloc/algo/mix/poison.hpp"
#include "gasloc/algo/peer_clip.hpp"

namespace gasloc::algo {

class GossipMix final : public Mix {
 public:
  // clip: algo.clip_peers' (nullptr: off).
  GossipMix(topology::Topology topo, std::unique_ptr<PeerClip> clip, MessageWatch watch);
  MixFlight start(const MixRound& r, comm::Communicator& comm) override;
  torch::Tensor finish(MixFlight& f) override;
  StateDict state() const override;
  void load_state(const StateDict& s) override;
  MixStats stats() const override;

 private:
  topology::Topology topo_;
  std::unique_ptr<PeerClip> clip_;
  MessageWatch watch_;
};

// The counts and window of algo.clip_peers as a Mix reports and checkpoints them (nothing without it).
MixStats clip_stats(const PeerClip* clip);
void save_clip(const PeerClip* clip, StateDict& s);
void load_clip(PeerClip* clip, const StateDict& s);

}  // namespace gasloc::algo
