// The delta gossip codec (docs/design.md section 12): a reference r that every worker holds bit
// for bit; each sends c_i = encode(s_i - r) (with error feedback if asked), and s^_i = r +
// decode(c_i), which the sender computes too. m_i = s_i + sum_{j != i} W_ij (s^_j - s^_i): the pair
// terms are exact negations, so only consensus pays for the codec. r is refreshed towards the
// workers' mean by the owners' int8 all-reduce (owners_all_reduce.hpp; no error feedback: a buffer
// of e_i would count its error twice) every algo.reference_every rounds. Elastic rounds: that
// refresh is the round's collective part, which ElasticMix retries over the view's members; a
// joiner receives r with its donor's state.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "gasloc/algo/mix/codec_mix.hpp"
#include "gasloc/algo/mix/owners_all_reduce.hpp"
#include "gasloc/algo/mix/pair_exchange.hpp"

namespace gasloc::algo {

class DeltaGossipMix final : public CodecGossipMix {
 public:
  DeltaGossipMix(topology::Topology topo, const CompressionOptions& o, std::unique_ptr<PeerClip> clip);
  int64_t message_bytes(int64_t p, torch::ScalarType wire, int64_t t) const override;
  // Elastic rounds: round t refreshes the reference (round 0 and every K-th); one attempt of the
  // refresh (x undefined for a worker that does not mix; m the new reference, undefined when
  // incomplete), and setting it once the members agreed.
  bool has_collective(int64_t t) const override;
  MixAttempt collective_attempt(const MixRound& r, comm::Communicator& comm) override;
  void collective_agreed(const torch::Tensor& m) override;
  // r is the job's (the same bits on every worker): it is sent, and a joiner that has none yet
  // holds a placeholder of its shape.
  void keep_for_joiner(StateDict& state, const std::string& prefix, int64_t params) const override;

 private:
  torch::Tensor exchange(int64_t t, const std::vector<RoundGraph>& graphs, const torch::Tensor& s, comm::Communicator& comm) override;
  void save_codec(StateDict& s) const override;
  void load_codec(const StateDict& s) override;
  bool refreshes_reference(int64_t t) const;

  GossipPayloads payloads_;
  OwnersAllReduce refresh_;  // int8, no error feedback
  torch::Tensor reference_;  // r, the same bits on every worker ("compression_reference")
};

}  // namespace gasloc::algo
