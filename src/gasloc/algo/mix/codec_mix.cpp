// The compressed exchanges; see codec_mix.hpp.
#include "gasloc/algo/mix/codec_mix.hpp"

#include <torch/torch.h>

#include "gasloc/comm/codec.hpp"
#include "gasloc/core/error.hpp"

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

// --- the owners' compressed all-reduce ---------------------------------------------------------

MixFlight OwnersAllReduceMix::start(const MixRound& r, comm::Communicator& comm) {
  if (!r.anchor.defined() && r.x.defined()) throw Error("OwnersAllReduceMix: a compressed all-reduce needs the anchor", "internal: pass theta");
  MixFlight f;
  f.x = r.x;
  f.result = c_.all_reduce(r.x, r.anchor, members_of(r, comm), comm).to(r.x.scalar_type());
  return f;
}

MixAttempt OwnersAllReduceMix::collective_attempt(const MixRound& r, comm::Communicator& comm) {
  if (!r.anchor.defined() && r.x.defined()) throw Error("OwnersAllReduceMix: a compressed all-reduce needs the anchor", "internal: pass theta");
  MixAttempt a;
  a.self_agreed = false;  // a failed edge is seen by its ends only: the members vote
  a.what = "compressed all-reduce";
  a.m = c_.all_reduce_attempt(r.x, r.anchor, r.members, comm, a.complete);
  if (a.m.defined() && r.x.defined()) a.m = a.m.to(r.x.scalar_type());
  return a;
}

int64_t OwnersAllReduceMix::message_bytes(int64_t p, torch::ScalarType, int64_t) const {
  return static_cast<int64_t>(comm::payload_bytes(c_.options().codec, static_cast<size_t>(p)));
}

// --- gossip through a codec --------------------------------------------------------------------

CodecGossipMix::CodecGossipMix(topology::Topology topo, const CompressionOptions& o, std::unique_ptr<PeerClip> clip)
    : CodecMix(std::move(topo), o), clip_(std::move(clip)) {
  c_.clip(clip_.get());
}

StateDict CodecGossipMix::state() const {
  StateDict s = c_.state();
  if (clip_) clip_->save(s);
  return s;
}

void CodecGossipMix::load_state(const StateDict& s) {
  c_.load_state(s);
  if (clip_) clip_->load(s);
}

MixFlight CodecGossipMix::start(const MixRound& r, comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  // Every worker's graph (the modulo codec pairs them by colours); one outside the round has none.
  const std::vector<int> members = members_of(r, comm);
  std::vector<RoundGraph> graphs(static_cast<size_t>(comm.world()));
  for (int id : members) graphs.at(static_cast<size_t>(id)) = round_graph(topo_, r.members, id, r.t);
  MixFlight f;
  f.x = r.x;
  if (!r.x.defined() && c_.options().gossip != GossipCodec::modulo) {
    std::vector<torch::Tensor> recv;  // a dying member lists its partners and sends nothing
    comm.exchange(graphs.at(static_cast<size_t>(comm.rank())).peers, torch::Tensor(), recv);
    return f;
  }
  const torch::Tensor m = c_.gossip(r.t, graphs, r.x, comm);
  f.result = m.defined() ? m.to(r.x.scalar_type()) : m;
  return f;
}

bool CodecGossipMix::has_collective(int64_t t) const {
  return c_.options().elastic && c_.options().gossip == GossipCodec::delta && c_.refreshes_reference(t);
}

MixAttempt CodecGossipMix::collective_attempt(const MixRound& r, comm::Communicator& comm) {
  MixAttempt a;
  a.self_agreed = false;
  a.ends_round = false;  // the reference, then the exchange of differences
  a.what = "delta codec's reference";
  a.m = c_.reference_attempt(r.x, r.members, comm, a.complete);
  return a;
}

void CodecGossipMix::collective_agreed(const torch::Tensor& m) {
  if (m.defined()) c_.set_reference(m);
}

int64_t CodecGossipMix::message_bytes(int64_t p, torch::ScalarType, int64_t t) const {
  if (c_.sends_fp32(t, p)) return p * static_cast<int64_t>(sizeof(float));
  return c_.gossip_bytes(p, 1);
}

MixStats CodecGossipMix::stats() const {
  MixStats s;
  if (c_.options().gossip == GossipCodec::modulo) s.codec_resends = c_.resends();
  if (clip_) {
    s.clipped_from = clip_->clipped_from();
    s.dropped_from = clip_->dropped_from();
  }
  return s;
}

void CodecGossipMix::keep_for_joiner(StateDict& state, const std::string& prefix, int64_t params) const {
  CodecMix::keep_for_joiner(state, prefix, params);
  // The delta codec's reference is the job's (the same bits on every worker): it is sent, and a
  // joiner that has none yet holds a placeholder of its shape.
  if (c_.options().gossip == GossipCodec::delta && !state.count(prefix + "compression_reference"))
    state[prefix + "compression_reference"] = torch::zeros({params}, torch::kFloat);
}

}  // namespace gasloc::algo
