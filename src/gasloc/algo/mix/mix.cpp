// What every Mix shares; see mix.hpp.
#include "gasloc/algo/mix/mix.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <bit>

#include "gasloc/algo/peer_clip.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::algo {

namespace {
// The kind a topology takes over k members: the requested one where it has a graph, else 1peer.
topology::Kind kind_for(topology::Kind kind, int k) {
  using topology::Kind;
  if (kind == Kind::exp && !std::has_single_bit(static_cast<unsigned>(k))) return Kind::one_peer;
  if (kind == Kind::two_peer && k == 2) return Kind::one_peer;  // 2peer's own fallback, without its warning every round
  return kind;
}
}  // namespace

RoundGraph round_graph(const topology::Topology& topo, const std::vector<int>& members, int id, int64_t round) {
  if (members.empty() || static_cast<int>(members.size()) == topo.size())
    return {topo.peers(id, round), topo.mixing_row(id, round)};
  const auto at = std::find(members.begin(), members.end(), id);
  if (at == members.end()) throw Error("worker " + std::to_string(id) + " is not a member of round " + std::to_string(round));
  const int k = static_cast<int>(members.size());
  if (k == 1) return {{}, {{id, 1.0}}};
  // Over the members' dense indices; members are ascending, so ids keep the row's order.
  const topology::Topology over(kind_for(topo.kind(), k), k, topo.seed());
  const int me = static_cast<int>(at - members.begin());
  RoundGraph g;
  for (int j : over.peers(me, round)) g.peers.push_back(members[j]);
  for (const auto& [j, w] : over.mixing_row(me, round)) g.row.emplace_back(members[j], w);
  return g;
}

bool Mix::stand_by(int64_t t, comm::Communicator& comm) {
  MixRound r;
  r.t = t;
  mix(r, comm);
  return false;
}

MixAttempt Mix::collective_attempt(const MixRound&, comm::Communicator&) {
  throw Error("Mix::collective_attempt: this exchange has no collective part", "internal: check has_collective() first");
}

int64_t Mix::message_bytes(int64_t p, torch::ScalarType wire, int64_t) const {
  return p * static_cast<int64_t>(c10::elementSize(wire));
}

void check_finite(const torch::Tensor& t, int peer, const char* what) {
  if (!torch::isfinite(t).all().item<bool>())
    throw CommError(std::string(what) + ": " + (peer >= 0 ? "worker " + std::to_string(peer) : std::string("a worker")) +
                        " sent non-finite values (NaN or Inf); this worker stops the run here without mixing them (its "
                        "last committed checkpoint holds none of them)",
                    "find why that worker sent them (its own log, or faults.poison scaling its message), then resume; "
                    "algo.clip_peers = true instead drops such a message and goes on, counting it against its sender");
}

torch::Tensor checked_mean(const torch::Tensor& mean, const torch::Tensor& x, const char* what) {
  check_finite(mean, -1, what);
  return mean.scalar_type() == x.scalar_type() ? mean : mean.to(x.scalar_type());
}

torch::Tensor combine(const RoundGraph& g, int me, const torch::Tensor& x, std::vector<torch::Tensor>& recv, PeerClip* clip) {
  for (size_t k = 0; k < g.peers.size(); ++k) {
    if (!recv[k].defined()) continue;  // a failed edge: the peer died at this exchange
    // Clipping drops a non-finite message: a failed edge, its weight on W_ii, as for a dead peer.
    if (clip && !clip->accept_finite(recv[k], g.peers[k])) {
      recv[k] = torch::Tensor();
      continue;
    }
    check_finite(recv[k], g.peers[k], "gossip exchange");
    if (recv[k].scalar_type() != x.scalar_type()) recv[k] = recv[k].to(x.scalar_type());
  }
  // Beside the non-finite check: a finite message of any size is bounded here, before it is mixed.
  if (clip) clip->clip_received(g.peers, x, recv);
  // The tensor behind each entry of the row (undefined for a failed edge), found once.
  std::vector<const torch::Tensor*> src;
  for (const auto& [j, w] : g.row)
    src.push_back(j == me ? &x : &recv[std::find(g.peers.begin(), g.peers.end(), j) - g.peers.begin()]);
  // W_ij of a failed edge moves onto W_ii: with both ends seeing it, W stays symmetric and doubly stochastic.
  double self_weight = 0.0;
  for (size_t k = 0; k < g.row.size(); ++k)
    if (g.row[k].first == me || !src[k]->defined()) self_weight += g.row[k].second;
  torch::Tensor m;
  for (size_t k = 0; k < g.row.size(); ++k) {
    if (!src[k]->defined()) continue;
    const double weight = g.row[k].first == me ? self_weight : g.row[k].second;
    if (!m.defined()) m = *src[k] * weight;
    else m.add_(*src[k], weight);
  }
  return m;
}

}  // namespace gasloc::algo
