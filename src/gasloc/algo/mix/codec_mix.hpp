// The compressed exchanges (algo.compression; docs/design.md section 12), one file each:
//   owners_all_reduce  the owners' compressed all-reduce of pseudo-gradients
//   gossip_direct      peers decode each other's int8 parameters
//   gossip_delta       differences from a reference every worker holds bit for bit
//   gossip_modulo      pairs swap residues on a grid of their own (modulo_codec.hpp's maths)
// built on what they share (pair_exchange.hpp). Each holds its state (error feedback, grids, the
// delta reference), which checkpoints carry under "compression_*". A compressed round makes
// several exchanges in turn: overlapped, it is relayed (overlapped.hpp).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "gasloc/algo/compression.hpp"
#include "gasloc/algo/mix/mix.hpp"
#include "gasloc/algo/peer_clip.hpp"

namespace gasloc::algo {

class CodecMix : public Mix {
 public:
  CodecMix(topology::Topology topo, const CompressionOptions& o) : topo_(std::move(topo)), o_(o) {}
  const CompressionOptions& options() const { return o_; }
  // The codec's state is the sender's own: a joiner starts its own at zero.
  void keep_for_joiner(StateDict& state, const std::string& prefix, int64_t params) const override;

 protected:
  // r.members, or every worker of the world when empty.
  static std::vector<int> members_of(const MixRound& r, const comm::Communicator& comm);

  topology::Topology topo_;
  CompressionOptions o_;
};

// m_i = s_i + sum_{j != i} W_ij d_ij through a gossip codec, d_ij what the codec lets worker i
// know of s_j - s_i. Elastic rounds: a failed edge's weight moves onto W_ii. With algo.clip_peers,
// each peer's d_ij is clipped (PeerClip::clip_differences) before it is added.
class CodecGossipMix : public CodecMix {
 public:
  // clip: algo.clip_peers' (nullptr: off).
  CodecGossipMix(topology::Topology topo, const CompressionOptions& o, std::unique_ptr<PeerClip> clip);
  MixFlight start(const MixRound& r, comm::Communicator& comm) override;
  torch::Tensor finish(MixFlight& f) override { return f.result; }
  // The codec's state and the clip's.
  StateDict state() const override;
  void load_state(const StateDict& s) override;
  MixStats stats() const override;

 protected:
  // m for worker `me` (comm.rank()) from s, its fp32 values on the CPU, flat: graphs[v] is worker
  // v's neighbours and row (every worker's, ids ascending; empty outside the round). Returns m
  // flat, fp32, on the CPU.
  virtual torch::Tensor exchange(int64_t t, const std::vector<RoundGraph>& graphs, const torch::Tensor& s,
                                 comm::Communicator& comm) = 0;
  // The round's exchanges for a worker that sends nothing (elastic rounds): by default one
  // exchange listing its partners (a dying member's), so that they see a failed edge.
  virtual void stand_by_exchange(int64_t t, const std::vector<RoundGraph>& graphs, comm::Communicator& comm);
  virtual void save_codec(StateDict& s) const = 0;
  virtual void load_codec(const StateDict& s) = 0;
  // s + sum_{j != me} W_ij diffs[j] over g's row, after clipping; an undefined diff is a failed edge
  // (its weight stays on W_ii).
  torch::Tensor add_differences(const RoundGraph& g, int me, const torch::Tensor& s, std::vector<torch::Tensor>& diffs) const;
  PeerClip* clip() const { return clip_.get(); }

 private:
  std::unique_ptr<PeerClip> clip_;
};

}  // namespace gasloc::algo
