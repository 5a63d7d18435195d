// One Mix (docs/design.md section 10, "One Mix"): every exchange a round can make is an object of
// its own behind this interface, built by make_mix (make_mix.hpp), the one place where
// combinations are accepted or refused. A synchronizer holds one Mix and never sees which
// exchange, codec or membership it runs:
//   start(round) -> progress() between inner steps -> finish() = m
// A blocking round is finish(start(...)) with round.overlapped false: the exchange runs inside
// start. Elastic membership is one wrapper (ElasticMix, elastic_mix.hpp) around any Mix: it gives
// the inner Mix each attempt's members and retries what must be all or nothing.
#pragma once
#include <torch/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gasloc/algo/membership.hpp"
#include "gasloc/algo/mix/stats.hpp"
#include "gasloc/comm/communicator.hpp"
#include "gasloc/topology/topology.hpp"

namespace gasloc::algo {

using StateDict = std::map<std::string, torch::Tensor>;
class RelayedMix;

// One worker's part in a round's gossip: its neighbours and its row of W_t, ids ascending.
struct RoundGraph {
  std::vector<int> peers;
  topology::Row row;
};

// Worker `id`'s neighbours and row in round t over `members` (ids ascending; empty: every
// worker): the topology over the members' dense indices (a random graph drawn for their count,
// exp falling back to 1peer when the count is not a power of two, a lone member without peers).
// Over every worker, the topology's own graph.
RoundGraph round_graph(const topology::Topology& topo, const std::vector<int>& members, int id, int64_t round);

// One round's mix as its caller asks for it.
struct MixRound {
  int64_t t = 0;
  torch::Tensor x = {};                    // the own term; undefined: this worker sends nothing (stands by)
  torch::ScalarType wire = torch::kFloat;  // what an uncompressed message travels as
  torch::Tensor anchor = {};               // theta, which every member holds: what an all-reduce of pseudo-gradients needs
  bool overlapped = false;                 // start() only starts the exchange; finish() waits for it
  // Set by ElasticMix: the attempt's members (empty: every worker) and the collective's call id
  // (-1: a fixed world, where a failed edge is an error).
  std::vector<int> members = {};
  int64_t call_id = -1;
};

// A round started and not finished. Each Mix fills what its finish() needs.
struct MixFlight {
  torch::Tensor result;             // m once known (a blocking round: from start)
  torch::Tensor x;                  // the own term: the snapshot sent
  int me = -1;
  RoundGraph graph;                 // gossip: the peers sent to and the row
  std::vector<torch::Tensor> recv;  // gossip: the peers' tensors, after wait
  torch::Tensor buf;                // x in the wire dtype as sent; all-reduce: the mean after wait
  std::unique_ptr<comm::Pending> pending;
  std::shared_ptr<RelayedMix> relay;  // a mix of several exchanges, relayed (overlapped.hpp)
};

// One attempt of a round's collective part in an elastic round (ElasticMix retries it).
struct MixAttempt {
  torch::Tensor m;         // its result (undefined for a non-member or an incomplete attempt)
  bool complete = true;    // this worker got every payload
  bool self_agreed = true; // every member learnt `complete` from the collective itself (no vote needed)
  bool ends_round = true;  // m is the round's result; false: m feeds the round's edge part (collective_agreed)
  const char* what = "round";  // the collective, for errors
};

class Mix {
 public:
  virtual ~Mix() = default;

  // --- a round: m = the mix of x (see MixRound); every worker of the world calls it.
  virtual MixFlight start(const MixRound& r, comm::Communicator& comm) = 0;
  // Between inner steps: lands what has arrived and starts what comes next. Never waits.
  virtual void progress(MixFlight& f) {}
  virtual torch::Tensor finish(MixFlight& f) = 0;
  torch::Tensor mix(const MixRound& r, comm::Communicator& comm) {
    MixFlight f = start(r, comm);
    return finish(f);
  }
  // Round t's collectives for a worker that does not mix in it (it dies at its merge, is dead,
  // or joins): it sends nothing, so its partners see a failed edge. True when this worker's
  // model dies here.
  virtual bool stand_by(int64_t t, comm::Communicator& comm);

  // --- elastic rounds (ElasticMix): the part of round r that the members complete all together or
  // not at all (an all-reduce, the delta codec's reference refresh), one attempt of it, and what
  // an agreed result of a collective that does not end the round is.
  virtual bool has_collective(int64_t t) const { return false; }
  virtual MixAttempt collective_attempt(const MixRound& r, comm::Communicator& comm);
  virtual void collective_agreed(const torch::Tensor& m) {}
  // Whether an aborted attempt must put the state back (ElasticMix snapshots state() before it).
  virtual bool restores_state() const { return false; }

  // --- membership as the synchronizer sees it (a fixed world: everyone, every round).
  virtual bool mixes(int id, int64_t t) const { return true; }
  virtual bool computes(int id, int64_t t) const { return true; }
  // Elastic runs only (nullopt otherwise): round t's view, and the workers holding a trained model
  // while round t runs (before its merge).
  virtual std::optional<View> view(int64_t t) const { return std::nullopt; }
  virtual std::optional<std::vector<int>> holders(int64_t t) const { return std::nullopt; }
  // Round t has ended on this worker (stop-and-resume prices its restarts here).
  virtual void ended(int64_t t, comm::Communicator& comm) {}

  // Bytes round t's message takes per neighbour (gossip) or as a ring all-reduce's P, for a
  // message of p parameters in `wire`: what the time-budget policy prices.
  virtual int64_t message_bytes(int64_t p, torch::ScalarType wire, int64_t t) const;
  // Whether start() needs r.anchor (an all-reduce of pseudo-gradients).
  virtual bool needs_anchor() const { return false; }
  // State that checkpoints carry (keys unprefixed), and the counts.
  virtual StateDict state() const { return {}; }
  virtual void load_state(const StateDict& s) {}
  virtual MixStats stats() const { return {}; }
  // A donor's `state` (keys prefixed by `prefix`) as a joiner receives it: what is the donor's own
  // is removed, what the job shares is kept (a placeholder of a model of `params` where the donor
  // has none yet, so that both ends pack the same keys).
  virtual void keep_for_joiner(StateDict& state, const std::string& prefix, int64_t params) const {}
};

// A Mix around another, forwarding everything it does not change (ElasticMix, OverlappedMix).
class MixWrapper : public Mix {
 public:
  explicit MixWrapper(std::unique_ptr<Mix> inner) : inner_(std::move(inner)) {}
  MixFlight start(const MixRound& r, comm::Communicator& comm) override { return inner_->start(r, comm); }
  void progress(MixFlight& f) override { inner_->progress(f); }
  torch::Tensor finish(MixFlight& f) override { return inner_->finish(f); }
  bool stand_by(int64_t t, comm::Communicator& comm) override { return inner_->stand_by(t, comm); }
  bool has_collective(int64_t t) const override { return inner_->has_collective(t); }
  MixAttempt collective_attempt(const MixRound& r, comm::Communicator& comm) override { return inner_->collective_attempt(r, comm); }
  void collective_agreed(const torch::Tensor& m) override { inner_->collective_agreed(m); }
  bool restores_state() const override { return inner_->restores_state(); }
  bool mixes(int id, int64_t t) const override { return inner_->mixes(id, t); }
  bool computes(int id, int64_t t) const override { return inner_->computes(id, t); }
  std::optional<View> view(int64_t t) const override { return inner_->view(t); }
  std::optional<std::vector<int>> holders(int64_t t) const override { return inner_->holders(t); }
  void ended(int64_t t, comm::Communicator& comm) override { inner_->ended(t, comm); }
  int64_t message_bytes(int64_t p, torch::ScalarType wire, int64_t t) const override { return inner_->message_bytes(p, wire, t); }
  bool needs_anchor() const override { return inner_->needs_anchor(); }
  StateDict state() const override { return inner_->state(); }
  void load_state(const StateDict& s) override { inner_->load_state(s); }
  MixStats stats() const override { return inner_->stats(); }
  void keep_for_joiner(StateDict& state, const std::string& prefix, int64_t params) const override {
    inner_->keep_for_joiner(state, prefix, params);
  }
  const Mix& inner() const { return *inner_; }

 protected:
  std::unique_ptr<Mix> inner_;
};

// Non-finite values from `peer` (-1: unknown, an all-reduce's mean) are a CommError naming it.
void check_finite(const torch::Tensor& t, int peer, const char* what);
// An all-reduce's mean, checked, back in x's dtype.
torch::Tensor checked_mean(const torch::Tensor& mean, const torch::Tensor& x, const char* what);

class PeerClip;
// m = sum_j W[me, j] x_j over g's row (own term x), from what arrived in `recv` (g.peers' order;
// an undefined entry is a failed edge, whose weight moves onto W_ii). Non-finite peers are refused.
// With `clip` (algo.clip_peers), each finite message is clipped first (PeerClip::clip_received).
torch::Tensor combine(const RoundGraph& g, int me, const torch::Tensor& x, std::vector<torch::Tensor>& recv,
                      PeerClip* clip = nullptr);

}  // namespace gasloc::algo
