// The owners' compressed all-reduce; see owners_all_reduce.hpp.
#include "gasloc/algo/mix/owners_all_reduce.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "gasloc/algo/mix/pair_exchange.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::algo {

torch::Tensor OwnersAllReduce::run(const torch::Tensor& x, const torch::Tensor& r, const std::vector<int>& members,
                                   comm::Communicator& comm, bool* complete) {
  torch::NoGradGuard no_grad;
  const int n = static_cast<int>(members.size());
  const auto at = std::find(members.begin(), members.end(), comm.rank());
  if (at == members.end() && !complete) throw Error(fmt::format("compressed all-reduce: worker {} is not a member", comm.rank()));
  const int me = at == members.end() ? -1 : static_cast<int>(at - members.begin());
  const auto colours = round_robin(n);
  if (me < 0 || !x.defined()) {
    // It sends nothing: the same exchanges, one phase (topk) or two, so that every worker makes them in order.
    int failed = -1;
    const int phases = codec_.kind == comm::CodecKind::topk ? 1 : 2;
    for (int phase = 0; phase < phases; ++phase)
      pairwise(colours, members, me, false, comm, [](int) { return torch::Tensor(); }, [](int, const torch::Tensor&) {}, failed);
    if (complete) *complete = false;
    return {};
  }
  int failed = -1;  // a partner whose edge failed: the attempt is incomplete
  const int64_t P = x.numel(), C = static_cast<int64_t>(codec_.chunk);
  const int64_t chunks = (P + C - 1) / C, shard = (chunks + n - 1) / n * C;

  // u_i = r - x_i over a buffer of n whole shards (zeros past P, which encode exactly).
  auto u = torch::zeros({n * shard}, torch::kFloat);
  u.narrow(0, 0, P).copy_(cpu_fp32(r)).sub_(cpu_fp32(x));
  torch::Tensor codes;
  try {
    if (feedback_on_) {
      if (!feedback_.defined() || feedback_.numel() != P) feedback_ = torch::zeros({P}, torch::kFloat);
      auto e = torch::zeros({n * shard}, torch::kFloat);
      e.narrow(0, 0, P).copy_(feedback_);
      codes = byte_tensor(comm::encode_with_feedback(codec_, floats(std::as_const(u)), floats(e), decay_));
      feedback_.copy_(e.narrow(0, 0, P));
    } else {
      codes = byte_tensor(comm::encode(codec_, floats(std::as_const(u))));
    }
  } catch (const comm::NonFiniteChunk& e) {
    non_finite(e, comm.rank(), "pseudo-gradient (theta - phi)");
  }

  auto decoded = torch::empty({n * shard}, torch::kFloat);
  if (codec_.kind == comm::CodecKind::topk) all_gather(codes, colours, members, me, comm, decoded, failed);
  else owners(codes, colours, members, me, shard, comm, decoded, failed);
  if (failed >= 0) {
    failed_edge(complete != nullptr, comm.rank(), failed);
    *complete = false;
    return {};
  }
  if (complete) *complete = true;
  auto m = cpu_fp32(r).sub_(decoded.narrow(0, 0, P));
  return m.view(x.sizes()).to(x.device());
}

void OwnersAllReduce::all_gather(const torch::Tensor& codes, const std::vector<std::vector<int>>& colours,
                                 const std::vector<int>& members, int me, comm::Communicator& comm, torch::Tensor& decoded,
                                 int& failed) {
  // Every member's whole payload to every member, decoded and summed in id order.
  const int n = static_cast<int>(members.size());
  std::vector<torch::Tensor> payload(n);
  payload[me] = codes;
  pairwise(colours, members, me, true, comm, [&](int) { return codes; }, [&](int p, const torch::Tensor& t) { payload[p] = t; },
           failed);
  decoded.zero_();
  for (int k = 0; k < n; ++k) {
    if (!payload[k].defined()) continue;  // a failed edge: the attempt is incomplete (the caller)
    try {
      comm::decode_add(codec_, bytes(payload[k]), 1.0f, floats(decoded));
    } catch (const comm::BadPayload& e) {
      bad_payload(e, comm.rank(), members[k]);
    }
  }
  decoded.div_(static_cast<float>(n));
}

void OwnersAllReduce::owners(const torch::Tensor& codes, const std::vector<std::vector<int>>& colours,
                             const std::vector<int>& members, int me, int64_t shard, comm::Communicator& comm,
                             torch::Tensor& decoded, int& failed) {
  const int n = static_cast<int>(members.size());
  const int64_t shard_bytes = shard / static_cast<int64_t>(codec_.chunk) *
                              static_cast<int64_t>(comm::payload_bytes(codec_, codec_.chunk));
  // Phase 1: the owners' shards, all to all; the owner sums the n codes in id order.
  auto shard_of = [&](int k) { return codes.narrow(0, k * shard_bytes, shard_bytes); };
  std::vector<torch::Tensor> mine(n);
  mine[me] = shard_of(me);
  pairwise(colours, members, me, true, comm, [&](int p) { return shard_of(p).contiguous(); },
           [&](int p, const torch::Tensor& t) { mine[p] = t; }, failed);
  auto mean = torch::zeros({shard}, torch::kFloat);
  for (int k = 0; k < n; ++k) {
    if (!mine[k].defined()) continue;
    try {
      comm::decode_add(codec_, bytes(mine[k].contiguous()), 1.0f, floats(mean));
    } catch (const comm::BadPayload& e) {
      bad_payload(e, comm.rank(), members[k]);
    }
  }
  mean.div_(static_cast<float>(n));
  // The owner re-encodes the mean (with its own feedback), and everyone takes decode of that.
  torch::Tensor owned;
  try {
    if (feedback_on_) {
      if (!owner_feedback_.defined() || owner_feedback_.numel() != shard) owner_feedback_ = torch::zeros({shard}, torch::kFloat);
      owned = byte_tensor(comm::encode_with_feedback(codec_, floats(std::as_const(mean)), floats(owner_feedback_), decay_));
    } else {
      owned = byte_tensor(comm::encode(codec_, floats(std::as_const(mean))));
    }
  } catch (const comm::NonFiniteChunk& e) {
    non_finite(e, comm.rank(), "shard's mean pseudo-gradient");
  }
  // Phase 2: the owners' codes, all to all.
  std::vector<torch::Tensor> owners(n);
  owners[me] = owned;
  pairwise(colours, members, me, true, comm, [&](int) { return owned; }, [&](int p, const torch::Tensor& t) { owners[p] = t; },
           failed);
  for (int k = 0; k < n; ++k) {
    if (!owners[k].defined()) continue;
    auto out = decoded.narrow(0, k * shard, shard);
    try {
      comm::decode(codec_, bytes(owners[k].contiguous()), floats(out));
    } catch (const comm::BadPayload& e) {
      bad_payload(e, comm.rank(), members[k]);
    }
  }
}

void OwnersAllReduce::save(StateDict& s) const {
  if (feedback_.defined()) s["compression_feedback"] = feedback_;
  if (owner_feedback_.defined()) s["compression_owner_feedback"] = owner_feedback_;
}

void OwnersAllReduce::load(const StateDict& s) {
  feedback_ = loaded_fp32(s, "compression_feedback");
  owner_feedback_ = loaded_fp32(s, "compression_owner_feedback");
}

// --- the Mix -----------------------------------------------------------------------------------

OwnersAllReduceMix::OwnersAllReduceMix(topology::Topology topo, const CompressionOptions& o)
    : CodecMix(std::move(topo), o), reduce_(o.codec, o.error_feedback, o.feedback_decay) {}

MixFlight OwnersAllReduceMix::start(const MixRound& r, comm::Communicator& comm) {
  if (!r.anchor.defined() && r.x.defined()) throw Error("OwnersAllReduceMix: a compressed all-reduce needs the anchor", "internal: pass theta");
  MixFlight f;
  f.x = r.x;
  f.result = reduce_.run(r.x, r.anchor, members_of(r, comm), comm).to(r.x.scalar_type());
  return f;
}

MixAttempt OwnersAllReduceMix::collective_attempt(const MixRound& r, comm::Communicator& comm) {
  if (!r.anchor.defined() && r.x.defined()) throw Error("OwnersAllReduceMix: a compressed all-reduce needs the anchor", "internal: pass theta");
  MixAttempt a;
  a.self_agreed = false;  // a failed edge is seen by its ends only: the members vote
  a.what = "compressed all-reduce";
  a.m = reduce_.run(r.x, r.anchor, r.members, comm, &a.complete);
  if (a.m.defined() && r.x.defined()) a.m = a.m.to(r.x.scalar_type());
  return a;
}

int64_t OwnersAllReduceMix::message_bytes(int64_t p, torch::ScalarType, int64_t) const {
  return static_cast<int64_t>(comm::payload_bytes(o_.codec, static_cast<size_t>(p)));
}

StateDict OwnersAllReduceMix::state() const {
  StateDict s;
  reduce_.save(s);
  return s;
}

void OwnersAllReduceMix::load_state(const StateDict& s) { reduce_.load(s); }

}  // namespace gasloc::algo
