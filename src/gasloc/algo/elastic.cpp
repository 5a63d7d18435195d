#include "gasloc/algo/elastic.hpp"

#include "gasloc/comm/elastic_roster.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <bit>
#include <utility>

#include "gasloc/algo/algorithms.hpp"
#include "gasloc/algo/compression.hpp"
#include "gasloc/algo/relayed_mix.hpp"
#include "gasloc/comm/codec.hpp"
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

void check_finite(const torch::Tensor& t, int peer, const char* what) {
  if (!torch::isfinite(t).all().item<bool>())
    throw CommError(std::string(what) + ": " + (peer >= 0 ? "worker " + std::to_string(peer) : std::string("a worker")) +
                        " sent non-finite values (NaN or Inf); this worker stops the run here without mixing them (its "
                        "last committed checkpoint holds none of them)",
                    "find why that worker sent them (its own log, or faults.poison scaling its message), then resume; "
                    "algo.clip_peers = true instead drops such a message and goes on, counting it against its sender");
}

namespace {
// An all-reduce's mean, checked, back in x's dtype.
torch::Tensor checked_mean(const torch::Tensor& mean, const torch::Tensor& x, const char* what) {
  check_finite(mean, -1, what);
  return mean.scalar_type() == x.scalar_type() ? mean : mean.to(x.scalar_type());
}
}  // namespace

torch::Tensor all_reduce_mix(const torch::Tensor& x, comm::Communicator& comm, torch::ScalarType wire, const char* what) {
  torch::NoGradGuard no_grad;
  auto buf = x.to(wire, /*non_blocking=*/false, /*copy=*/true);
  comm.all_reduce_mean(buf);
  return checked_mean(buf, x, what);
}

torch::Tensor all_reduce_mix_over(const Membership& membership, const View& view, const torch::Tensor& x,
                                  comm::Communicator& comm, torch::ScalarType wire, const char* what) {
  torch::NoGradGuard no_grad;
  const bool mixes = x.defined() && view.is_member(comm.rank()) && !view.is_dying(comm.rank());
  torch::Tensor buf = mixes ? x.to(wire, /*non_blocking=*/false, /*copy=*/true) : torch::Tensor();
  // The first attempt is over the view; a member that dies there aborts it for everyone, and the
  // retry is over the survivors, so the mean is theirs and the round is not lost. An aborted
  // attempt changes nobody's tensor.
  constexpr int64_t kAttempts = comm::kAttemptsPerRound;  // call ids: the round's attempts
  View v = view;
  for (int attempt = 0;; v = membership.retry(view, ++attempt)) {
    if (attempt >= kAttempts) throw CommError(fmt::format("{}: round {} was aborted {} times", what, view.round, kAttempts));
    const bool member = mixes && v.is_member(comm.rank());
    torch::Tensor mine = member ? buf : torch::Tensor();
    if (comm.all_reduce_mean_over(mine, v.members, view.round * kAttempts + attempt)) break;
  }
  return mixes ? checked_mean(buf, x, what) : torch::Tensor();
}

namespace {
// r - the mean pseudo-gradient over `view`'s members, through the codec (Compressor::all_reduce),
// in an elastic round: an attempt over the view, then one small all-reduce in which the members
// agree whether every one of them got every payload; a failed edge anywhere, or a member that
// died, aborts the attempt for all (each puts its codec's state back), and the retry is over the
// view `membership` gives for the next attempt (the survivors). x undefined for a worker that does
// not mix; every worker of the world calls it. Returns undefined for a non-mixer.
// attempt(x or undefined, members, complete) -> the result; its state changes are put back by restore().
template <class Attempt, class Restore>
torch::Tensor agreed_over(const Membership& membership, const View& view, const torch::Tensor& x, comm::Communicator& comm,
                          const char* what, Attempt attempt_fn, Restore restore) {
  const int me = comm.rank();
  const bool mixes = x.defined() && view.is_member(me) && !view.is_dying(me);
  constexpr int64_t kAttempts = comm::kAttemptsPerRound;
  View v = view;
  for (int attempt = 0;; v = membership.retry(view, ++attempt)) {
    if (attempt >= kAttempts) throw CommError(fmt::format("{}: round {} was aborted {} times", what, view.round, kAttempts));
    const bool member = mixes && v.is_member(me);
    bool complete = false;
    torch::Tensor m = attempt_fn(member ? x : torch::Tensor(), v.members, complete);
    torch::Tensor failed = member ? torch::full({1}, complete ? 0.0f : 1.0f) : torch::Tensor();
    const bool agreed = comm.all_reduce_mean_over(failed, v.members, view.round * kAttempts + attempt);
    if (agreed && (!member || failed.item<float>() == 0.0f)) return member ? m : torch::Tensor();
    if (member) restore();
  }
}

torch::Tensor compressed_all_reduce_over(Compressor& c, const Membership& membership, const View& view, const torch::Tensor& x,
                                         const torch::Tensor& anchor, comm::Communicator& comm) {
  StateDict before;
  return agreed_over(
      membership, view, x, comm, "compressed all-reduce",
      [&](const torch::Tensor& mine, const std::vector<int>& members, bool& complete) {
        if (mine.defined()) before = c.snapshot();
        return c.all_reduce_attempt(mine, anchor, members, comm, complete);
      },
      [&] { c.load_state(before); });
}

// The delta codec's round in an elastic run: the reference refreshed over the view's members (the
// same agreement and retries; nothing to put back, as it is set only once agreed), then the
// exchange of differences, where a failed edge is dropped. x undefined for a non-mixer.
torch::Tensor delta_gossip_over(Compressor& c, const Membership& membership, const View& view, int64_t round,
                                const std::vector<RoundGraph>& graphs, const torch::Tensor& x, comm::Communicator& comm) {
  if (c.refreshes_reference(round)) {
    const torch::Tensor r = agreed_over(
        membership, view, x, comm, "delta codec's reference",
        [&](const torch::Tensor& mine, const std::vector<int>& members, bool& complete) {
          return c.reference_attempt(mine, members, comm, complete);
        },
        [] {});
    if (r.defined()) c.set_reference(r);
  }
  if (!x.defined() || !view.is_member(comm.rank()) || view.is_dying(comm.rank())) {
    std::vector<torch::Tensor> recv;  // a dying member lists its partners and sends nothing
    comm.exchange(graphs.at(comm.rank()).peers, torch::Tensor(), recv);
    return {};
  }
  return c.gossip(round, graphs, x, comm);
}
}  // namespace

RoundMixer::RoundMixer(topology::Topology topo, const Membership* membership)
    : topo_(std::move(topo)),
      membership_(membership && !membership->trivial() && !membership->restart_all() ? membership : nullptr),
      restarts_(membership && membership->restart_all() ? membership : nullptr) {}

View RoundMixer::view(int64_t round) const {
  if (membership_) return membership_->view(round);
  View v;
  v.round = round;
  for (int id = 0; id < topo_.size(); ++id) v.members.push_back(id);
  return v;
}

bool RoundMixer::mixes(int id, int64_t round) const {
  if (!membership_) return true;
  const View v = membership_->view(round);
  return v.is_member(id) && !v.is_dying(id);
}

bool RoundMixer::computes(int id, int64_t round) const { return !membership_ || membership_->computes(id, round); }

std::vector<int> RoundMixer::holders(int64_t round) const {
  std::vector<int> h;
  for (int id = 0; id < topo_.size(); ++id)
    if (computes(id, round)) h.push_back(id);
  return h;
}

RoundGraph RoundMixer::graph(int id, int64_t round) const {
  const View v = view(round);
  if (static_cast<int>(v.members.size()) == topo_.size()) return {topo_.peers(id, round), topo_.mixing_row(id, round)};
  const auto at = std::find(v.members.begin(), v.members.end(), id);
  if (at == v.members.end()) throw Error("worker " + std::to_string(id) + " is not a member of round " + std::to_string(round));
  const int k = static_cast<int>(v.members.size());
  if (k == 1) return {{}, {{id, 1.0}}};
  // Over the members' dense indices; members are ascending, so ids keep the row's order.
  const topology::Topology over(kind_for(topo_.kind(), k), k, topo_.seed());
  const int me = static_cast<int>(at - v.members.begin());
  RoundGraph g;
  for (int j : over.peers(me, round)) g.peers.push_back(v.members[j]);
  for (const auto& [j, w] : over.mixing_row(me, round)) g.row.emplace_back(v.members[j], w);
  return g;
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

void RoundMixer::compress(const CompressionOptions& o) {
  // faults.restart_all keeps every worker (it prices the restarts on the clock): compressed rounds run
  // as without faults. An elastic all-reduce retries over the survivors; compressed gossip keeps
  // state between pairs (grids, a reference) that a view change does not carry yet.
  CompressionOptions with = o;
  with.elastic = membership_ != nullptr;
  compressor_ = std::make_shared<Compressor>(with);
}

void RoundMixer::clip(double factor) {
  if (compressor_)
    throw ConfigError("config key 'algo.clip_peers': compressed rounds are not clipped (a codec's message is not the "
                      "peer's parameters until decoded against shared state)",
                      "set algo.clip_peers = false or algo.compression = none");
  if (topo_.is_all_reduce() && membership_)
    throw ConfigError("config key 'algo.clip_peers': a clipped all-reduce gathers every worker's message and is built "
                      "for a fixed membership; an elastic run changes it at rounds",
                      "set algo.clip_peers = false, or cluster.elastic = false without [faults]");
  clip_ = std::make_shared<PeerClip>(factor, topo_.size());
}

void RoundMixer::poison(std::vector<Poison> p) {
  if (compressor_ && !p.empty())
    throw ConfigError("config key 'faults.poison': compressed rounds are not poisoned (a codec's message is not the "
                      "worker's parameters)",
                      "set algo.compression = none, or remove faults.poison");
  poisons_ = std::move(p);
}

int64_t RoundMixer::message_bytes(int64_t p, torch::ScalarType wire, int64_t round) const {
  if (!compressor_) return p * static_cast<int64_t>(c10::elementSize(wire));
  if (topo_.is_all_reduce()) return static_cast<int64_t>(comm::payload_bytes(compressor_->options().codec, static_cast<size_t>(p)));
  if (compressor_->sends_fp32(round, p)) return p * static_cast<int64_t>(sizeof(float));
  return compressor_->gossip_bytes(p, 1);
}

std::function<torch::Tensor(comm::Communicator&)> RoundMixer::compressed_mix(int64_t round, const torch::Tensor& x,
                                                                            const torch::Tensor& anchor) const {
  if (topo_.is_all_reduce()) {
    if (!anchor.defined() && x.defined()) throw Error("RoundMixer::mix: a compressed all-reduce needs the anchor", "internal: pass theta");
    if (membership_)
      return [c = compressor_, m = membership_, v = view(round), x, anchor](comm::Communicator& comm) {
        const torch::Tensor mixed = compressed_all_reduce_over(*c, *m, v, x, anchor, comm);
        return mixed.defined() ? mixed.to(x.scalar_type()) : mixed;
      };
    return [c = compressor_, x, anchor, members = view(round).members](comm::Communicator& comm) {
      return c->all_reduce(x, anchor, members, comm).to(x.scalar_type());
    };
  }
  // Every worker's graph (the modulo codec pairs them by colours); one outside the view has none.
  const View v = view(round);
  std::vector<RoundGraph> graphs;
  for (int id = 0; id < topo_.size(); ++id) graphs.push_back(v.is_member(id) ? graph(id, round) : RoundGraph{});
  if (membership_ && compressor_->options().gossip == GossipCodec::delta)
    return [c = compressor_, m = membership_, v, x, round, graphs = std::move(graphs)](comm::Communicator& comm) {
      const torch::Tensor mixed = delta_gossip_over(*c, *m, v, round, graphs, x, comm);
      return mixed.defined() ? mixed.to(x.scalar_type()) : mixed;
    };
  return [c = compressor_, x, round, graphs = std::move(graphs)](comm::Communicator& comm) {
    const torch::Tensor m = c->gossip(round, graphs, x, comm);
    return m.defined() ? m.to(x.scalar_type()) : m;
  };
}

torch::Tensor RoundMixer::mix(int64_t round, const torch::Tensor& x, comm::Communicator& comm, torch::ScalarType wire,
                              const torch::Tensor& anchor) const {
  torch::NoGradGuard no_grad;
  if (compressor_) return compressed_mix(round, x, anchor)(comm);
  const int me = comm.rank();
  // faults.poison: what this worker sends is scaled; its own term stays x.
  const double pf = poison_factor(poisons_, me, round);
  const torch::Tensor sent = pf == 1.0 ? x : x * pf;
  if (topo_.is_all_reduce()) {
    std::vector<int> others;
    for (int id = 0; id < topo_.size(); ++id)
      if (id != me) others.push_back(id);
    note_senders(round, others, x, {});
  }
  if (topo_.is_all_reduce() && clip_) return clipped_all_gather(x, sent, comm, wire, anchor);
  if (topo_.is_all_reduce())
    return membership_ ? all_reduce_mix_over(*membership_, view(round), sent, comm, wire, "all-reduce")
                       : all_reduce_mix(sent, comm, wire, "all-reduce");
  const RoundGraph g = graph(me, round);
  std::vector<torch::Tensor> recv;
  comm.exchange(g.peers, wire == sent.scalar_type() ? sent : sent.to(wire), recv);
  note_senders(round, g.peers, x, recv);
  return combine(g, me, x, recv, clip_.get());
}

namespace {
// The largest |value| of t: two reductions, no copy of t.
double max_abs(const torch::Tensor& t) {
  const auto [lo, hi] = torch::aminmax(t);
  return std::max(-lo.item<double>(), hi.item<double>());
}
}  // namespace

void RoundMixer::note_senders(int64_t round, const std::vector<int>& senders, const torch::Tensor& x,
                              const std::vector<torch::Tensor>& recv) const {
  MessageSuspect found;
  const double own = recv.empty() || !x.defined() ? 0.0 : max_abs(x);
  for (size_t k = 0; k < senders.size(); ++k) {
    MessageSuspect s{senders[k], round, 0.0, poison_factor(poisons_, senders[k], round)};
    if (k < recv.size() && recv[k].defined() && own > 0) s.ratio = max_abs(recv[k]) / own;
    const bool stands_out = s.poison != 1.0 || s.ratio >= kOutlierRatio;
    if (stands_out && (found.sender < 0 || s.ratio > found.ratio)) found = s;
  }
  *suspect_ = found;
}

std::optional<MessageSuspect> RoundMixer::suspect() const {
  if (suspect_->sender < 0) return std::nullopt;
  return *suspect_;
}

torch::Tensor RoundMixer::clipped_all_gather(const torch::Tensor& x, const torch::Tensor& sent, comm::Communicator& comm,
                                             torch::ScalarType wire, const torch::Tensor& anchor) const {
  if (!anchor.defined()) throw Error("RoundMixer::mix: a clipped all-reduce needs the anchor", "internal: pass theta");
  const int me = comm.rank(), n = topo_.size();
  std::vector<int> others;
  for (int id = 0; id < n; ++id)
    if (id != me) others.push_back(id);
  std::vector<torch::Tensor> recv;
  comm.exchange(others, sent.to(wire), recv);
  // Every worker's message as every other worker sees it (its own too: cast to the wire and back),
  // so that all of them clip and sum the same bits.
  std::vector<torch::Tensor> msgs;
  for (int id = 0, k = 0; id < n; ++id) {
    if (id == me) {
      msgs.push_back(x.to(wire).to(x.scalar_type()));
      continue;
    }
    torch::Tensor& r = recv[static_cast<size_t>(k++)];
    if (!r.defined())
      throw CommError(fmt::format("clipped all-reduce: worker {} sent nothing", id), "a clipped all-reduce needs every worker");
    // A non-finite message is dropped by every worker alike (each sees the same bits): the mean is the others'.
    msgs.push_back(clip_->accept_finite(r, id) ? r.to(x.scalar_type()) : torch::Tensor());
  }
  return clip_->clipped_mean(anchor.to(x.scalar_type()), msgs);
}

MixInFlight RoundMixer::start_mix(int64_t round, const torch::Tensor& x, comm::Communicator& comm, torch::ScalarType wire,
                                  const torch::Tensor& anchor) const {
  TORCH_CHECK(!membership_, "RoundMixer::start_mix: overlapped rounds have a fixed membership");
  torch::NoGradGuard no_grad;
  MixInFlight f;
  f.x = x;
  if (compressor_) {
    // The anchor (theta) is copied: the relayed mix reads it while the worker trains.
    f.relay = std::make_shared<RelayedMix>(comm, compressed_mix(round, x, anchor.defined() ? anchor.clone() : anchor));
    return f;
  }
  TORCH_CHECK(!clip_ || !topo_.is_all_reduce(), "RoundMixer::start_mix: a clipped all-reduce does not overlap (AlgoConfig refuses it)");
  const double pf = poison_factor(poisons_, comm.rank(), round);
  const torch::Tensor sent = pf == 1.0 ? x : x * pf;
  if (topo_.is_all_reduce()) {
    f.buf = sent.to(wire, /*non_blocking=*/false, /*copy=*/true);
    f.pending = comm.start_all_reduce_mean(f.buf);
    return f;
  }
  f.graph = graph(comm.rank(), round);
  f.buf = wire == sent.scalar_type() ? sent : sent.to(wire);  // kept alive while it travels
  f.pending = comm.start_exchange(f.graph.peers, f.buf, f.recv);
  return f;
}

void RoundMixer::progress(MixInFlight& f) const {
  if (f.relay) f.relay->progress();
}

torch::Tensor RoundMixer::finish_mix(MixInFlight& f, int me) const {
  torch::NoGradGuard no_grad;
  if (f.relay) {
    torch::Tensor m = f.relay->finish();
    f.relay.reset();
    return m;
  }
  f.pending->wait();
  f.pending.reset();
  if (topo_.is_all_reduce()) return checked_mean(f.buf, f.x, "all-reduce");
  return combine(f.graph, me, f.x, f.recv, clip_.get());
}

void RoundMixer::stand_by(int64_t round, comm::Communicator& comm) const {
  const View v = view(round);
  const int me = comm.rank();
  if (compressor_ && topo_.is_all_reduce()) {
    compressed_mix(round, torch::Tensor(), torch::Tensor())(comm);
    return;
  }
  if (compressor_ && compressor_->options().gossip != GossipCodec::direct) {
    compressed_mix(round, torch::Tensor(), torch::Tensor())(comm);  // the round's exchanges, sending nothing
    return;
  }
  // Direct gossip is one exchange, as below.
  if (topo_.is_all_reduce()) {
    all_reduce_mix_over(*membership_, v, torch::Tensor(), comm, torch::kFloat, "all-reduce");
    return;
  }
  std::vector<torch::Tensor> recv;
  // A dying member lists its partners and sends nothing (they see the failed edge); the others have no edges.
  comm.exchange(v.is_member(me) ? graph(me, round).peers : std::vector<int>{}, torch::Tensor(), recv);
}

std::optional<HealPlan> heal_plan(const View& v, int id) {
  if (v.joining.empty()) return std::nullopt;
  HealPlan p;
  if (v.is_joining(id)) {
    p.peers = {v.donor(id)};
    p.receives = true;
    return p;
  }
  for (int j : v.joining)
    if (v.donor(j) == id) p.peers.push_back(j);
  return p;
}

void ViewSync::ended(int64_t t, comm::Communicator& comm) {
  ended_ = t;
  const Membership* m = mixer_.restarts();
  if (!m) return;
  const RestartAll& r = *m->restart_all();
  if (m->fails_at(t)) {
    comm.barrier();  // the job stops: it restarts once its slowest worker has stopped too
    comm.pause(r.delay_s + comm.now() - checkpoint_clock_);
  }
  if (r.checkpoint_every_rounds > 0 && (t + 1) % r.checkpoint_every_rounds == 0) {
    comm.barrier();  // a checkpoint commits when every worker has written it
    checkpoint_clock_ = comm.now();
  }
}

void ViewSync::save_compression(StateDict& s) const {
  if (const Compressor* c = mixer_.compressor())
    for (auto& [k, t] : c->state()) s[k] = t;
}

void ViewSync::load_compression(const StateDict& s) {
  if (Compressor* c = mixer_.compressor()) c->load_state(s);
}

std::optional<std::vector<int64_t>> ViewSync::clipped_from() const {
  if (const PeerClip* c = mixer_.clipper()) return c->clipped_from();
  return std::nullopt;
}

std::optional<std::vector<int64_t>> ViewSync::dropped_from() const {
  if (const PeerClip* c = mixer_.clipper()) return c->dropped_from();
  return std::nullopt;
}

void ViewSync::save_clip(StateDict& s) const {
  if (const PeerClip* c = mixer_.clipper()) c->save(s);
}

void ViewSync::load_clip(const StateDict& s) {
  if (PeerClip* c = mixer_.clipper()) c->load(s);
}

std::optional<int64_t> ViewSync::codec_resends() const {
  const Compressor* c = mixer_.compressor();
  if (!c || c->options().gossip != GossipCodec::modulo || mixer_.topology().is_all_reduce()) return std::nullopt;
  return c->resends();
}

void ViewSync::save_restart_clock(StateDict& s) const {
  if (mixer_.restarts()) s["restart_checkpoint_clock"] = torch::tensor(checkpoint_clock_, torch::kFloat64);
}

void ViewSync::load_restart_clock(const StateDict& s) {
  if (!mixer_.restarts()) return;
  const auto it = s.find("restart_checkpoint_clock");
  checkpoint_clock_ = it == s.end() ? 0.0 : it->second.item<double>();
}

std::optional<View> ViewSync::take_ended_view() {
  if (!mixer_.elastic() || ended_ < 0) return std::nullopt;
  const int64_t t = std::exchange(ended_, -1);
  return mixer_.view(t);
}

std::optional<std::vector<int>> ViewSync::holders() const {
  if (!mixer_.elastic()) return std::nullopt;
  return mixer_.holders(current_round());
}

bool ViewSync::stood_by(int64_t t, FlatParams& params, comm::Communicator& comm) {
  if (mixer_.mixes(comm.rank(), t)) return false;
  mixer_.stand_by(t, comm);
  // A worker that dies loses its state; a joiner's comes from its donor.
  if (mixer_.view(t).is_dying(comm.rank())) {
    torch::NoGradGuard no_grad;
    params.data().zero_();
  }
  return true;
}

}  // namespace gasloc::algo
