// The modulo gossip codec; see gossip_modulo.hpp.
#include "gasloc/algo/mix/gossip_modulo.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "gasloc/algo/mix/pair_exchange.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::algo {

namespace {
ModuloGrid grid_of(const comm::Codec& codec) { return {codec.kind == comm::CodecKind::int8 ? 127 : 7, codec.chunk}; }

int64_t chunks_of(const ModuloGrid& g, int64_t p) { return (p + static_cast<int64_t>(g.chunk) - 1) / static_cast<int64_t>(g.chunk); }

[[noreturn]] void malformed(const std::string& what) {
  throw CommError(what, "every worker must run the same gasloc and the same algo.compression settings");
}
}  // namespace

ModuloGossipMix::ModuloGossipMix(topology::Topology topo, const CompressionOptions& o, std::unique_ptr<PeerClip> clip)
    : CodecGossipMix(std::move(topo), o, std::move(clip)), grid_(grid_of(o.codec)) {}

bool ModuloGossipMix::sends_fp32(int64_t t, int64_t p) const {
  if (o_.elastic) return t == 0;
  return !(gaps_.defined() && gaps_.numel() == chunks_of(grid_, p));  // as exchange() decides
}

int64_t ModuloGossipMix::message_bytes(int64_t p, torch::ScalarType, int64_t t) const {
  if (sends_fp32(t, p)) return p * static_cast<int64_t>(sizeof(float));
  return gossip_message_bytes(o_, p);
}

MixStats ModuloGossipMix::stats() const {
  MixStats s = CodecGossipMix::stats();
  s.codec_resends = resends_;
  return s;
}

void ModuloGossipMix::stand_by_exchange(int64_t t, const std::vector<RoundGraph>& graphs, comm::Communicator& comm) {
  const int me = comm.rank();
  const RoundGraph& g = graphs.at(me);  // a member that dies here lists its partners; others have none
  std::vector<torch::Tensor> recv;
  comm.exchange(g.peers, torch::Tensor(), recv);  // the first round's fp32 swap, or the grids' prelude
  if (t == 0) return;
  for (const auto& partner : pair_colours(graphs)) {
    const int p = partner[me];
    comm.exchange(p < 0 ? std::vector<int>{} : std::vector<int>{p}, p < 0 ? torch::empty({0}, torch::kByte) : torch::Tensor(), recv);
    comm.exchange({}, torch::empty({0}, torch::kFloat), recv);  // its partner saw no residues: nothing to resend
  }
}

torch::Tensor ModuloGossipMix::exchange(int64_t t, const std::vector<RoundGraph>& graphs, const torch::Tensor& s,
                                        comm::Communicator& comm) {
  const int me = comm.rank();
  const RoundGraph& g = graphs.at(me);
  const int64_t chunks = chunks_of(grid_, s.numel());
  const bool sized = gaps_.defined() && gaps_.numel() == chunks;
  if (o_.elastic ? t == 0 : !sized) return first_round(g, s, comm);
  if (!sized) gaps_ = torch::full({chunks}, -1.0f);  // a joiner: no gaps of its own yet

  // 1. Every neighbour learns this worker's gap and max |s| per chunk: the pair's grid.
  std::vector<float> maxes;
  const std::vector<torch::Tensor> preludes = swap_grids(g, s, maxes, comm);

  // 2. Per colour of the round's graph, one exchange of residues, each pair on its own grid, then
  // one of the chunks that wrapped (pair_difference). A worker that sits a colour out, or whose
  // partner's edge failed at the prelude, lists no peer and sends nothing in both.
  std::vector<torch::Tensor> diffs(g.peers.size());
  auto new_gaps = torch::full({chunks}, 0.0f);
  bool heard = false;
  for (const auto& partner : pair_colours(graphs)) {
    const int p = partner[me];
    const auto k = p < 0 ? -1 : std::find(g.peers.begin(), g.peers.end(), p) - g.peers.begin();
    if (p < 0 || !preludes.at(k).defined()) {
      std::vector<torch::Tensor> recv;
      comm.exchange(p < 0 ? std::vector<int>{} : std::vector<int>{p}, torch::empty({0}, torch::kByte), recv);
      comm.exchange({}, torch::empty({0}, torch::kFloat), recv);
      continue;
    }
    diffs[k] = pair_difference(p, preludes[k], maxes, s, comm, new_gaps);
    heard = heard || diffs[k].defined();
  }
  if (heard) gaps_ = new_gaps;
  // 3. m_i = s_i + sum_j W_ij d_ij, in the row's order.
  return add_differences(g, me, s, diffs);
}

std::vector<torch::Tensor> ModuloGossipMix::swap_grids(const RoundGraph& g, const torch::Tensor& s, std::vector<float>& maxes,
                                                       comm::Communicator& comm) {
  const int me = comm.rank();
  const int64_t chunks = gaps_.numel();
  try {
    maxes = chunk_max_abs(grid_, floats(s));
  } catch (const comm::NonFiniteChunk& e) {
    non_finite(e, me, "parameters");
  }
  auto prelude = torch::empty({2 * chunks}, torch::kFloat);
  prelude.narrow(0, 0, chunks).copy_(gaps_);
  std::copy(maxes.begin(), maxes.end(), prelude.data_ptr<float>() + chunks);
  std::vector<torch::Tensor> preludes;
  comm.exchange(g.peers, prelude, preludes);
  for (size_t k = 0; k < preludes.size(); ++k) {
    if (!preludes[k].defined()) {
      failed_edge(o_.elastic, me, g.peers[k]);
      continue;  // that pair's exchanges send nothing
    }
    if (preludes[k].numel() != prelude.numel() || !torch::isfinite(preludes[k]).all().item<bool>())
      malformed(fmt::format("worker {}: the modulo codec's grid from worker {} is malformed", me, g.peers[k]));
  }
  return preludes;
}

torch::Tensor ModuloGossipMix::pair_difference(int p, const torch::Tensor& theirs, const std::vector<float>& maxes,
                                               const torch::Tensor& s, comm::Communicator& comm, torch::Tensor& new_gaps) {
  const int me = comm.rank();
  const auto P = static_cast<size_t>(s.numel());
  const auto chunks = static_cast<size_t>(gaps_.numel());
  const float* their = theirs.data_ptr<float>();
  const float* gaps = gaps_.data_ptr<float>();
  std::vector<double> steps(chunks);
  for (size_t c = 0; c < chunks; ++c) steps[c] = modulo_step(grid_, o_.margin, gaps[c], their[c], maxes[c], their[chunks + c]);

  std::vector<torch::Tensor> recv;
  auto out = torch::empty({static_cast<int64_t>(modulo_payload_bytes(grid_, P))}, torch::kByte);
  modulo_encode(grid_, floats(s), steps, bytes(out));
  comm.exchange({p}, out, recv);
  if (!recv.at(0).defined()) {
    failed_edge(o_.elastic, me, p);
    comm.exchange({}, torch::empty({0}, torch::kFloat), recv);  // the pair is dropped
    return {};
  }
  auto d = torch::empty_like(s);
  std::vector<uint8_t> wrapped(chunks);
  try {
    modulo_difference(grid_, floats(s), steps, bytes(recv[0].contiguous()), floats(d), wrapped);
  } catch (const comm::BadPayload& e) {
    bad_payload(e, me, p);
  }
  // A chunk without a gap at either end (a joiner's first round) has no grid to trust: both ends
  // see it in the prelude and resend it in fp32, so d is exact there too.
  for (size_t c = 0; c < chunks; ++c)
    if (gaps[c] < 0 || their[c] < 0) wrapped[c] = 1;

  // The chunks that wrapped (the same at both ends), resent in fp32: s_j - s_i is then exact and
  // d_ji = -d_ij still, so a wrap costs bytes, never the chunk's round or the mean. A pair without
  // wraps lists no peer in this exchange and sends nothing.
  auto chunk_span = [&](size_t c) { return std::pair{c * grid_.chunk, std::min(P, (c + 1) * grid_.chunk)}; };
  std::vector<size_t> again;
  int64_t again_len = 0;
  for (size_t c = 0; c < chunks; ++c)
    if (wrapped[c]) again.push_back(c), again_len += static_cast<int64_t>(chunk_span(c).second - chunk_span(c).first);
  const float* own = s.data_ptr<float>();
  auto values = torch::empty({again_len}, torch::kFloat);
  float* v = values.data_ptr<float>();
  for (size_t c : again) v = std::copy(own + chunk_span(c).first, own + chunk_span(c).second, v);
  comm.exchange(again.empty() ? std::vector<int>{} : std::vector<int>{p}, values, recv);
  float* dd = d.data_ptr<float>();
  if (!again.empty()) {
    const torch::Tensor& back = recv.at(0);
    if (!back.defined() && o_.elastic) return {};  // it failed between the two exchanges: dropped
    if (!back.defined() || back.numel() != again_len || back.scalar_type() != torch::kFloat || !torch::isfinite(back).all().item<bool>())
      malformed(fmt::format("worker {}: the chunks worker {} resent after a wrap are malformed", me, p));
    const float* b = back.contiguous().data_ptr<float>();
    for (size_t c : again)
      for (size_t i = chunk_span(c).first; i < chunk_span(c).second; ++i) dd[i] = *b++ - own[i];
    resends_ += static_cast<int64_t>(again.size());
  }
  float* ng = new_gaps.data_ptr<float>();
  for (size_t c = 0; c < chunks; ++c) {
    float m = 0.0f;
    for (size_t i = chunk_span(c).first; i < chunk_span(c).second; ++i) m = std::max(m, std::fabs(dd[i]));
    ng[c] = std::max(ng[c], m);
  }
  return d;
}

// The first round has no gaps to size the grids by: it goes in fp32, as today's mix, and each
// chunk's gap is measured from what arrived (every worker of a fixed membership starts together,
// and a resumed one has its gaps from the checkpoint).
torch::Tensor ModuloGossipMix::first_round(const RoundGraph& g, const torch::Tensor& s, comm::Communicator& comm) {
  const int me = comm.rank();
  const int64_t P = s.numel(), C = static_cast<int64_t>(grid_.chunk), chunks = (P + C - 1) / C;
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
  return combine(g, me, s, recv, clip());
}

void ModuloGossipMix::save_codec(StateDict& s) const {
  if (gaps_.defined()) s["compression_gaps"] = gaps_;
  s["compression_resends"] = torch::tensor(resends_, torch::kLong);
}

void ModuloGossipMix::load_codec(const StateDict& s) {
  gaps_ = loaded_fp32(s, "compression_gaps");
  const auto r = s.find("compression_resends");
  resends_ = r == s.end() ? 0 : r->second.item<int64_t>();
}

}  // namespace gasloc::algo
