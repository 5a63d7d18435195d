// Compressed rounds (algo.compression; docs/communication.md "Compressed rounds", docs/design.md
// section 12): the settings of a codec between a worker and the wire, checked, and what its
// messages cost. The exchanges themselves are Mixes, one file each (algo/mix/codec_mix.hpp): the
// owners' compressed all-reduce of pseudo-gradients, and gossip through the direct, delta or
// modulo codec.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "gasloc/comm/codec.hpp"
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

// Bytes a message of p parameters takes: one gossip payload to one neighbour in a coded round
// (the modulo codec: its prelude and residues; its fp32 first round and resends aside), and what
// one member sends in the owners' compressed all-reduce over n members (owners_all_reduce.hpp;
// topk: an all-gather). What the time-budget policy and the projections price, latency aside.
int64_t gossip_message_bytes(const CompressionOptions& o, int64_t p);
int64_t compressed_all_reduce_bytes(const comm::Codec& codec, int64_t p, int n);

// The checked options of the [algo] keys (ConfigError naming the key when a value is out of range).
struct AlgoConfig;
std::optional<CompressionOptions> compression_options(const AlgoConfig& cfg);
// algo.compression_chunk against a model of `params` parameters (the trainer, once the model is
// known): a ConfigError naming the key and the model's size for a chunk longer than the model
// (every message padded to it) or one at which the codec sends 32 bits a parameter or more.
void check_compression_for_model(const AlgoConfig& cfg, int64_t params);

}  // namespace gasloc::algo
