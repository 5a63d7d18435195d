// Compressed rounds; see compression.hpp.
#include "gasloc/algo/compression.hpp"

#include <fmt/format.h>

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

int64_t gossip_message_bytes(const CompressionOptions& o, int64_t p) {
  const auto n = static_cast<size_t>(p);
  if (o.gossip != GossipCodec::modulo) return static_cast<int64_t>(comm::payload_bytes(o.codec, n));
  const ModuloGrid g{o.codec.kind == comm::CodecKind::int8 ? 127 : 7, o.codec.chunk};
  const auto chunks = static_cast<int64_t>((n + g.chunk - 1) / g.chunk);
  return 8 * chunks + static_cast<int64_t>(modulo_payload_bytes(g, n));  // the prelude: (gap, max |s|) per chunk
}

int64_t compressed_all_reduce_bytes(const comm::Codec& codec, int64_t p, int n) {
  if (n < 2) return 0;
  const auto C = static_cast<int64_t>(codec.chunk);
  const int64_t chunks = (p + C - 1) / C, shard = (chunks + n - 1) / n;
  const auto per_chunk = static_cast<int64_t>(comm::payload_bytes(codec, codec.chunk));
  if (codec.kind == comm::CodecKind::topk) return (n - 1) * per_chunk * shard * n;
  return 2 * (n - 1) * per_chunk * shard;
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
