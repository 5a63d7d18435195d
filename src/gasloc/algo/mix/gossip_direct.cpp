// The direct gossip codec; see gossip_direct.hpp.
#include "gasloc/algo/mix/gossip_direct.hpp"

#include <torch/torch.h>

namespace gasloc::algo {

DirectGossipMix::DirectGossipMix(topology::Topology topo, const CompressionOptions& o, std::unique_ptr<PeerClip> clip)
    : CodecGossipMix(std::move(topo), o, std::move(clip)), payloads_(o.codec, o.error_feedback, o.feedback_decay) {}

torch::Tensor DirectGossipMix::exchange(int64_t, const std::vector<RoundGraph>& graphs, const torch::Tensor& s,
                                        comm::Communicator& comm) {
  const int me = comm.rank();
  const RoundGraph& g = graphs.at(me);
  std::vector<torch::Tensor> recv;
  comm.exchange(g.peers, payloads_.encode(s, me), recv);
  for (size_t k = 0; k < recv.size(); ++k)
    if (recv[k].defined()) recv[k] = payloads_.decode(recv[k], s.numel(), me, g.peers[k]);
  return combine(g, me, s, recv, clip());
}

int64_t DirectGossipMix::message_bytes(int64_t p, torch::ScalarType, int64_t) const {
  return gossip_message_bytes(o_, p);
}

}  // namespace gasloc::algo
