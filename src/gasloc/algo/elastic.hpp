// Rounds over a view (docs/design.md section 10): the graph, the mix and the all-reduce of a
// round whose members are a subset of the workers, with failed edges, aborted all-reduces and the
// state transfer to a joiner. Every synchronizer mixes through a RoundMixer; without a membership
// (an elastic run with no faults, or a run that is not elastic) the view is every worker every
// round and each function does exactly what the fixed-membership path does, bit for bit.
#pragma once
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "gasloc/algo/membership.hpp"
#include "gasloc/algo/peer_clip.hpp"
#include "gasloc/algo/synchronizer.hpp"
#include "gasloc/comm/communicator.hpp"
#include "gasloc/topology/topology.hpp"

namespace gasloc::algo {

// One worker's part in a round's gossip: its neighbours and its row of W_t, ids ascending.
struct RoundGraph {
  std::vector<int> peers;
  topology::Row row;
};

class RelayedMix;

// A round's mix started and not finished (algo.overlap_steps, fixed membership only).
struct MixInFlight {
  torch::Tensor x;                  // the own term: the snapshot sent
  RoundGraph graph;                 // gossip: the peers sent to and the row
  std::vector<torch::Tensor> recv;  // gossip: the peers' tensors, after wait
  torch::Tensor buf;                // x in the wire dtype as sent; all-reduce: the mean after wait
  std::unique_ptr<comm::Pending> pending;
  std::shared_ptr<RelayedMix> relay;  // a compressed round instead: its exchanges in turn
};

class Compressor;
struct CompressionOptions;

// m = sum_j W[me, j] x_j over g's row (own term x), from what arrived in `recv` (g.peers' order;
// an undefined entry is a failed edge, whose weight moves onto W_ii). Non-finite peers are refused.
// With `clip` (algo.clip_peers), each finite message is clipped first (PeerClip::clip_received).
torch::Tensor combine(const RoundGraph& g, int me, const torch::Tensor& x, std::vector<torch::Tensor>& recv,
                      PeerClip* clip = nullptr);

class RoundMixer {
 public:
  // membership: nullptr for a fixed world (every worker in every round).
  RoundMixer(topology::Topology topo, const Membership* membership);

  const topology::Topology& topology() const { return topo_; }
  bool elastic() const { return membership_ != nullptr; }
  // The stop-and-resume schedule whose restarts the clocks pay (nullptr: none).
  const Membership* restarts() const { return restarts_; }
  View view(int64_t round) const;
  // Whether `id` takes part in round t's mix with a model of its own (a member that survives it).
  bool mixes(int id, int64_t round) const;
  // Whether `id` computes round t's local steps.
  bool computes(int id, int64_t round) const;
  // The workers holding a trained model while round t runs (before its merge).
  std::vector<int> holders(int64_t round) const;

  // Worker `id`'s neighbours and row in round t: the topology over the view's members (ids
  // ascending; a random graph drawn for their count, exp falling back to 1peer when the count is
  // not a power of two, a lone member without peers).
  RoundGraph graph(int id, int64_t round) const;
  // m = sum_j W_t[me, j] x_j over round t's view (j ascending), x sent as `wire`; the weight of a
  // failed edge (a peer that died at this exchange) moves onto W_ii. An all-reduce topology
  // averages over the members, retrying over the survivors when one dies. Non-finite messages are
  // rejected naming the peer. With a codec (compress()), the compressed round of compression.hpp:
  // an all-reduce then averages anchor - x, the pseudo-gradient (anchor: theta, which every
  // member holds), and returns anchor - its mean.
  torch::Tensor mix(int64_t round, const torch::Tensor& x, comm::Communicator& comm, torch::ScalarType wire,
                    const torch::Tensor& anchor = {}) const;
  // Rounds go through a codec from now on (elastic runs too: every codec).
  void compress(const CompressionOptions& o);
  Compressor* compressor() const { return compressor_.get(); }
  // algo.clip_peers: what peers send is clipped (peer_clip.hpp). Uncompressed, blocking rounds;
  // an all-reduce also needs a fixed membership and the anchor in mix() (AlgoConfig refuses the rest).
  void clip(double factor);
  PeerClip* clipper() const { return clip_.get(); }
  // faults.poison: this worker's messages are scaled at the rounds given.
  void poison(std::vector<Poison> p);
  // The sender whose message stood out in the last mix() (MessageSuspect), if one did.
  std::optional<MessageSuspect> suspect() const;
  // The bytes round `round`'s message takes per neighbour (gossip) or as a ring all-reduce's P,
  // for a message of p parameters in `wire`: what the time-budget policy prices (the modulo
  // codec's first round in fp32; its resends, which depend on the data, are not foreseen).
  int64_t message_bytes(int64_t p, torch::ScalarType wire, int64_t round) const;
  // mix() in two halves for a fixed membership: start_mix starts the exchange (or all-reduce) of
  // x, which must be a snapshot nothing modifies until finish_mix; finish_mix waits for it and
  // returns the same m as mix(), bit for bit. A compressed round's several exchanges go one after
  // another (relayed_mix.hpp): progress(), between inner steps, starts each once the one before
  // has landed. `anchor` as in mix(); start_mix keeps its own copy.
  MixInFlight start_mix(int64_t round, const torch::Tensor& x, comm::Communicator& comm, torch::ScalarType wire,
                        const torch::Tensor& anchor = {}) const;
  void progress(MixInFlight& f) const;
  torch::Tensor finish_mix(MixInFlight& f, int me) const;
  // Round t's collectives for a worker that does not mix in it (it dies at its merge, is dead, or
  // joins): it sends nothing, so its partners see a failed edge.
  void stand_by(int64_t round, comm::Communicator& comm) const;

 private:
  // A clipped all-reduce: every worker's message to every other, each pseudo-gradient clipped,
  // summed in id order (PeerClip::clipped_mean).
  torch::Tensor clipped_all_gather(const torch::Tensor& x, const torch::Tensor& sent, comm::Communicator& comm,
                                   torch::ScalarType wire, const torch::Tensor& anchor) const;
  // A compressed round of x as a function of the communicator, holding what it reads (the
  // codec's state is shared with this mixer): mix() calls it at once, start_mix() relays it.
  std::function<torch::Tensor(comm::Communicator&)> compressed_mix(int64_t round, const torch::Tensor& x,
                                                                   const torch::Tensor& anchor) const;
  // Records which of `senders` (recv: what each sent, gossip; empty: an all-reduce, where only a
  // poison is known) stood out in round t's mix of x, for suspect().
  void note_senders(int64_t round, const std::vector<int>& senders, const torch::Tensor& x,
                    const std::vector<torch::Tensor>& recv) const;

  topology::Topology topo_;
  const Membership* membership_;
  const Membership* restarts_;
  std::shared_ptr<Compressor> compressor_;  // shared by copies of the mixer, which one worker owns
  std::shared_ptr<PeerClip> clip_;          // likewise
  std::vector<Poison> poisons_;
  std::shared_ptr<MessageSuspect> suspect_ = std::make_shared<MessageSuspect>();  // the last mix's; sender -1: none
};

// Worker `id`'s part in the state transfer after a round of `view`, when it has joiners.
std::optional<HealPlan> heal_plan(const View& view, int id);

// What every algorithm shares in an elastic run: its rounds' views through a RoundMixer, a
// worker that does not mix in a round standing by in its collectives, and the round that just
// ended, reported once.
class ViewSync : public Synchronizer {
 public:
  explicit ViewSync(RoundMixer mixer) : mixer_(std::move(mixer)) {}
  std::optional<View> take_ended_view() override;
  std::optional<std::vector<int>> holders() const override;
  std::optional<int64_t> codec_resends() const override;
  std::optional<std::vector<int64_t>> clipped_from() const override;
  std::optional<std::vector<int64_t>> dropped_from() const override;
  std::optional<MessageSuspect> message_suspect() const override { return mixer_.suspect(); }

 protected:
  // The round this worker is in now (the next to end).
  virtual int64_t current_round() const = 0;
  // Round t for a worker that does not mix in it: stands by in its collectives and drops its
  // model if it dies there. True when it did.
  bool stood_by(int64_t t, FlatParams& params, comm::Communicator& comm);
  // Round t has ended on this worker; under stop-and-resume its clock pays a restart (RestartAll).
  void ended(int64_t t, comm::Communicator& comm);
  // Stop-and-resume: the clock when the last checkpoint committed, which checkpoints carry.
  void save_restart_clock(StateDict& s) const;
  void load_restart_clock(const StateDict& s);
  // The codec's state (error feedback, grids), which checkpoints carry.
  void save_compression(StateDict& s) const;
  void load_compression(const StateDict& s);
  // algo.clip_peers' counts and window, which checkpoints carry (nothing without it).
  void save_clip(StateDict& s) const;
  void load_clip(const StateDict& s);

 public:
  // Every round of this worker goes through a codec (algo.compression).
  void compress(const CompressionOptions& o) { mixer_.compress(o); }
  void clip(double factor) { mixer_.clip(factor); }
  void poison(std::vector<Poison> p) { mixer_.poison(std::move(p)); }

 protected:

  RoundMixer mixer_;

 private:
  int64_t ended_ = -1;  // the round that ended at this step, until take_ended_view
  double checkpoint_clock_ = 0;
};

// mean_i x_i over `view`'s members by all-reduce (x cast to `wire`, returned in x's dtype),
// retried over the view `membership` gives after an abort (the survivors) until one commits; x
// undefined for a worker that does not mix. Every worker of the world calls it. Returns the mean
// (undefined for a non-mixer).
torch::Tensor all_reduce_mix_over(const Membership& membership, const View& view, const torch::Tensor& x,
                                  comm::Communicator& comm, torch::ScalarType wire, const char* what);

}  // namespace gasloc::algo
