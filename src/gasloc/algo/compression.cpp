// Compressed rounds; see compression.hpp.
#include "gasloc/algo/compression.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>

#include "gasloc/algo/algo_config.hpp"
#include "gasloc/algo/modulo_codec.hpp"
#include "gasloc/core/config.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::algo {

const config::Choices& feedback_choices() {
  static const config::Choices c("error feedback", {{"auto", "on for int4 and topk all-reduces, off otherwise"},
                                                    {"on", "carry each round's encoding error into the next"},
                                                    {"off", "send each round's encoding alone"}});
  return c;
}

const config::Choices& gossip_codec_choices() {
  static const config::Choices c("gossip codec", {{"direct", "peers decode each other's int8 parameters (the mean drifts by the codec's bias)"},
                                                  {"delta", "differences from a reference every worker holds, refreshed by an all-reduce every algo.reference_every rounds"},
                                                  {"modulo", "pairs swap residues of a shared grid; the mean is kept exactly"}});
  return c;
}

std::vector<std::vector<int>> round_robin(int n) {
  std::vector<std::vector<int>> out;
  if (n < 2) return out;
  const int N = n + n % 2;  // an odd n gets a ghost position, N - 1, whose partner sits out
  for (int r = 0; r < N - 1; ++r) {
    std::vector<int> partner(N, -1);
    auto pair = [&](int a, int b) { partner[a] = b, partner[b] = a; };
    pair(N - 1, r);
    for (int k = 1; k < N / 2; ++k) pair((r + k) % (N - 1), (r - k + N - 1) % (N - 1));
    partner.resize(n);
    for (int& p : partner)
      if (p >= n) p = -1;
    out.push_back(std::move(partner));
  }
  return out;
}

std::vector<std::vector<int>> pair_colours(const std::vector<std::vector<int>>& neighbours) {
  const int n = static_cast<int>(neighbours.size());
  std::vector<std::vector<int>> colours;
  for (int i = 0; i < n; ++i) {
    std::vector<int> js = neighbours[i];
    std::sort(js.begin(), js.end());
    for (int j : js) {
      if (j <= i) continue;
      size_t c = 0;
      while (c < colours.size() && (colours[c][i] >= 0 || colours[c][j] >= 0)) ++c;
      if (c == colours.size()) colours.emplace_back(n, -1);
      colours[c][i] = j;
      colours[c][j] = i;
    }
  }
  return colours;
}

namespace {

std::span<float> floats(torch::Tensor& t) { return {t.data_ptr<float>(), static_cast<size_t>(t.numel())}; }
std::span<const float> floats(const torch::Tensor& t) { return {t.data_ptr<float>(), static_cast<size_t>(t.numel())}; }
std::span<uint8_t> bytes(torch::Tensor& t) { return {t.data_ptr<uint8_t>(), static_cast<size_t>(t.numel())}; }
std::span<const uint8_t> bytes(const torch::Tensor& t) { return {t.data_ptr<uint8_t>(), static_cast<size_t>(t.numel())}; }

torch::Tensor cpu_fp32(const torch::Tensor& x) {
  return x.detach().to(torch::kCPU, torch::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous().reshape({-1});
}

torch::Tensor byte_tensor(const std::vector<uint8_t>& v) {
  auto t = torch::empty({static_cast<int64_t>(v.size())}, torch::kByte);
  std::copy(v.begin(), v.end(), t.data_ptr<uint8_t>());
  return t;
}

// A codec's refusal of a worker's own values, as the round's error naming it.
[[noreturn]] void non_finite(const comm::NonFiniteChunk& e, int rank, const char* what) {
  throw CommError(fmt::format("worker {}: its {} holds {}; nothing was sent", rank, what, e.what()),
                  "that worker diverged: lower optim.lr or resume from its last checkpoint");
}

// A peer's payload that no encoder produces.
[[noreturn]] void bad_payload(const comm::BadPayload& e, int me, int peer) {
  throw CommError(fmt::format("worker {}: the compressed payload from worker {} is malformed: {}", me, peer, e.what()),
                  "every worker must run the same gasloc and the same algo.compression settings");
}

// A peer whose payload did not come: an error with a fixed membership; in an elastic round a
// failed edge, which the caller drops.
void failed_edge(bool elastic, int me, int peer) {
  if (!elastic)
    throw CommError(fmt::format("worker {}: worker {} sent nothing in a compressed round", me, peer),
                    "compressed rounds need a fixed membership");
}

// One pair exchange per colour: exchange `send(partner)` with the colour's partner, hand what
// arrived to got(partner, tensor). Every worker runs every colour, alone in those it sits out (and
// in all of them when it is not among `ids`: me < 0). A worker that does not send (`sends`
// false) lists its partners with nothing, so they see a failed edge. A failed edge: `failed` gets
// the partner's id, and got() is not called.
template <class Send, class Got>
void pairwise(const std::vector<std::vector<int>>& colours, const std::vector<int>& ids, int me, bool sends,
              comm::Communicator& comm, Send send, Got got, int& failed) {
  for (const auto& partner : colours) {
    const int p = me < 0 ? -1 : partner[me];
    std::vector<torch::Tensor> recv;
    if (p < 0) {
      comm.exchange({}, torch::empty({0}, torch::kByte), recv);
      continue;
    }
    comm.exchange({ids[p]}, sends ? send(p) : torch::Tensor(), recv);
    if (!sends) continue;
    if (!recv.at(0).defined()) {
      failed = ids[p];
      continue;
    }
    got(p, recv[0]);
  }
}

}  // namespace

Compressor::Compressor(CompressionOptions o) : o_(std::move(o)) {}

int64_t Compressor::all_reduce_bytes(int64_t p, int n) const {
  if (n < 2) return 0;
  const auto C = static_cast<int64_t>(o_.codec.chunk);
  const int64_t chunks = (p + C - 1) / C, shard = (chunks + n - 1) / n;
  const auto per_chunk = static_cast<int64_t>(comm::payload_bytes(o_.codec, o_.codec.chunk));
  if (o_.codec.kind == comm::CodecKind::topk) return (n - 1) * per_chunk * shard * n;
  return 2 * (n - 1) * per_chunk * shard;
}

int64_t Compressor::gossip_bytes(int64_t p, int peers) const {
  const auto n = static_cast<size_t>(p);
  if (o_.gossip != GossipCodec::modulo) return peers * static_cast<int64_t>(comm::payload_bytes(o_.codec, n));
  const ModuloGrid g{o_.codec.kind == comm::CodecKind::int8 ? 127 : 7, o_.codec.chunk};
  const auto chunks = static_cast<int64_t>((n + g.chunk - 1) / g.chunk);
  return peers * (8 * chunks + static_cast<int64_t>(modulo_payload_bytes(g, n)));
}

bool Compressor::sends_fp32(int64_t round, int64_t p) const {
  if (o_.gossip != GossipCodec::modulo) return false;
  if (o_.elastic) return round == 0;
  const auto chunks = (p + static_cast<int64_t>(o_.codec.chunk) - 1) / static_cast<int64_t>(o_.codec.chunk);
  return !(gaps_.defined() && gaps_.numel() == chunks);  // as modulo() decides
}

torch::Tensor Compressor::all_reduce(const torch::Tensor& x, const torch::Tensor& r, const std::vector<int>& members,
                                     comm::Communicator& comm) {
  return owner_all_reduce(o_.codec, o_.error_feedback, x, r, members, comm);
}

torch::Tensor Compressor::all_reduce_attempt(const torch::Tensor& x, const torch::Tensor& r, const std::vector<int>& members,
                                             comm::Communicator& comm, bool& complete) {
  return owner_all_reduce(o_.codec, o_.error_feedback, x, r, members, comm, &complete);
}

bool Compressor::refreshes_reference(int64_t round) const {
  return round == 0 || (o_.reference_every > 0 && round % o_.reference_every == 0);
}

torch::Tensor Compressor::reference_attempt(const torch::Tensor& x, const std::vector<int>& members, comm::Communicator& comm,
                                            bool& complete) {
  if (!x.defined()) return owner_all_reduce(comm::Codec::int8(o_.codec.chunk), false, x, x, members, comm, &complete);
  auto s = cpu_fp32(x);
  const torch::Tensor r = reference_.defined() && reference_.numel() == s.numel() ? reference_ : torch::zeros_like(s);
  return owner_all_reduce(comm::Codec::int8(o_.codec.chunk), false, s, r, members, comm, &complete);
}

StateDict Compressor::snapshot() const {
  StateDict s = state();
  for (auto& [k, t] : s) t = t.clone();
  return s;
}

torch::Tensor Compressor::owner_all_reduce(const comm::Codec& codec, bool feedback, const torch::Tensor& x,
                                           const torch::Tensor& r, const std::vector<int>& members, comm::Communicator& comm,
                                           bool* complete) {
  torch::NoGradGuard no_grad;
  const int n = static_cast<int>(members.size());
  const auto at = std::find(members.begin(), members.end(), comm.rank());
  if (at == members.end() && !complete) throw Error(fmt::format("compressed all-reduce: worker {} is not a member", comm.rank()));
  const int me = at == members.end() ? -1 : static_cast<int>(at - members.begin());
  const auto colours = round_robin(n);
  if (me < 0 || !x.defined()) {
    // It sends nothing: the same exchanges, one phase (topk) or two, so that every worker makes them in order.
    int failed = -1;
    const int phases = codec.kind == comm::CodecKind::topk ? 1 : 2;
    for (int phase = 0; phase < phases; ++phase)
      pairwise(colours, members, me, false, comm, [](int) { return torch::Tensor(); }, [](int, const torch::Tensor&) {}, failed);
    if (complete) *complete = false;
    return {};
  }
  int failed = -1;  // a partner whose edge failed: the attempt is incomplete
  const int64_t P = x.numel(), C = static_cast<int64_t>(codec.chunk);
  const int64_t chunks = (P + C - 1) / C, shard_chunks = (chunks + n - 1) / n, shard = shard_chunks * C;
  const auto chunk_bytes = static_cast<int64_t>(comm::payload_bytes(codec, codec.chunk));

  // u_i = r - x_i over a buffer of n whole shards (zeros past P, which encode exactly).
  auto u = torch::zeros({n * shard}, torch::kFloat);
  u.narrow(0, 0, P).copy_(cpu_fp32(r)).sub_(cpu_fp32(x));
  torch::Tensor codes;
  try {
    if (feedback) {
      if (!feedback_.defined() || feedback_.numel() != P) feedback_ = torch::zeros({P}, torch::kFloat);
      auto e = torch::zeros({n * shard}, torch::kFloat);
      e.narrow(0, 0, P).copy_(feedback_);
      codes = byte_tensor(comm::encode_with_feedback(codec, floats(std::as_const(u)), floats(e), o_.feedback_decay));
      feedback_.copy_(e.narrow(0, 0, P));
    } else {
      codes = byte_tensor(comm::encode(codec, floats(std::as_const(u))));
    }
  } catch (const comm::NonFiniteChunk& e) {
    non_finite(e, comm.rank(), "pseudo-gradient (theta - phi)");
  }

  const int64_t shard_bytes = shard_chunks * chunk_bytes;
  auto decoded = torch::empty({n * shard}, torch::kFloat);
  if (codec.kind == comm::CodecKind::topk) {
    // Every member's whole payload to every member, decoded and summed in id order.
    std::vector<torch::Tensor> payload(n);
    payload[me] = codes;
    pairwise(colours, members, me, true, comm, [&](int) { return codes; }, [&](int p, const torch::Tensor& t) { payload[p] = t; },
             failed);
    decoded.zero_();
    for (int k = 0; k < n; ++k) {
      if (!payload[k].defined()) continue;  // a failed edge: the attempt is incomplete (below)
      try {
        comm::decode_add(codec, bytes(payload[k]), 1.0f, floats(decoded));
      } catch (const comm::BadPayload& e) {
        bad_payload(e, comm.rank(), members[k]);
      }
    }
    decoded.div_(static_cast<float>(n));
  } else {
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
        comm::decode_add(codec, bytes(mine[k].contiguous()), 1.0f, floats(mean));
      } catch (const comm::BadPayload& e) {
        bad_payload(e, comm.rank(), members[k]);
      }
    }
    mean.div_(static_cast<float>(n));
    // The owner re-encodes the mean (with its own feedback), and everyone takes decode of that.
    torch::Tensor owned;
    try {
      if (feedback) {
        if (!owner_feedback_.defined() || owner_feedback_.numel() != shard) owner_feedback_ = torch::zeros({shard}, torch::kFloat);
        owned = byte_tensor(comm::encode_with_feedback(codec, floats(std::as_const(mean)), floats(owner_feedback_), o_.feedback_decay));
      } else {
        owned = byte_tensor(comm::encode(codec, floats(std::as_const(mean))));
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
        comm::decode(codec, bytes(owners[k].contiguous()), floats(out));
      } catch (const comm::BadPayload& e) {
        bad_payload(e, comm.rank(), members[k]);
      }
    }
  }
  if (failed >= 0) {
    failed_edge(complete != nullptr, comm.rank(), failed);
    *complete = false;
    return {};
  }
  if (complete) *complete = true;
  auto m = cpu_fp32(r).sub_(decoded.narrow(0, 0, P));
  return m.view(x.sizes()).to(x.device());
}

torch::Tensor Compressor::gossip(int64_t round, const std::vector<RoundGraph>& graphs, const torch::Tensor& x,
                                 comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  switch (o_.gossip) {
    case GossipCodec::direct: return direct(graphs, x, comm);
    case GossipCodec::delta: return delta(round, graphs, x, comm);
    case GossipCodec::modulo: break;
  }
  if (!x.defined()) {
    stand_by_modulo(round, graphs, comm);
    return {};
  }
  return modulo(round, graphs, x, comm);
}

torch::Tensor Compressor::delta(int64_t round, const std::vector<RoundGraph>& graphs, const torch::Tensor& x,
                                comm::Communicator& comm) {
  const int me = comm.rank();
  const RoundGraph& g = graphs.at(me);
  auto s = cpu_fp32(x);
  // The reference every worker holds bit for bit: refreshed towards the workers' mean by the
  // owners' int8 all-reduce (no error feedback: a buffer of e_i would count its error twice) on
  // the first round and every reference_every rounds.
  const bool first = !reference_.defined() || reference_.numel() != s.numel();
  if (o_.elastic) {
    // The caller refreshed it over the view's members (ElasticMix, with retries); a joiner has its donor's.
    if (first) throw Error(fmt::format("delta codec: worker {} has no reference at round {}", me, round),
                           "internal: an elastic round's reference is refreshed by the mixer and healed with the donor's state");
  } else if (first || (o_.reference_every > 0 && round % o_.reference_every == 0)) {
    if (first) reference_ = torch::zeros_like(s);
    std::vector<int> everyone(graphs.size());
    for (size_t v = 0; v < everyone.size(); ++v) everyone[v] = static_cast<int>(v);
    reference_ = owner_all_reduce(comm::Codec::int8(o_.codec.chunk), false, s, reference_, everyone, comm);
  }
  auto u = s - reference_;
  const torch::Tensor payload = encode_own(u, me);
  std::vector<torch::Tensor> recv;
  comm.exchange(g.peers, payload, recv);
  // s^ = r + decode(c), the sender's own included; m_i = s_i + sum_j W_ij (s^_j - s^_i), whose pair
  // terms are exact negations of each other.
  auto decoded = [&](const torch::Tensor& p, int from) { return decode_from(p, s.numel(), me, from).add_(reference_); };
  const auto own = decoded(payload, me);
  std::vector<torch::Tensor> diffs(g.peers.size());
  for (size_t k = 0; k < g.peers.size(); ++k) {
    if (recv.at(k).defined()) diffs[k] = decoded(recv[k], g.peers[k]) - own;
    else failed_edge(o_.elastic, me, g.peers[k]);  // its weight stays on W_ii
  }
  if (clip_) clip_->clip_differences(g.peers, diffs);
  auto m = s.clone();
  for (const auto& [j, w] : g.row) {
    if (j == me) continue;
    const auto k = std::find(g.peers.begin(), g.peers.end(), j) - g.peers.begin();
    if (diffs.at(k).defined()) m.add_(diffs[k], w);
  }
  return m.view(x.sizes()).to(x.device());
}

torch::Tensor Compressor::encode_own(const torch::Tensor& u, int me) {
  try {
    if (!o_.error_feedback) return byte_tensor(comm::encode(o_.codec, floats(u)));
    if (!feedback_.defined() || feedback_.numel() != u.numel()) feedback_ = torch::zeros_like(u);
    return byte_tensor(comm::encode_with_feedback(o_.codec, floats(u), floats(feedback_), o_.feedback_decay));
  } catch (const comm::NonFiniteChunk& e) {
    non_finite(e, me, "parameters");
  }
}

torch::Tensor Compressor::decode_from(const torch::Tensor& payload, int64_t n, int me, int from) const {
  auto out = torch::empty({n}, torch::kFloat);
  try {
    comm::decode(o_.codec, bytes(payload.contiguous()), floats(out));
  } catch (const comm::BadPayload& e) {
    bad_payload(e, me, from);
  }
  return out;
}

torch::Tensor Compressor::direct(const std::vector<RoundGraph>& graphs, const torch::Tensor& x, comm::Communicator& comm) {
  const int me = comm.rank();
  const RoundGraph& g = graphs.at(me);
  auto s = cpu_fp32(x);
  std::vector<torch::Tensor> recv;
  comm.exchange(g.peers, encode_own(s, me), recv);
  for (size_t k = 0; k < recv.size(); ++k)
    if (recv[k].defined()) recv[k] = decode_from(recv[k], s.numel(), me, g.peers[k]);
  return combine(g, me, s, recv, clip_).view(x.sizes()).to(x.device());
}

namespace {
std::vector<std::vector<int>> colours_of(const std::vector<RoundGraph>& graphs) {
  std::vector<std::vector<int>> neighbours;
  for (const auto& gv : graphs) neighbours.push_back(gv.peers);
  return pair_colours(neighbours);
}
}  // namespace

void Compressor::stand_by_modulo(int64_t round, const std::vector<RoundGraph>& graphs, comm::Communicator& comm) const {
  const int me = comm.rank();
  const RoundGraph& g = graphs.at(me);  // a member that dies here lists its partners; others have none
  std::vector<torch::Tensor> recv;
  comm.exchange(g.peers, torch::Tensor(), recv);  // the first round's fp32 swap, or the grids' prelude
  if (round == 0) return;
  for (const auto& partner : colours_of(graphs)) {
    const int p = partner[me];
    comm.exchange(p < 0 ? std::vector<int>{} : std::vector<int>{p}, p < 0 ? torch::empty({0}, torch::kByte) : torch::Tensor(), recv);
    comm.exchange({}, torch::empty({0}, torch::kFloat), recv);  // its partner saw no residues: nothing to resend
  }
}

torch::Tensor Compressor::modulo(int64_t round, const std::vector<RoundGraph>& graphs, const torch::Tensor& x,
                                 comm::Communicator& comm) {
  const int me = comm.rank();
  const RoundGraph& g = graphs.at(me);
  const ModuloGrid grid{o_.codec.kind == comm::CodecKind::int8 ? 127 : 7, o_.codec.chunk};
  auto s = cpu_fp32(x);
  const auto P = static_cast<size_t>(s.numel());
  const size_t chunks = (P + grid.chunk - 1) / grid.chunk;
  const bool sized = gaps_.defined() && gaps_.numel() == static_cast<int64_t>(chunks);
  if (o_.elastic ? round == 0 : !sized) return first_modulo(g, s, grid, comm).view(x.sizes()).to(x.device());
  if (!sized) gaps_ = torch::full({static_cast<int64_t>(chunks)}, -1.0f);  // a joiner: no gaps of its own yet

  // 1. Every neighbour learns this worker's gap and max |s| per chunk: the pair's grid.
  std::vector<float> maxes;
  try {
    maxes = chunk_max_abs(grid, floats(std::as_const(s)));
  } catch (const comm::NonFiniteChunk& e) {
    non_finite(e, me, "parameters");
  }
  auto prelude = torch::empty({2 * static_cast<int64_t>(chunks)}, torch::kFloat);
  prelude.narrow(0, 0, chunks).copy_(gaps_);
  std::copy(maxes.begin(), maxes.end(), prelude.data_ptr<float>() + chunks);
  std::vector<torch::Tensor> preludes;
  comm.exchange(g.peers, prelude, preludes);
  auto failed = [&](int peer) {
    const auto k = std::find(g.peers.begin(), g.peers.end(), peer) - g.peers.begin();
    return !preludes.at(k).defined();
  };
  for (size_t k = 0; k < preludes.size(); ++k) {
    if (!preludes[k].defined()) {
      failed_edge(o_.elastic, me, g.peers[k]);
      continue;  // that pair's exchanges below send nothing
    }
    if (preludes[k].numel() != prelude.numel() || !torch::isfinite(preludes[k]).all().item<bool>())
      throw CommError(fmt::format("worker {}: the modulo codec's grid from worker {} is malformed", me, g.peers[k]),
                      "every worker must run the same gasloc and the same algo.compression settings");
  }
  auto steps_with = [&](int peer) {
    const auto k = std::find(g.peers.begin(), g.peers.end(), peer) - g.peers.begin();
    const float* theirs = preludes[k].data_ptr<float>();
    const float* gaps = gaps_.data_ptr<float>();
    std::vector<double> steps(chunks);
    for (size_t c = 0; c < chunks; ++c)
      steps[c] = modulo_step(grid, o_.margin, gaps[c], theirs[c], maxes[c], theirs[chunks + c]);
    return steps;
  };

  // 2. Per colour of the round's graph, one exchange of residues, each pair on its own grid, then
  // one of the chunks that wrapped (the same at both ends), resent in fp32: s_j - s_i is then exact
  // and d_ji = -d_ij still, so a wrap costs bytes, never the chunk's round or the mean. A pair
  // without wraps lists no peer in that second exchange and sends nothing.
  std::vector<torch::Tensor> diffs(g.peers.size());
  auto new_gaps = torch::full({static_cast<int64_t>(chunks)}, 0.0f);
  float* ng = new_gaps.data_ptr<float>();
  bool heard = false;
  const float* own = s.data_ptr<float>();
  auto chunk_span = [&](size_t c) { return std::pair{c * grid.chunk, std::min(P, (c + 1) * grid.chunk)}; };
  for (const auto& partner : colours_of(graphs)) {
    const int p = partner[me];
    std::vector<torch::Tensor> recv;
    if (p < 0 || failed(p)) {
      // Sits this colour out, or its partner's edge failed at the prelude: nothing to send or resend.
      comm.exchange(p < 0 ? std::vector<int>{} : std::vector<int>{p}, torch::empty({0}, torch::kByte), recv);
      comm.exchange({}, torch::empty({0}, torch::kFloat), recv);
      continue;
    }
    const std::vector<double> steps = steps_with(p);
    auto out = torch::empty({static_cast<int64_t>(modulo_payload_bytes(grid, P))}, torch::kByte);
    modulo_encode(grid, floats(std::as_const(s)), steps, bytes(out));
    comm.exchange({p}, out, recv);
    if (!recv.at(0).defined()) {
      failed_edge(o_.elastic, me, p);
      comm.exchange({}, torch::empty({0}, torch::kFloat), recv);  // the pair is dropped
      continue;
    }
    auto d = torch::empty_like(s);
    std::vector<uint8_t> wrapped(chunks);
    try {
      modulo_difference(grid, floats(std::as_const(s)), steps, bytes(recv[0].contiguous()), floats(d), wrapped);
    } catch (const comm::BadPayload& e) {
      bad_payload(e, me, p);
    }
    {
      // A chunk without a gap at either end (a joiner's first round) has no grid to trust: both
      // ends see it in the prelude and resend it in fp32, so d is exact there too.
      const float* theirs = preludes[std::find(g.peers.begin(), g.peers.end(), p) - g.peers.begin()].data_ptr<float>();
      const float* gaps = gaps_.data_ptr<float>();
      for (size_t c = 0; c < chunks; ++c)
        if (gaps[c] < 0 || theirs[c] < 0) wrapped[c] = 1;
    }
    std::vector<size_t> again;
    int64_t again_len = 0;
    for (size_t c = 0; c < chunks; ++c)
      if (wrapped[c]) again.push_back(c), again_len += static_cast<int64_t>(chunk_span(c).second - chunk_span(c).first);
    auto values = torch::empty({again_len}, torch::kFloat);
    float* v = values.data_ptr<float>();
    for (size_t c : again) v = std::copy(own + chunk_span(c).first, own + chunk_span(c).second, v);
    comm.exchange(again.empty() ? std::vector<int>{} : std::vector<int>{p}, values, recv);
    float* dd = d.data_ptr<float>();
    if (!again.empty()) {
      const torch::Tensor& theirs = recv.at(0);
      if (!theirs.defined() && o_.elastic) continue;  // it failed between the two exchanges: dropped
      if (!theirs.defined() || theirs.numel() != again_len || theirs.scalar_type() != torch::kFloat ||
          !torch::isfinite(theirs).all().item<bool>())
        throw CommError(fmt::format("worker {}: the chunks worker {} resent after a wrap are malformed", me, p),
                        "every worker must run the same gasloc and the same algo.compression settings");
      const float* t = theirs.contiguous().data_ptr<float>();
      for (size_t c : again)
        for (size_t i = chunk_span(c).first; i < chunk_span(c).second; ++i) dd[i] = *t++ - own[i];
      resends_ += static_cast<int64_t>(again.size());
    }
    for (size_t c = 0; c < chunks; ++c) {
      float m = 0.0f;
      for (size_t i = chunk_span(c).first; i < chunk_span(c).second; ++i) m = std::max(m, std::fabs(dd[i]));
      ng[c] = std::max(ng[c], m);
    }
    heard = true;
    diffs[std::find(g.peers.begin(), g.peers.end(), p) - g.peers.begin()] = d;
  }
  if (heard) gaps_ = new_gaps;

  if (clip_) clip_->clip_differences(g.peers, diffs);
  // 3. m_i = s_i + sum_j W_ij d_ij, in the row's order.
  auto m = s.clone();
  for (const auto& [j, w] : g.row) {
    if (j == me) continue;
    const auto k = std::find(g.peers.begin(), g.peers.end(), j) - g.peers.begin();
    if (diffs.at(k).defined()) m.add_(diffs[k], w);  // a failed edge's weight stays on W_ii (elastic)
  }
  return m.view(x.sizes()).to(x.device());
}

// The first round has no gaps to size the grids by: it goes in fp32, as today's mix, and each
// chunk's gap is measured from what arrived (every worker of a fixed membership starts together,
// and a resumed one has its gaps from the checkpoint).
torch::Tensor Compressor::first_modulo(const RoundGraph& g, const torch::Tensor& s, const ModuloGrid& grid,
                                       comm::Communicator& comm) {
  const int me = comm.rank();
  const int64_t P = s.numel(), C = static_cast<int64_t>(grid.chunk), chunks = (P + C - 1) / C;
  std::vector<torch::Tensor> recv;
  comm.exchange(g.peers, s, recv);
  auto gaps = torch::zeros({chunks}, torch::kFloat);
  for (size_t k = 0; k < recv.size(); ++k) {
    if (!recv[k].defined()) {
      failed_edge(o_.elastic, me, g.peers[k]);
      continue;  // combine() moves its weight onto W_ii
    }
    if (recv[k].numel() != P || !torch::isfinite(recv[k]).all().item<bool>()) continue;  // combine() names it
    auto d = (recv[k].to(torch::kFloat) - s).abs();
    auto padded = torch::zeros({chunks * C}, torch::kFloat);
    padded.narrow(0, 0, P).copy_(d);
    gaps = torch::maximum(gaps, std::get<0>(padded.view({chunks, C}).max(1)));
  }
  gaps_ = gaps;
  return combine(g, me, s, recv, clip_);
}

StateDict Compressor::state() const {
  StateDict s;
  if (feedback_.defined()) s["compression_feedback"] = feedback_;
  if (owner_feedback_.defined()) s["compression_owner_feedback"] = owner_feedback_;
  if (gaps_.defined()) s["compression_gaps"] = gaps_;
  if (reference_.defined()) s["compression_reference"] = reference_;
  if (o_.gossip == GossipCodec::modulo) s["compression_resends"] = torch::tensor(resends_, torch::kLong);
  return s;
}

void Compressor::load_state(const StateDict& s) {
  auto get = [&](const char* k) {
    const auto it = s.find(k);
    return it == s.end() ? torch::Tensor() : it->second.detach().to(torch::kFloat).clone();
  };
  feedback_ = get("compression_feedback");
  owner_feedback_ = get("compression_owner_feedback");
  gaps_ = get("compression_gaps");
  reference_ = get("compression_reference");
  const auto r = s.find("compression_resends");
  resends_ = r == s.end() ? 0 : r->second.item<int64_t>();
}

namespace {
// The values per chunk the codec uses: algo.compression_chunk, or (0) the codec's default.
size_t codec_chunk(const AlgoConfig& cfg, comm::Compression kind) {
  if (cfg.compression_chunk > 0) return static_cast<size_t>(cfg.compression_chunk);
  return kind == comm::Compression::topk ? 4096 : 256;
}
}  // namespace

std::optional<CompressionOptions> compression_options(const AlgoConfig& cfg) {
  const comm::Compression kind = comm::parse_compression(cfg.compression.str());
  if (kind == comm::Compression::none) return std::nullopt;
  CompressionOptions o;
  const size_t chunk = codec_chunk(cfg, kind);
  try {
    switch (kind) {
      case comm::Compression::int8: o.codec = comm::Codec::int8(chunk); break;
      case comm::Compression::int4: o.codec = comm::Codec::int4(chunk); break;
      case comm::Compression::topk: o.codec = comm::Codec::topk(cfg.topk_density, chunk); break;
      case comm::Compression::none: break;
    }
  } catch (const Error& e) {
    throw ConfigError(std::string("config key 'algo.compression_chunk' or 'algo.topk_density': ") + e.what(), e.hint());
  }
  o.gossip = static_cast<GossipCodec>(gossip_codec_choices().index(cfg.gossip_codec.str()));
  const bool gossip = !algorithm(cfg.name).all_reduces(cfg.topology);
  // Feedback helps increments (pseudo-gradients); on a state it only shifts the error (section 12).
  o.error_feedback = cfg.error_feedback == "auto" ? !gossip && kind != comm::Compression::int8 : cfg.error_feedback == "on";
  o.feedback_decay = static_cast<float>(cfg.error_feedback_decay);
  o.margin = cfg.modulo_margin;
  o.reference_every = cfg.reference_every;
  return o;
}

void check_compression_for_model(const AlgoConfig& cfg, int64_t params) {
  const comm::Compression kind = comm::parse_compression(cfg.compression.str());
  if (kind == comm::Compression::none) return;
  // Before the codec is made: a chunk beyond the model (2^63 - 1 included) is named as such.
  const size_t chunk = codec_chunk(cfg, kind);
  const std::string value = cfg.compression_chunk > 0 ? std::to_string(chunk) : fmt::format("0 (the default, {})", chunk);
  const std::string fix = fmt::format("set algo.compression_chunk between 2 and {} (0: the codec's default, 256; topk 4096)",
                                      params);
  if (chunk > static_cast<size_t>(params))
    throw ConfigError(fmt::format("config key 'algo.compression_chunk': {} values per chunk exceeds the model's {} "
                                  "parameters: every message would be padded to one whole chunk",
                                  value, params),
                      fix);
  const double bits = comm::bits_per_parameter(compression_options(cfg)->codec);
  if (bits >= 32.0)
    throw ConfigError(fmt::format("config key 'algo.compression_chunk': {} with algo.compression = {} sends {:.2f} bits "
                                  "per parameter, not fewer than fp32's 32 (the model has {} parameters)",
                                  value, cfg.compression.str(), bits, params),
                      fix + ", or algo.compression = none");
}

}  // namespace gasloc::algo
