// The gossip mix (docs/design.md section 3): m_i = sum_j W_t[i, j] x_j over round t's graph, x
// sent as the wire dtype, j ascending, so that every backend gives the same bits. A failed edge
// (a peer that died at this exchange, in an elastic round) moves its weight onto W_ii; a
// non-finite message is refused naming its sender, or with algo.clip_peers dropped as a failed
// edge, and every finite one clipped (PeerClip::clip_received).
#pragma once
#include <memory>
#include <vector>

#include "gasloc/algo/mix/uncompressed.hpp"

namespace gasloc::algo {

class GossipMix final : public UncompressedMix {
 public:
  // clip: algo.clip_peers' (nullptr: off).
  GossipMix(topology::Topology topo, std::unique_ptr<PeerClip> clip, MessageWatch watch);
  MixFlight start(const MixRound& r, comm::Communicator& comm) override;
  torch::Tensor finish(MixFlight& f) override;

 private:
  topology::Topology topo_;
};

}  // namespace gasloc::algo
