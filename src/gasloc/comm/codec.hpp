// Codecs for compressed exchanges (docs/communication.md
// "Codecs"): pure functions from a span of fp32 values to bytes and back. No torch, no BLAS, no
// reordering: encode is a function of its input alone, so every CPU produces the same bytes and
// every receiver decodes the same floats.
//
// Legend: n elements in the span, cut into chunks of C consecutive elements from the span's
// first element (the last chunk may be shorter, length C_c); s a chunk's fp32 scale; q the
// integer codes; x^ = decode(encode(x)). Payloads are little-endian, chunk after chunk:
//   fp32  n x fp32 (lossless, for equivalence tests)
//   int8  per chunk: s (fp32), C_c x int8 q                      8 + 32/C bits a parameter
//   int4  per chunk: s (fp32), ceil(C_c/2) bytes of 4-bit q      4 + 32/C bits
//   topk  per chunk: s (fp32), k indices, k x int8 q             fixed k per chunk length
// A caller that wants one global grid over a larger buffer passes spans that start on a chunk
// boundary of that grid.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gasloc/core/choice.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::comm {

enum class CodecKind { fp32, int8, int4, topk };

// A codec and its parameters. Build one with the named constructors, which check them.
struct Codec {
  CodecKind kind = CodecKind::fp32;
  size_t chunk = 256;    // C; for fp32 it only names where a non-finite value was
  double density = 1.0;  // topk's rho in (0, 1]; unused otherwise

  static Codec fp32(size_t chunk = 256);
  static Codec int8(size_t chunk = 256);
  static Codec int4(size_t chunk = 256);
  static Codec topk(double density = 1.0 / 64, size_t chunk = 4096);
  std::string name() const;  // "int8 (C = 256)", for messages and logs
};

// An input chunk holding NaN or Inf: never encoded. The caller adds the worker's name.
class NonFiniteChunk : public Error {
 public:
  NonFiniteChunk(size_t chunk, size_t first, size_t last, const Codec& codec);
  size_t chunk() const { return chunk_; }  // index of the chunk in the encoded span

 private:
  size_t chunk_;
};

// A payload that no encoder of this codec produces: wrong size, a non-finite, negative or
// subnormal scale, a code out of range, topk indices not ascending. A peer can send garbage.
class BadPayload : public Error {
  using Error::Error;
};

// Exact size of the encoding of n elements, independent of their values (so receivers can size
// buffers, an all-gather can carry topk, and accounting can price bytes).
size_t payload_bytes(const Codec& codec, size_t n);
// Bits a parameter for whole chunks: int8 8 + 32/C, int4 4 + 32/C, topk
// (32 + k (index bits + 8)) / C, fp32 32. payload_bytes is the exact figure for a given n.
double bits_per_parameter(const Codec& codec);
// topk's k for a chunk of `chunk_len` elements: max(1, floor(density chunk_len + 0.5)).
size_t topk_count(double density, size_t chunk_len);

// Throws NonFiniteChunk on a non-finite input. encode_into's out must be payload_bytes long.
std::vector<uint8_t> encode(const Codec& codec, std::span<const float> x);
void encode_into(const Codec& codec, std::span<const float> x, std::span<uint8_t> out);

// out (n = out.size() elements) = x^. Throws BadPayload if `payload` is not
// payload_bytes(codec, n) long or is not something encode produces; every chunk is checked
// before any is written, so after a throw `out` is as it was (decode_add too).
void decode(const Codec& codec, std::span<const uint8_t> payload, std::span<float> out);
// out[i] += w * x^[i] in fp32 (w * x^ rounded, then added): with w = 1 it is bit for bit
// out + decode(...). topk touches only the coordinates it carries, so there a -0.0 in out stays
// -0.0 where a dense add would make it +0.0; every other bit is the dense add's.
void decode_add(const Codec& codec, std::span<const uint8_t> payload, float w, std::span<float> out);

// Error feedback: a = beta e + u; c = encode(a); e <- a - decode(c); returns c. All in fp32, so
// the decoded outputs plus the final e telescope to the inputs' sum. If a is non-finite it
// throws NonFiniteChunk before touching e.
std::vector<uint8_t> encode_with_feedback(const Codec& codec, std::span<const float> u, std::span<float> e, float beta);

// `algo.compression`: none (today's exchanges) | int8 | int4 | topk.
enum class Compression { none, int8, int4, topk };
const config::Choices& compressions();
// ConfigError naming the key `algo.compression` and listing the valid names.
Compression parse_compression(std::string_view value);
// The codec a setting means with its default parameters (int8 and int4 at C = 256, topk at
// rho = 1/64 and C = 4096); none has no codec.
std::optional<Codec> default_codec(Compression c);

}  // namespace gasloc::comm
