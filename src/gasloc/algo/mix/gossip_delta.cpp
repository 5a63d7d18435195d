// The delta gossip codec; see gossip_delta.hpp.
#include "gasloc/algo/mix/gossip_delta.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include "gasloc/core/error.hpp"

namespace gasloc::algo {

DeltaGossipMix::DeltaGossipMix(topology::Topology topo, const CompressionOptions& o, std::unique_ptr<PeerClip> clip)
    : CodecGossipMix(std::move(topo), o, std::move(clip)),
      payloads_(o.codec, o.error_feedback, o.feedback_decay),
      refresh_(comm::Codec::int8(o.codec.chunk), false, o.feedback_decay) {}

bool DeltaGossipMix::refreshes_reference(int64_t t) const {
  return t == 0 || (o_.reference_every > 0 && t % o_.reference_every == 0);
}

torch::Tensor DeltaGossipMix::exchange(int64_t t, const std::vector<RoundGraph>& graphs, const torch::Tensor& s,
                                       comm::Communicator& comm) {
  const int me = comm.rank();
  const RoundGraph& g = graphs.at(me);
  // The reference every worker holds bit for bit: refreshed towards the workers' mean on the
  // first round and every reference_every rounds.
  const bool first = !reference_.defined() || reference_.numel() != s.numel();
  if (o_.elastic) {
    // The caller refreshed it over the view's members (ElasticMix, with retries); a joiner has its donor's.
    if (first) throw Error(fmt::format("delta codec: worker {} has no reference at round {}", me, t),
                           "internal: an elastic round's reference is refreshed by the mixer and healed with the donor's state");
  } else if (first || (o_.reference_every > 0 && t % o_.reference_every == 0)) {
    if (first) reference_ = torch::zeros_like(s);
    std::vector<int> everyone(graphs.size());
    for (size_t v = 0; v < everyone.size(); ++v) everyone[v] = static_cast<int>(v);
    reference_ = refresh_.run(s, reference_, everyone, comm);
  }
  const torch::Tensor payload = payloads_.encode(s - reference_, me);
  std::vector<torch::Tensor> recv;
  comm.exchange(g.peers, payload, recv);
  // s^ = r + decode(c), the sender's own included; m_i = s_i + sum_j W_ij (s^_j - s^_i), whose pair
  // terms are exact negations of each other.
  auto decoded = [&](const torch::Tensor& p, int from) { return payloads_.decode(p, s.numel(), me, from).add_(reference_); };
  const auto own = decoded(payload, me);
  std::vector<torch::Tensor> diffs(g.peers.size());
  for (size_t k = 0; k < g.peers.size(); ++k) {
    if (recv.at(k).defined()) diffs[k] = decoded(recv[k], g.peers[k]) - own;
    else failed_edge(o_.elastic, me, g.peers[k]);  // its weight stays on W_ii
  }
  return add_differences(g, me, s, diffs);
}

bool DeltaGossipMix::has_collective(int64_t t) const { return o_.elastic && refreshes_reference(t); }

MixAttempt DeltaGossipMix::collective_attempt(const MixRound& r, comm::Communicator& comm) {
  MixAttempt a;
  a.self_agreed = false;
  a.ends_round = false;  // the reference, then the exchange of differences
  a.what = "delta codec's reference";
  if (!r.x.defined()) {
    a.m = refresh_.run(r.x, r.x, r.members, comm, &a.complete);
    return a;
  }
  torch::NoGradGuard no_grad;
  const auto s = cpu_fp32(r.x);
  const torch::Tensor ref = reference_.defined() && reference_.numel() == s.numel() ? reference_ : torch::zeros_like(s);
  a.m = refresh_.run(s, ref, r.members, comm, &a.complete);
  return a;
}

void DeltaGossipMix::collective_agreed(const torch::Tensor& m) {
  if (m.defined()) reference_ = m;
}

int64_t DeltaGossipMix::message_bytes(int64_t p, torch::ScalarType, int64_t) const { return gossip_message_bytes(o_, p); }

void DeltaGossipMix::keep_for_joiner(StateDict& state, const std::string& prefix, int64_t params) const {
  CodecMix::keep_for_joiner(state, prefix, params);
  if (!state.count(prefix + "compression_reference")) state[prefix + "compression_reference"] = torch::zeros({params}, torch::kFloat);
}

void DeltaGossipMix::save_codec(StateDict& s) const {
  payloads_.save(s);
  if (reference_.defined()) s["compression_reference"] = reference_;
}

void DeltaGossipMix::load_codec(const StateDict& s) {
  payloads_.load(s);
  reference_ = loaded_fp32(s, "compression_reference");
}

}  // namespace gasloc::algo
