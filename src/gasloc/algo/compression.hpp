// Compressed rounds (algo.compression; docs/communication.md "Compressed rounds", docs/design.md
// section 12): what a round's mix sends when a codec (comm/codec.hpp) stands between a worker and
// the wire. Two collectives, both built on pair exchanges of byte payloads, so that every backend
// (in-process, Gloo) carries them unchanged and gives the same bits:
// - all_reduce: the mean pseudo-gradient Delta = mean_i (r - x_i) over the members, r the anchor
//   every member holds. int8/int4: shards of whole chunks dealt to owners (member k owns shard k),
//   an all-to-all of encode(shard k) to its owner, the owner's fp32 sum of the n decoded codes in
//   id order divided by n, re-encoded with the owner's own error feedback, and an all-gather of
//   the owners' codes; topk: an all-gather of fixed-size payloads decoded in id order. Every
//   member ends with the same Delta, bit for bit; returns r - Delta.
// - gossip: m_i = s_i + sum_j W_ij d_ij, with d_ij what the codec lets i know of s_j - s_i:
//   direct (int8): d_ij = decode(encode(s_j)) - s_i, written as today's mix W_ii s_i + sum W_ij s^_j;
//   delta: d_ij = s^_j - s^_i with s^ = r + decode(encode(s - r)), r a reference every worker holds
//   bit for bit (refreshed by the owners' int8 all-reduce every K rounds), so d_ji = -d_ij exactly;
//   modulo (int8, int4): each pair sends the residues n mod (2L + 1) of n = round(s / step), step
//   agreed per chunk from both ends' last gaps (the first round goes in fp32 to measure them),
//   and both ends compute the same wrapped integer
//   difference, so d_ji = -d_ij exactly and the workers' mean is kept; a checksum per chunk finds a
//   wrap (a gap beyond theta / 2) at both ends, and the pair then swaps that chunk in fp32 in the
//   same round (d exact, still d_ji = -d_ij).
// Legend: P parameters, C the codec's chunk, n members, L the levels each side of 0 (127, 7).
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gasloc/algo/mix/mix.hpp"
#include "gasloc/algo/modulo_codec.hpp"
#include "gasloc/algo/peer_clip.hpp"
#include "gasloc/algo/synchronizer.hpp"
#include "gasloc/comm/codec.hpp"
#include "gasloc/comm/communicator.hpp"
#include "gasloc/core/choice.hpp"

namespace gasloc::algo {

// algo.gossip_codec's values, in this order.
enum class GossipCodec { direct, delta, modulo };
const config::Choices& gossip_codec_choices();
// algo.error_feedback's values: auto (on for int4 and topk all-reduces), on, off.
const config::Choices& feedback_choices();

struct CompressionOptions {
  comm::Codec codec;               // the codec of every payload
  bool error_feedback = false;     // all-reduce and direct gossip: e <- a - decode(encode(a))
  float feedback_decay = 1.0f;     // beta in a = beta e + u
  GossipCodec gossip = GossipCodec::delta;
  double margin = 4.0;             // modulo: theta = margin x the pair's larger last gap
  int64_t reference_every = 5;     // delta: K, the reference refreshed every K rounds (0: on the first only)
  // Elastic rounds (a view may change): the modulo codec's fp32 first round is round 0's, which a
  // worker standing by follows by number; a worker without gaps later (a joiner) has its pairs'
  // chunks resent in fp32 once.
  bool elastic = false;
};

// The rounds of a complete pairing of `n` positions (the circle method): schedule[c][k] is the
// partner of position k in round c, or -1 when k sits that round out (odd n). n - 1 rounds for
// even n, n for odd; every pair meets once.
std::vector<std::vector<int>> round_robin(int n);
// A proper edge colouring of a symmetric graph given by each vertex's neighbours (edges taken in
// ascending (i, j) order, each given the smallest colour free at both ends): colours[c][v] is v's
// partner in colour c, or -1. The same on every worker for the same graph.
std::vector<std::vector<int>> pair_colours(const std::vector<std::vector<int>>& neighbours);

// One worker's compressed mixing and its state (error feedback, the modulo codec's gaps), which
// checkpoints carry under "compression_*". Not thread-safe; one per worker.
class Compressor {
 public:
  explicit Compressor(CompressionOptions o);
  // algo.clip_peers in gossip (nullptr: off): what a receiver adds from each peer (its decoded
  // difference) is clipped (PeerClip::clip_differences); `clip` outlives the Compressor.
  void clip(PeerClip* clip) { clip_ = clip; }
  const CompressionOptions& options() const { return o_; }
  // r - Delta^ (see the file comment) over `members` (ids ascending, the caller among them); x and
  // r of one shape, any float dtype, on any device; the result is fp32 on x's device. Every
  // member calls it with the same members; a non-finite Delta_i is a CommError naming the worker.
  torch::Tensor all_reduce(const torch::Tensor& x, const torch::Tensor& r, const std::vector<int>& members,
                           comm::Communicator& comm);
  // One attempt of all_reduce in an elastic round: every worker of the world calls it with the
  // attempt's members; x undefined for a worker that does not send (a member that dies here lists
  // its partners and sends nothing, so they see failed edges; a worker outside calls the
  // exchanges alone). A failed edge does not throw: *complete turns false and the result is
  // undefined, and the caller, once the members agreed to abort, puts back snapshot().
  torch::Tensor all_reduce_attempt(const torch::Tensor& x, const torch::Tensor& r, const std::vector<int>& members,
                                   comm::Communicator& comm, bool& complete);
  // The codec's state, copied: what an aborted attempt restores with load_state.
  StateDict snapshot() const;
  // The delta codec in elastic rounds, whose caller (ElasticMix, through CodecGossipMix) refreshes the reference over the
  // view's members with retries: whether round t refreshes it (round 0 and every K-th), one
  // attempt of the refresh (as all_reduce_attempt: x undefined for a worker that does not mix;
  // returns the new reference, undefined when incomplete), and setting it once the members agreed.
  bool refreshes_reference(int64_t round) const;
  torch::Tensor reference_attempt(const torch::Tensor& x, const std::vector<int>& members, comm::Communicator& comm,
                                  bool& complete);
  void set_reference(torch::Tensor r) { reference_ = std::move(r); }
  // m for worker `me` over the round's graph: graphs[v] is worker v's neighbours and row (every
  // worker's, for the modulo codec's pair schedule; ids ascending; empty outside the view). x as
  // in all_reduce. `round` schedules the delta codec's reference refreshes. Elastic rounds (direct
  // and modulo): a failed edge's weight moves onto W_ii; x undefined for a worker that does not
  // mix (it makes the round's exchanges sending nothing; returns undefined).
  torch::Tensor gossip(int64_t round, const std::vector<RoundGraph>& graphs, const torch::Tensor& x, comm::Communicator& comm);
  // Bytes one round's payloads take for a message of p parameters over `peers` neighbours (gossip)
  // or `n` members (all-reduce): what the time-budget policy prices. Latency terms aside.
  int64_t all_reduce_bytes(int64_t p, int n) const;
  int64_t gossip_bytes(int64_t p, int peers) const;
  // Whether this worker's gossip message of p parameters goes in fp32 in `round`: the modulo
  // codec's first round, which sizes its grids (gossip_bytes is the coded rounds').
  bool sends_fp32(int64_t round, int64_t p) const;
  // Modulo chunks that wrapped and were resent in fp32, so far (a pair's chunk counts once per end).
  int64_t resends() const { return resends_; }

  StateDict state() const;
  // A checkpoint without the state (written before compression was set) starts it at zero.
  void load_state(const StateDict& s);

 private:
  torch::Tensor direct(const std::vector<RoundGraph>& graphs, const torch::Tensor& x, comm::Communicator& comm);
  torch::Tensor modulo(int64_t round, const std::vector<RoundGraph>& graphs, const torch::Tensor& x, comm::Communicator& comm);
  // The modulo round's exchanges for a worker that sends nothing (elastic rounds only).
  void stand_by_modulo(int64_t round, const std::vector<RoundGraph>& graphs, comm::Communicator& comm) const;
  torch::Tensor delta(int64_t round, const std::vector<RoundGraph>& graphs, const torch::Tensor& x, comm::Communicator& comm);
  // A gossip payload of this worker's u (fp32, flat; with its error feedback if on), and a peer's
  // decoded; CommError naming the worker on a non-finite u or a malformed payload.
  torch::Tensor encode_own(const torch::Tensor& u, int me);
  torch::Tensor decode_from(const torch::Tensor& payload, int64_t n, int me, int from) const;
  // complete: null for a fixed membership (a failed edge throws), else set as in all_reduce_attempt.
  torch::Tensor owner_all_reduce(const comm::Codec& codec, bool feedback, const torch::Tensor& x, const torch::Tensor& r,
                                 const std::vector<int>& members, comm::Communicator& comm, bool* complete = nullptr);
  torch::Tensor first_modulo(const RoundGraph& g, const torch::Tensor& s, const ModuloGrid& grid, comm::Communicator& comm);

  CompressionOptions o_;
  torch::Tensor feedback_;        // e: all-reduce (of Delta_i) or direct gossip (of s_i); P
  torch::Tensor owner_feedback_;  // e*: the owner's, of its shard's mean; S C
  torch::Tensor gaps_;            // modulo: per chunk, the largest |d| of the last exchange (-1: none yet)
  torch::Tensor reference_;       // delta: r, the same bits on every worker
  int64_t resends_ = 0;
  PeerClip* clip_ = nullptr;
};

// The checked options of the [algo] keys (ConfigError naming the key when a value is out of range).
struct AlgoConfig;
std::optional<CompressionOptions> compression_options(const AlgoConfig& cfg);
// algo.compression_chunk against a model of `params` parameters (the trainer, once the model is
// known): a ConfigError naming the key and the model's size for a chunk longer than the model
// (every message padded to it) or one at which the codec sends 32 bits a parameter or more.
void check_compression_for_model(const AlgoConfig& cfg, int64_t params);

}  // namespace gasloc::algo
