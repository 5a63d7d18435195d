// The gossip mix; see gossip.hpp.
#include "gasloc/algo/mix/gossip.hpp"

#include <torch/torch.h>

namespace gasloc::algo {

GossipMix::GossipMix(topology::Topology topo, std::unique_ptr<PeerClip> clip, MessageWatch watch)
    : UncompressedMix(std::move(clip), std::move(watch)), topo_(std::move(topo)) {}

MixFlight GossipMix::start(const MixRound& r, comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  MixFlight f;
  f.me = comm.rank();
  if (!r.x.defined()) {
    // Sends nothing: a member that dies here lists its partners (they see the failed edge); a
    // worker outside the round has no edges.
    const bool member = r.members.empty() || std::find(r.members.begin(), r.members.end(), f.me) != r.members.end();
    comm.exchange(member ? round_graph(topo_, r.members, f.me, r.t).peers : std::vector<int>{}, torch::Tensor(), f.recv);
    return f;
  }
  f.x = r.x;
  f.graph = round_graph(topo_, r.members, f.me, r.t);
  const torch::Tensor sent = watch_.sent(r.x, f.me, r.t);
  f.buf = r.wire == sent.scalar_type() ? sent : sent.to(r.wire);  // kept alive while it travels
  if (r.overlapped) {
    f.pending = comm.start_exchange(f.graph.peers, f.buf, f.recv);
    return f;
  }
  comm.exchange(f.graph.peers, f.buf, f.recv);
  watch_.note(r.t, f.graph.peers, r.x, f.recv);
  f.result = combine(f.graph, f.me, f.x, f.recv, clip_.get());
  return f;
}

torch::Tensor GossipMix::finish(MixFlight& f) {
  torch::NoGradGuard no_grad;
  if (!f.pending) return f.result;
  f.pending->wait();
  f.pending.reset();
  return combine(f.graph, f.me, f.x, f.recv, clip_.get());
}

}  // namespace gasloc::algo
