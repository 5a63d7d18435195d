// The compressed exchanges (algo.compression; compression.hpp has the codecs' maths and state):
// the owners' compressed all-reduce of pseudo-gradients, and gossip through the direct, delta or
// modulo codec. Each holds the worker's Compressor, whose state (error feedback, grids, the delta
// reference) checkpoints carry under "compression_*". A compressed round makes several exchanges
// in turn: overlapped, it is relayed (overlapped.hpp).
#pragma once
#include <memory>

#include "gasloc/algo/compression.hpp"
#include "gasloc/algo/mix/mix.hpp"

namespace gasloc::algo {

class CodecMix : public Mix {
 public:
  CodecMix(topology::Topology topo, const CompressionOptions& o) : topo_(std::move(topo)), c_(o) {}
  StateDict state() const override { return c_.state(); }
  void load_state(const StateDict& s) override { c_.load_state(s); }
  // The codec's state is the sender's own: a joiner starts its own at zero.
  void keep_for_joiner(StateDict& state, const std::string& prefix, int64_t params) const override;
  const Compressor& compressor() const { return c_; }

 protected:
  // r.members, or every worker of the world when empty.
  static std::vector<int> members_of(const MixRound& r, const comm::Communicator& comm);

  topology::Topology topo_;
  Compressor c_;
};

// r - mean_i (r - x_i), r the anchor theta (Compressor::all_reduce). Elastic rounds: attempts
// that the members agree on, each aborted one putting the codec's state back.
class OwnersAllReduceMix final : public CodecMix {
 public:
  using CodecMix::CodecMix;
  MixFlight start(const MixRound& r, comm::Communicator& comm) override;
  torch::Tensor finish(MixFlight& f) override { return f.result; }
  bool has_collective(int64_t) const override { return true; }
  MixAttempt collective_attempt(const MixRound& r, comm::Communicator& comm) override;
  bool restores_state() const override { return true; }
  bool needs_anchor() const override { return true; }
  int64_t message_bytes(int64_t p, torch::ScalarType wire, int64_t t) const override;
};

// m through a gossip codec (Compressor::gossip). Elastic rounds: a failed edge's weight moves
// onto W_ii; the delta codec's reference refresh is the round's collective part.
class CodecGossipMix final : public CodecMix {
 public:
  // clip: algo.clip_peers' (nullptr: off), applied to what each peer's decoded message adds.
  CodecGossipMix(topology::Topology topo, const CompressionOptions& o, std::unique_ptr<PeerClip> clip);
  StateDict state() const override;
  void load_state(const StateDict& s) override;
  MixFlight start(const MixRound& r, comm::Communicator& comm) override;
  torch::Tensor finish(MixFlight& f) override { return f.result; }
  bool has_collective(int64_t t) const override;
  MixAttempt collective_attempt(const MixRound& r, comm::Communicator& comm) override;
  void collective_agreed(const torch::Tensor& m) override;
  int64_t message_bytes(int64_t p, torch::ScalarType wire, int64_t t) const override;
  MixStats stats() const override;
  void keep_for_joiner(StateDict& state, const std::string& prefix, int64_t params) const override;

 private:
  std::unique_ptr<PeerClip> clip_;
};

}  // namespace gasloc::algo
