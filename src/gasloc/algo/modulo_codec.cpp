// The modulo codec of gossip; see modulo_codec.hpp. Built without fused multiply-adds
// (CMakeLists.txt), as the codecs are: both ends must round alike.
#include "gasloc/algo/modulo_codec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gasloc/comm/codec.hpp"

namespace gasloc::algo {

namespace {

int64_t modulus(const ModuloGrid& g) { return 2 * static_cast<int64_t>(g.levels) + 1; }

size_t code_bytes(const ModuloGrid& g, size_t len) { return g.levels > 7 ? len : (len + 1) / 2; }

size_t chunk_bytes(const ModuloGrid& g, size_t len) { return 4 + code_bytes(g, len); }

comm::Codec codec_of(const ModuloGrid& g) { return g.levels > 7 ? comm::Codec::int8(g.chunk) : comm::Codec::int4(g.chunk); }

size_t chunks(const ModuloGrid& g, size_t n) { return (n + g.chunk - 1) / g.chunk; }

// n = round(s / step), half to even (the default rounding mode).
int64_t grid_index(float s, double step) { return static_cast<int64_t>(std::nearbyint(static_cast<double>(s) / step)); }

// The check of a chunk's n: sum of n_e (2e + 1) mod 2^32, e the index within the chunk, so that
// two wraps of opposite sign at different elements do not cancel.
uint32_t checksum_add(uint32_t sum, int64_t n, size_t e) {
  return sum + static_cast<uint32_t>(static_cast<uint64_t>(n)) * static_cast<uint32_t>(2 * e + 1);
}

void check_steps(const ModuloGrid& g, size_t n, std::span<const double> steps) {
  if (steps.size() != chunks(g, n))
    throw Error(fmt::format("modulo codec: {} steps for {} chunks", steps.size(), chunks(g, n)), "internal: one step per chunk");
}

}  // namespace

size_t modulo_payload_bytes(const ModuloGrid& g, size_t n) {
  const size_t full = n / g.chunk, tail = n % g.chunk;
  return full * chunk_bytes(g, g.chunk) + (tail ? chunk_bytes(g, tail) : 0);
}

double modulo_step(const ModuloGrid& g, double margin, float gap_i, float gap_j, float max_i, float max_j) {
  const double m = static_cast<double>(modulus(g));
  const double big = std::max(max_i, max_j);
  if (big == 0.0) return 1.0;
  const double theta = gap_i < 0 || gap_j < 0 ? 5.0 * big : margin * std::max(gap_i, gap_j);
  return std::max(theta / m, std::ldexp(big, -22));
}

std::vector<float> chunk_max_abs(const ModuloGrid& g, std::span<const float> s) {
  std::vector<float> out(chunks(g, s.size()), 0.0f);
  for (size_t c = 0; c < out.size(); ++c) {
    const size_t begin = c * g.chunk, end = std::min(s.size(), begin + g.chunk);
    float m = 0.0f;
    for (size_t i = begin; i < end; ++i) {
      if (!std::isfinite(s[i])) throw comm::NonFiniteChunk(c, begin, end - 1, codec_of(g));
      m = std::max(m, std::fabs(s[i]));
    }
    out[c] = m;
  }
  return out;
}

void modulo_encode(const ModuloGrid& g, std::span<const float> s, std::span<const double> steps, std::span<uint8_t> out) {
  check_steps(g, s.size(), steps);
  if (out.size() != modulo_payload_bytes(g, s.size()))
    throw Error(fmt::format("modulo codec: {} bytes for {} elements, expected {}", out.size(), s.size(),
                            modulo_payload_bytes(g, s.size())),
                "internal: size the buffer with modulo_payload_bytes()");
  const int64_t M = modulus(g);
  uint8_t* p = out.data();
  for (size_t c = 0; c < steps.size(); ++c) {
    const size_t begin = c * g.chunk, len = std::min(s.size(), begin + g.chunk) - begin;
    uint32_t sum = 0;
    uint8_t* codes = p + 4;
    std::memset(codes, 0, code_bytes(g, len));
    for (size_t e = 0; e < len; ++e) {
      const int64_t n = grid_index(s[begin + e], steps[c]);
      sum = checksum_add(sum, n, e);
      const auto x = static_cast<uint8_t>(((n % M) + M) % M);
      if (g.levels > 7) codes[e] = x;
      else codes[e / 2] |= static_cast<uint8_t>(e % 2 ? x << 4 : x);
    }
    for (int b = 0; b < 4; ++b) p[b] = static_cast<uint8_t>(sum >> (8 * b));  // little-endian
    p += chunk_bytes(g, len);
  }
}

void modulo_difference(const ModuloGrid& g, std::span<const float> s, std::span<const double> steps,
                       std::span<const uint8_t> peer, std::span<float> d, std::span<uint8_t> wrapped) {
  check_steps(g, s.size(), steps);
  if (peer.size() != modulo_payload_bytes(g, s.size()))
    throw comm::BadPayload(fmt::format("modulo payload for {} elements is {} bytes, expected {}", s.size(), peer.size(),
                                       modulo_payload_bytes(g, s.size())),
                           "both ends must run the same algo.compression and algo.compression_chunk");
  if (d.size() != s.size() || wrapped.size() != steps.size())
    throw Error("modulo codec: output sizes do not match the input", "internal: one d per element, one flag per chunk");
  const int64_t M = modulus(g), L = g.levels;
  const uint8_t* p = peer.data();
  for (size_t c = 0; c < steps.size(); ++c) {
    const size_t begin = c * g.chunk, len = std::min(s.size(), begin + g.chunk) - begin;
    uint32_t want = 0;
    for (int b = 0; b < 4; ++b) want |= static_cast<uint32_t>(p[b]) << (8 * b);
    const uint8_t* codes = p + 4;
    uint32_t sum = 0;
    for (size_t e = 0; e < len; ++e) {
      const int64_t x = g.levels > 7 ? codes[e] : (e % 2 ? codes[e / 2] >> 4 : codes[e / 2] & 0x0f);
      if (x >= M)
        throw comm::BadPayload(fmt::format("modulo payload: residue {} out of range 0..{} in chunk {}", x, M - 1, c),
                               "the peer runs another codec, or the payload was altered");
      const int64_t mine = grid_index(s[begin + e], steps[c]);
      int64_t k = ((x - mine) % M + M) % M;
      if (k > L) k -= M;
      sum = checksum_add(sum, mine + k, e);
      d[begin + e] = static_cast<float>(static_cast<double>(k) * steps[c]);
    }
    wrapped[c] = sum != want;
    if (wrapped[c]) std::fill(d.begin() + begin, d.begin() + begin + len, 0.0f);
    p += chunk_bytes(g, len);
  }
}

}  // namespace gasloc::algo
