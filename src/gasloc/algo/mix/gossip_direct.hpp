// The direct gossip codec (docs/design.md section 12; int8, no state but its error feedback):
// every neighbour decodes this worker's encoded values, s^_j = decode(encode(s_j)), and the own
// term is s_i exactly, m_i = W_ii s_i + sum_{j != i} W_ij s^_j. The workers' mean moves by the
// codec's bias each round. Elastic rounds: one exchange, as uncompressed gossip; a failed edge's
// weight moves onto W_ii (combine).
#pragma once
#include <memory>
#include <vector>

#include "gasloc/algo/mix/codec_mix.hpp"
#include "gasloc/algo/mix/pair_exchange.hpp"

namespace gasloc::algo {

class DirectGossipMix final : public CodecGossipMix {
 public:
  DirectGossipMix(topology::Topology topo, const CompressionOptions& o, std::unique_ptr<PeerClip> clip);
  int64_t message_bytes(int64_t p, torch::ScalarType wire, int64_t t) const override;

 private:
  torch::Tensor exchange(int64_t t, const std::vector<RoundGraph>& graphs, const torch::Tensor& s, comm::Communicator& comm) override;
  void save_codec(StateDict& s) const override { payloads_.save(s); }
  void load_codec(const StateDict& s) override { payloads_.load(s); }

  GossipPayloads payloads_;
};

}  // namespace gasloc::algo
