// What the compressed exchanges share as Mixes; see codec_mix.hpp.
#include "gasloc/algo/mix/codec_mix.hpp"

#include <torch/torch.h>

#include <algorithm>

#include "gasloc/algo/mix/pair_exchange.hpp"

namespace gasloc::algo {

void CodecMix::keep_for_joiner(StateDict& state, const std::string& prefix, int64_t) const {
  std::erase_if(state, [&](const auto& kv) {
    return kv.first.starts_with(prefix + "compression_") && kv.first != prefix + "compression_reference";
  });
}

std::vector<int> CodecMix::members_of(const MixRound& r, const comm::Communicator& comm) {
  if (!r.members.empty()) return r.members;
  std::vector<int> everyone(static_cast<size_t>(comm.world()));
  for (size_t id = 0; id < everyone.size(); ++id) everyone[id] = static_cast<int>(id);
  return everyone;
}

CodecGossipMix::CodecGossipMix(topology::Topology topo, const CompressionOptions& o, std::unique_ptr<PeerClip> clip)
    : CodecMix(std::move(topo), o), clip_(std::move(clip)) {}

MixFlight CodecGossipMix::start(const MixRound& r, comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  // Every worker's graph (the modulo codec pairs them by colours); one outside the round has none.
  const std::vector<int> members = members_of(r, comm);
  std::vector<RoundGraph> graphs(static_cast<size_t>(comm.world()));
  for (int id : members) graphs.at(static_cast<size_t>(id)) = round_graph(topo_, r.members, id, r.t);
  MixFlight f;
  f.x = r.x;
  if (!r.x.defined()) {
    stand_by_exchange(r.t, graphs, comm);
    return f;
  }
  const torch::Tensor m = exchange(r.t, graphs, cpu_fp32(r.x), comm);
  f.result = m.view(r.x.sizes()).to(r.x.device()).to(r.x.scalar_type());
  return f;
}

void CodecGossipMix::stand_by_exchange(int64_t, const std::vector<RoundGraph>& graphs, comm::Communicator& comm) {
  std::vector<torch::Tensor> recv;  // a dying member lists its partners and sends nothing
  comm.exchange(graphs.at(static_cast<size_t>(comm.rank())).peers, torch::Tensor(), recv);
}

torch::Tensor CodecGossipMix::add_differences(const RoundGraph& g, int me, const torch::Tensor& s,
                                              std::vector<torch::Tensor>& diffs) const {
  if (clip_) clip_->clip_differences(g.peers, diffs);
  auto m = s.clone();
  for (const auto& [j, w] : g.row) {
    if (j == me) continue;
    const auto k = std::find(g.peers.begin(), g.peers.end(), j) - g.peers.begin();
    if (diffs.at(k).defined()) m.add_(diffs[k], w);  // a failed edge's weight stays on W_ii (elastic)
  }
  return m;
}

StateDict CodecGossipMix::state() const {
  StateDict s;
  save_codec(s);
  if (clip_) clip_->save(s);
  return s;
}

void CodecGossipMix::load_state(const StateDict& s) {
  load_codec(s);
  if (clip_) clip_->load(s);
}

MixStats CodecGossipMix::stats() const {
  MixStats s;
  if (clip_) {
    s.clipped_from = clip_->clipped_from();
    s.dropped_from = clip_->dropped_from();
  }
  return s;
}

}  // namespace gasloc::algo
