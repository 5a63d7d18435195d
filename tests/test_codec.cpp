// The codecs (src/gasloc/comm/codec.hpp): payload bytes worked out by hand, round halves to
// even, the error bound, zero and subnormal chunks, refusals of non-finite inputs and of garbage
// payloads, error feedback, and the library against a naive encoder written here from the
// definition (docs/communication.md, "Codecs").
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "gasloc/comm/codec.hpp"

using namespace gasloc;
using namespace gasloc::comm;

namespace {

using Bytes = std::vector<uint8_t>;

std::vector<float> decoded(const Codec& c, const Bytes& p, size_t n) {
  std::vector<float> out(n, -1.0f);  // not zero, so that a decode that skips a value shows
  decode(c, p, out);
  return out;
}

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

// The naive reference: one chunk at a time, std::nearbyint, std::stable_sort for topk's ties,
// and indices written bit by bit. Shares nothing with the library but the definition.
void put_bits(Bytes& out, size_t bit_pos, uint32_t value, int width) {
  for (int b = 0; b < width; ++b)
    if (value >> b & 1u) out[(bit_pos + b) / 8] |= static_cast<uint8_t>(1u << ((bit_pos + b) % 8));
}

void put_float(Bytes& out, float v) {
  uint8_t b[4];
  std::memcpy(b, &v, 4);
  out.insert(out.end(), b, b + 4);
}

float reference_scale(const float* x, size_t len, float levels) {
  float m = 0;
  for (size_t i = 0; i < len; ++i) m = std::max(m, std::fabs(x[i]));
  const float s = m / levels;
  return (s == 0 || std::fpclassify(s) == FP_SUBNORMAL) ? 0.0f : s;
}

int reference_code(float x, float s, float levels) {
  if (s == 0) return 0;
  return static_cast<int>(std::clamp(std::nearbyint(x / s), -levels, levels));
}

Bytes reference_encode(const Codec& c, const std::vector<float>& x) {
  Bytes out;
  for (size_t begin = 0; begin < x.size(); begin += c.chunk) {
    const size_t len = std::min(c.chunk, x.size() - begin);
    const float* xs = x.data() + begin;
    if (c.kind == CodecKind::fp32) {
      for (size_t i = 0; i < len; ++i) put_float(out, xs[i]);
    } else if (c.kind == CodecKind::int8) {
      const float s = reference_scale(xs, len, 127);
      put_float(out, s);
      for (size_t i = 0; i < len; ++i) out.push_back(static_cast<uint8_t>(static_cast<int8_t>(reference_code(xs[i], s, 127))));
    } else if (c.kind == CodecKind::int4) {
      const float s = reference_scale(xs, len, 7);
      put_float(out, s);
      Bytes nibbles((len + 1) / 2, 0);
      for (size_t i = 0; i < len; ++i) put_bits(nibbles, 4 * i, static_cast<uint32_t>(reference_code(xs[i], s, 7)) & 0xf, 4);
      out.insert(out.end(), nibbles.begin(), nibbles.end());
    } else {
      const size_t k = std::max<size_t>(1, static_cast<size_t>(std::floor(c.density * len + 0.5)));
      std::vector<uint32_t> order(len);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return std::fabs(xs[a]) > std::fabs(xs[b]); });
      order.resize(k);
      std::sort(order.begin(), order.end());
      const float s = reference_scale(xs, len, 127);
      put_float(out, s);
      const int width = c.chunk <= 4096 ? 12 : c.chunk <= 65536 ? 16 : 32;
      Bytes idx((k * width + 7) / 8, 0);
      for (size_t i = 0; i < k; ++i) put_bits(idx, i * width, order[i], width);
      out.insert(out.end(), idx.begin(), idx.end());
      for (uint32_t i : order) out.push_back(static_cast<uint8_t>(static_cast<int8_t>(reference_code(xs[i], s, 127))));
    }
  }
  return out;
}

// Random values of mixed magnitudes, with exact zeros and exact halves of the scale, so that
// ties and zero chunks occur.
std::vector<float> random_values(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> normal(0, 1);
  std::uniform_int_distribution<int> kind(0, 9), level(-127, 126);
  std::vector<float> x(n);
  for (auto& v : x) {
    const int k = kind(rng);
    v = k == 0 ? 0.0f : k == 1 ? level(rng) + 0.5f : k == 2 ? 1e-3f * normal(rng) : normal(rng);
  }
  return x;
}

std::vector<Codec> all_codecs(size_t chunk) {
  return {Codec::fp32(chunk), Codec::int8(chunk), Codec::int4(chunk), Codec::topk(1.0 / 64, chunk), Codec::topk(0.3, chunk)};
}

}  // namespace

// ---- bytes by hand ----

TEST(Codec, Int8OneChunkByHand) {
  // max |x| = 127, so s = 1: q = rint(x): 1, -0.5 -> -0 (to even) = 0, 0.25 -> 0, 127.
  const Bytes p = encode(Codec::int8(4), std::vector<float>{1, -0.5f, 0.25f, 127});
  EXPECT_EQ(p, (Bytes{0x00, 0x00, 0x80, 0x3f, 0x01, 0x00, 0x00, 0x7f}));  // 1.0f = 0x3f800000
  EXPECT_EQ(decoded(Codec::int8(4), p, 4), (std::vector<float>{1, 0, 0, 127}));
}

TEST(Codec, Int8RoundsHalvesToEven) {
  // s = 1: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -2.5 -> -2, -3.5 -> -4.
  EXPECT_EQ(encode(Codec::int8(6), std::vector<float>{0.5f, 1.5f, 2.5f, -2.5f, -3.5f, 127}),
            (Bytes{0x00, 0x00, 0x80, 0x3f, 0x00, 0x02, 0x02, 0xfe, 0xfc, 0x7f}));
  // max 254: s = 2 (0x40000000); x / s = 127, 0.5 -> 0, 1.5 -> 2, -0.5 -> 0; x^ = 254, 0, 4, 0.
  const Bytes p = encode(Codec::int8(4), std::vector<float>{254, 1, 3, -1});
  EXPECT_EQ(p, (Bytes{0x00, 0x00, 0x00, 0x40, 0x7f, 0x00, 0x02, 0x00}));
  EXPECT_EQ(decoded(Codec::int8(4), p, 4), (std::vector<float>{254, 0, 4, 0}));
}

TEST(Codec, Int8ChunksOnTheGridWithAShortLastChunk) {
  // C = 2 over 5 values: [127, -63.5] s = 1, -63.5 -> -64 (0xc0); [0, 0] s = 0; [-254] s = 2, q = -127 (0x81).
  const Codec c = Codec::int8(2);
  const Bytes p = encode(c, std::vector<float>{127, -63.5f, 0, 0, -254});
  EXPECT_EQ(p, (Bytes{0x00, 0x00, 0x80, 0x3f, 0x7f, 0xc0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x00, 0x40, 0x81}));
  EXPECT_EQ(payload_bytes(c, 5), 17u);
  EXPECT_EQ(decoded(c, p, 5), (std::vector<float>{127, -64, 0, 0, -254}));
}

TEST(Codec, Int4PacksTwoCodesAByteLowNibbleFirst) {
  // s = 7 / 7 = 1: q = 7, -3.5 -> -4, 2.5 -> 2, -7, 1; nibbles 7, c, 2, 9, 1 and a 0 pad:
  // bytes 0xc7, 0x92, 0x01.
  const Codec c = Codec::int4(5);
  const Bytes p = encode(c, std::vector<float>{7, -3.5f, 2.5f, -7, 1});
  EXPECT_EQ(p, (Bytes{0x00, 0x00, 0x80, 0x3f, 0xc7, 0x92, 0x01}));
  EXPECT_EQ(decoded(c, p, 5), (std::vector<float>{7, -4, 2, -7, 1}));
  // max 14: s = 2; 3 / 2 = 1.5 -> 2, -1 / 2 = -0.5 -> 0: nibbles 7, 2 | 0, 0 -> 0x27, 0x00.
  EXPECT_EQ(encode(Codec::int4(4), std::vector<float>{14, 3, -1, 0}), (Bytes{0x00, 0x00, 0x00, 0x40, 0x27, 0x00}));
}

TEST(Codec, TopkTakesTheLargestWithTiesToTheLowerIndex) {
  // |x| = 1, 127, 127, 0.5, 127, 63.5; density 1/3 of 6: k = 2 -> indices 1 and 2 (4 ties, higher).
  const std::vector<float> x{1, -127, 127, 0.5f, -127, 63.5f};
  const Codec two = Codec::topk(1.0 / 3, 6);
  const Bytes p = encode(two, x);
  // s = 1; indices 1, 2 as 12-bit little-endian: 0x01, 0x20, 0x00; codes -127 (0x81), 127.
  EXPECT_EQ(p, (Bytes{0x00, 0x00, 0x80, 0x3f, 0x01, 0x20, 0x00, 0x81, 0x7f}));
  EXPECT_EQ(decoded(two, p, 6), (std::vector<float>{0, -127, 127, 0, 0, 0}));
  // Density 1/2: k = 3 -> 1, 2, 4; the odd third index takes two bytes (0x04, 0x00).
  EXPECT_EQ(encode(Codec::topk(0.5, 6), x),
            (Bytes{0x00, 0x00, 0x80, 0x3f, 0x01, 0x20, 0x00, 0x04, 0x00, 0x81, 0x7f, 0x81}));
}

TEST(Codec, TopkIndexPackings) {
  // 12 bits (C <= 4096): indices 0xabc, 0xfff -> 0xbc, 0xfa, 0xff; x = 127 and -63.5: s = 1, q = 127, -64.
  std::vector<float> x(4096, 0.0f);
  x[0xabc] = 127;
  x[0xfff] = -63.5f;
  EXPECT_EQ(encode(Codec::topk(2.0 / 4096, 4096), x), (Bytes{0x00, 0x00, 0x80, 0x3f, 0xbc, 0xfa, 0xff, 0x7f, 0xc0}));
  // 16 bits (C = 5000): index 4999 = 0x1387; 254 -> s = 2, q = 127.
  std::vector<float> y(5000, 0.0f);
  y[4999] = 254;
  EXPECT_EQ(encode(Codec::topk(1.0 / 5000, 5000), y), (Bytes{0x00, 0x00, 0x00, 0x40, 0x87, 0x13, 0x7f}));
  // 32 bits (C = 70000): index 69999 = 0x1116f.
  std::vector<float> z(70000, 0.0f);
  z[69999] = -127;
  const Codec wide = Codec::topk(1.0 / 70000, 70000);
  const Bytes pz = encode(wide, z);
  EXPECT_EQ(pz, (Bytes{0x00, 0x00, 0x80, 0x3f, 0x6f, 0x11, 0x01, 0x00, 0x81}));
  EXPECT_EQ(decoded(wide, pz, 70000), z);
}

TEST(Codec, TopkCountsAndSizes) {
  EXPECT_EQ(topk_count(1.0 / 64, 4096), 64u);
  EXPECT_EQ(topk_count(1.0 / 64, 100), 2u);  // floor(1.5625 + 0.5)
  EXPECT_EQ(topk_count(1.0 / 64, 1), 1u);    // floor(0.515625) = 0, at least 1
  EXPECT_EQ(topk_count(0.5, 3), 2u);         // floor(2.0): halves round up
  EXPECT_EQ(topk_count(1.0, 7), 7u);
  // 4 + 64 x 12 / 8 + 64 = 164 bytes a 4096 chunk: 0.3203125 bits a parameter.
  EXPECT_EQ(payload_bytes(Codec::topk(), 4096), 164u);
  EXPECT_DOUBLE_EQ(bits_per_parameter(Codec::topk()), 0.3203125);
  // 4096 + 100 elements: 164 + (4 + 3 + 2) for the short chunk's k = 2.
  EXPECT_EQ(payload_bytes(Codec::topk(), 4196), 173u);
}

TEST(Codec, SizesAndBitsAParameter) {
  EXPECT_EQ(payload_bytes(Codec::int8(256), 1000), 3u * 260 + 4 + 232);
  EXPECT_EQ(payload_bytes(Codec::int4(256), 1001), 3u * 132 + 4 + 117);  // 233 codes -> 117 bytes
  EXPECT_EQ(payload_bytes(Codec::fp32(), 1001), 4004u);
  EXPECT_EQ(payload_bytes(Codec::int8(), 0), 0u);
  EXPECT_DOUBLE_EQ(bits_per_parameter(Codec::int8(256)), 8.125);
  EXPECT_DOUBLE_EQ(bits_per_parameter(Codec::int4(256)), 4.125);
  EXPECT_DOUBLE_EQ(bits_per_parameter(Codec::int4(3)), 8.0 * 6 / 3);  // 4 + 2 bytes for 3 codes
  EXPECT_DOUBLE_EQ(bits_per_parameter(Codec::fp32()), 32.0);
}

// ---- zero, subnormal, non-finite ----

TEST(Codec, ZeroAndSubnormalChunksDecodeToExactZeros) {
  const std::vector<std::vector<float>> inputs = {
      {0, 0, 0, 0},
      {-0.0f, 0, 0, 0},
      {5 * FLT_MIN, -1e-40f, 0, 0},  // s = 5 FLT_MIN / 127 (or / 7) is subnormal
      {std::numeric_limits<float>::denorm_min(), 0, 0, 0}};
  for (const Codec& c : {Codec::int8(4), Codec::int4(4), Codec::topk(0.5, 4)}) {
    for (const auto& x : inputs) {
      const Bytes p = encode(c, x);
      EXPECT_EQ(p.size(), payload_bytes(c, 4));
      const size_t skip = c.kind == CodecKind::topk ? 4 + 3 : 4;  // the scale, and topk's indices
      for (size_t i = 0; i < p.size(); ++i)
        if (i < 4 || i >= skip) EXPECT_EQ(p[i], 0) << c.name() << " byte " << i;
      for (float v : decoded(c, p, 4)) EXPECT_EQ(bits(v), 0u) << c.name();  // +0.0 exactly
    }
  }
  // 127 FLT_MIN: s = FLT_MIN exactly, normal, so it is kept: q = 127.
  const Bytes p = encode(Codec::int8(1), std::vector<float>{127 * FLT_MIN});
  EXPECT_EQ(p, (Bytes{0x00, 0x00, 0x80, 0x00, 0x7f}));  // FLT_MIN = 0x00800000
  EXPECT_EQ(decoded(Codec::int8(1), p, 1)[0], 127 * FLT_MIN);
}

TEST(Codec, NonFiniteInputNamesTheChunk) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const Codec& c : all_codecs(256)) {
    for (auto [where, bad] : {std::pair<size_t, float>{600, nan}, {0, inf}, {999, -inf}}) {
      std::vector<float> x(1000, 1.0f);
      x[where] = bad;
      try {
        encode(c, x);
        ADD_FAILURE() << c.name() << " encoded a non-finite value";
      } catch (const NonFiniteChunk& e) {
        EXPECT_EQ(e.chunk(), where / 256) << c.name();
        EXPECT_NE(std::string(e.what()).find("chunk " + std::to_string(where / 256)), std::string::npos) << e.what();
      }
    }
  }
}

// ---- garbage payloads ----

TEST(Codec, DecodeRefusesAPayloadOfTheWrongSize) {
  const std::vector<float> x(300, 1.0f);
  for (const Codec& c : all_codecs(256)) {
    Bytes p = encode(c, x);
    std::vector<float> out(300);
    Bytes cut(p.begin(), p.end() - 1), longer = p;
    longer.push_back(0);
    EXPECT_THROW(decode(c, cut, out), BadPayload) << c.name();
    EXPECT_THROW(decode(c, longer, out), BadPayload) << c.name();
    std::vector<float> other(100);  // a length whose payload size differs (topk's may not for 299)
    EXPECT_THROW(decode(c, p, other), BadPayload) << c.name();
    EXPECT_THROW(decode_add(c, cut, 1.0f, out), BadPayload) << c.name();
  }
  std::vector<float> none;
  EXPECT_NO_THROW(decode(Codec::int8(), Bytes{}, none));
  std::vector<float> five(5);
  EXPECT_THROW(decode(Codec::int8(), Bytes{}, five), BadPayload);
}

TEST(Codec, DecodeRefusesBytesNoEncoderWrites) {
  std::vector<float> out(4);
  auto refused = [&](const Codec& c, Bytes p) {
    EXPECT_THROW(decode(c, p, out), BadPayload) << c.name();
  };
  auto with_scale = [](float s, const Bytes& rest) {
    Bytes p;
    put_float(p, s);
    for (uint8_t b : rest) p.push_back(b);
    return p;
  };
  const Codec i8 = Codec::int8(4), i4 = Codec::int4(4), tk = Codec::topk(0.5, 4);
  // The encoder's own bytes decode (a control for the refusals below).
  EXPECT_NO_THROW(decode(i8, with_scale(1, {0x7f, 0, 0, 0}), out));
  refused(i8, with_scale(std::numeric_limits<float>::quiet_NaN(), {0x7f, 0, 0, 0}));
  refused(i8, with_scale(std::numeric_limits<float>::infinity(), {0x7f, 0, 0, 0}));
  refused(i8, with_scale(-1, {0x7f, 0, 0, 0}));
  refused(i8, with_scale(-0.0f, {0, 0, 0, 0}));
  refused(i8, with_scale(1e-40f, {0x7f, 0, 0, 0}));  // subnormal
  refused(i8, with_scale(1, {0x80, 0x7f, 0, 0}));    // -128
  refused(i8, with_scale(0, {0x01, 0, 0, 0}));       // a code under a zero scale
  refused(i8, with_scale(1, {0x01, 0, 0, 0}));       // no code reaches +-127
  EXPECT_NO_THROW(decode(i4, with_scale(1, {0x07, 0x00}), out));
  refused(i4, with_scale(1, {0x87, 0x00}));  // -8
  refused(i4, with_scale(1, {0x01, 0x00}));  // no +-7
  std::vector<float> three(3);
  EXPECT_NO_THROW(decode(Codec::int4(3), with_scale(1, {0x07, 0x00}), three));
  EXPECT_THROW(decode(Codec::int4(3), with_scale(1, {0x07, 0x10}), three), BadPayload);  // pad nibble
  // topk, k = 2 of 4: indices 1, 2 are 0x01, 0x20, 0x00.
  EXPECT_NO_THROW(decode(tk, with_scale(1, {0x01, 0x20, 0x00, 0x7f, 0x00}), out));
  refused(tk, with_scale(1, {0x02, 0x10, 0x00, 0x7f, 0x00}));  // 2 then 1: not ascending
  refused(tk, with_scale(1, {0x01, 0x10, 0x00, 0x7f, 0x00}));  // 1 then 1
  refused(tk, with_scale(1, {0x01, 0x40, 0x00, 0x7f, 0x00}));  // index 4 of a 4-long chunk
  refused(tk, with_scale(1, {0x01, 0x20, 0x00, 0x80, 0x7f}));  // -128
  // fp32: a non-finite value.
  Bytes f(16, 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(f.data() + 8, &nan, 4);
  refused(Codec::fp32(), f);
}

TEST(Codec, GarbageLeavesTheOutputAsItWas) {
  // Three good chunks then a bad one: nothing of the good ones may reach out either.
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) - 8.0f;
  for (const Codec& c : {Codec::int8(256), Codec::int4(256), Codec::topk(0.25, 256)}) {
    Bytes p = encode(c, x);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(p.data() + 3 * payload_bytes(c, 256), &nan, 4);  // the last chunk's scale
    std::vector<float> out(1000, 2.5f);
    EXPECT_THROW(decode(c, p, out), BadPayload) << c.name();
    EXPECT_THROW(decode_add(c, p, 1.0f, out), BadPayload) << c.name();
    EXPECT_EQ(out, std::vector<float>(1000, 2.5f)) << c.name();
  }
}

// ---- properties over many shapes ----

TEST(Codec, MatchesTheNaiveReferenceOnRandomData) {
  std::mt19937 rng(43);
  for (size_t chunk : {1, 2, 7, 256, 4096, 5000}) {
    for (size_t n : {size_t{0}, size_t{1}, chunk - 1, chunk, 3 * chunk + 5, size_t{10007}}) {
      const auto x = random_values(rng, n);
      for (const Codec& c : all_codecs(chunk)) {
        const Bytes p = encode(c, x);
        EXPECT_EQ(p.size(), payload_bytes(c, n)) << c.name() << " n " << n;
        EXPECT_EQ(p, reference_encode(c, x)) << c.name() << " n " << n;
        EXPECT_EQ(p, encode(c, x)) << c.name() << " n " << n << ": not deterministic";
      }
    }
  }
}

TEST(Codec, TopkMatchesTheReferenceUnderHeavyTies) {
  // Values from {-2, -1, 0, 1, 2} (and chunks of one value): the k-th largest |x| is shared by
  // many, so which of them are sent is decided by the lower-index rule alone.
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> level(-2, 2);
  for (size_t chunk : {7, 64, 4096}) {
    for (double density : {1.0 / 64, 0.1, 0.5, 0.9}) {
      std::vector<float> x(3 * chunk + 1);
      for (auto& v : x) v = static_cast<float>(level(rng));
      std::fill(x.begin(), x.begin() + static_cast<long>(chunk), 1.5f);  // one chunk all equal
      const Codec c = Codec::topk(density, chunk);
      EXPECT_EQ(encode(c, x), reference_encode(c, x)) << c.name();
    }
  }
}

TEST(Codec, RoundingMatchesNearbyintOnEveryHalfAndQuarter) {
  // x = k / 4 for k in [-508, 508] under s = 1 (the 127 sets the scale): every tie of the grid.
  std::vector<float> x;
  for (int k = -508; k <= 508; ++k) x.push_back(k / 4.0f);
  x.push_back(127);
  const Codec c = Codec::int8(x.size());
  EXPECT_EQ(encode(c, x), reference_encode(c, x));
}

TEST(Codec, ErrorIsAtMostHalfAStepPerChunk) {
  std::mt19937 rng(7);
  for (size_t chunk : {1, 7, 256, 4096}) {
    for (size_t n : {size_t{1}, size_t{1000}, 2 * chunk + 3}) {
      auto x = random_values(rng, n);
      for (auto& v : x) v *= 1e3f;
      for (const Codec& c : {Codec::int8(chunk), Codec::int4(chunk), Codec::topk(1.0 / 64, chunk)}) {
        const Bytes p = encode(c, x);
        const auto y = decoded(c, p, n);
        const size_t full = payload_bytes(c, chunk);
        for (size_t begin = 0, j = 0; begin < n; begin += chunk, ++j) {
          const size_t len = std::min(chunk, n - begin);
          float s;
          std::memcpy(&s, p.data() + j * full, 4);
          const float levels = c.kind == CodecKind::int4 ? 7 : 127;
          float m = 0, smallest_sent = INFINITY, largest_unsent = 0;
          for (size_t i = begin; i < begin + len; ++i) m = std::max(m, std::fabs(x[i]));
          EXPECT_LE(s, m / levels * (1 + 1e-6f)) << c.name();
          for (size_t i = begin; i < begin + len; ++i) {
            if (c.kind == CodecKind::topk && y[i] == 0) {  // unsent, or sent and rounded to 0
              largest_unsent = std::max(largest_unsent, std::fabs(x[i]));
              continue;
            }
            if (c.kind == CodecKind::topk) smallest_sent = std::min(smallest_sent, std::fabs(x[i]));
            EXPECT_LE(std::fabs(x[i] - y[i]), s * (0.5f + 1e-4f)) << c.name() << " element " << i;
          }
          // topk: nothing it dropped is larger than what it sent. A value well above s / 2 decodes to
          // nonzero if sent, so a zero there was dropped.
          if (c.kind == CodecKind::topk && smallest_sent != INFINITY && largest_unsent > s * 0.51f)
            EXPECT_LE(largest_unsent, smallest_sent) << c.name();
        }
      }
    }
  }
}

TEST(Codec, Fp32IsLossless) {
  std::mt19937 rng(1);
  const auto x = random_values(rng, 1001);
  const Codec c = Codec::fp32();
  const auto y = decoded(c, encode(c, x), x.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(bits(x[i]), bits(y[i]));
}

TEST(Codec, DecodeAddIsTheDenseAddOfTheDecode) {
  std::mt19937 rng(3);
  const size_t n = 1000;
  const auto x = random_values(rng, n);
  auto base = random_values(rng, n);
  for (const Codec& c : all_codecs(256)) {
    const Bytes p = encode(c, x);
    const auto y = decoded(c, p, n);
    for (float w : {1.0f, -1.0f, 0.25f, 1.0f / 3}) {
      auto out = base;
      decode_add(c, p, w, out);
      for (size_t i = 0; i < n; ++i) {
        const float want = base[i] + w * y[i];
        if (w == 1.0f && c.kind != CodecKind::topk)
          EXPECT_EQ(bits(out[i]), bits(want)) << c.name() << " " << i;
        else
          EXPECT_EQ(out[i], want) << c.name() << " w " << w << " " << i;  // topk: -0.0 may stay -0.0
      }
    }
  }
}

// ---- error feedback ----

TEST(Codec, ErrorFeedbackTwoStepsByHand) {
  const Codec c = Codec::int8(2);
  std::vector<float> e{0, 0};
  // a = [127, 0.75]: s = 1, q = [127, 1], x^ = [127, 1], e = [0, -0.25].
  Bytes p = encode_with_feedback(c, std::vector<float>{127, 0.75f}, e, 1.0f);
  EXPECT_EQ(p, (Bytes{0x00, 0x00, 0x80, 0x3f, 0x7f, 0x01}));
  EXPECT_EQ(e, (std::vector<float>{0, -0.25f}));
  // a = e + [127, 0.5] = [127, 0.25]: q = [127, 0], e = [0, 0.25]. The 0.25 lost in step one
  // was sent: x^1 + x^2 + e = [254, 1.25] = u1 + u2.
  p = encode_with_feedback(c, std::vector<float>{127, 0.5f}, e, 1.0f);
  EXPECT_EQ(p, (Bytes{0x00, 0x00, 0x80, 0x3f, 0x7f, 0x00}));
  EXPECT_EQ(e, (std::vector<float>{0, 0.25f}));
  // beta = 0.5: a = 0.5 [0, 0.25] + [127, 0.625] = [127, 0.75] -> q = [127, 1], e = [0, -0.25].
  p = encode_with_feedback(c, std::vector<float>{127, 0.625f}, e, 0.5f);
  EXPECT_EQ(p, (Bytes{0x00, 0x00, 0x80, 0x3f, 0x7f, 0x01}));
  EXPECT_EQ(e, (std::vector<float>{0, -0.25f}));
}

TEST(Codec, ErrorFeedbackTelescopes) {
  // With beta = 1, sum_t x^_t + e_T = sum_t u_t up to fp32 rounding of the updates.
  std::mt19937 rng(11);
  const size_t n = 3000, steps = 20;
  for (const Codec& c : {Codec::int8(256), Codec::int4(256), Codec::topk(1.0 / 64, 1024)}) {
    std::vector<float> e(n, 0.0f);
    std::vector<double> sent(n, 0.0), total(n, 0.0);
    for (size_t t = 0; t < steps; ++t) {
      const auto u = random_values(rng, n);
      const auto y = decoded(c, encode_with_feedback(c, u, e, 1.0f), n);
      for (size_t i = 0; i < n; ++i) {
        sent[i] += y[i];
        total[i] += u[i];
      }
    }
    double worst = 0;
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(sent[i] + e[i] - total[i]));
    EXPECT_LT(worst, 1e-4) << c.name();
  }
}

TEST(Codec, ErrorFeedbackLeavesTheBufferOnANonFiniteInput) {
  const Codec c = Codec::int8(4);
  std::vector<float> e{0.5f, -0.25f, 0, 1, 2, 3, 4, 5};
  const auto before = e;
  std::vector<float> u(8, 1.0f);
  u[6] = std::numeric_limits<float>::infinity();
  try {
    encode_with_feedback(c, u, e, 1.0f);
    ADD_FAILURE() << "encoded Inf";
  } catch (const NonFiniteChunk& err) {
    EXPECT_EQ(err.chunk(), 1u);
  }
  EXPECT_EQ(e, before);
  // beta e + u overflowing to Inf is refused the same way.
  std::vector<float> big(4, FLT_MAX), ebig(4, FLT_MAX);
  EXPECT_THROW(encode_with_feedback(c, big, ebig, 1.0f), NonFiniteChunk);
  std::vector<float> short_e(3);
  EXPECT_THROW(encode_with_feedback(c, big, short_e, 1.0f), Error);
}

// ---- settings ----

TEST(Codec, CompressionSetting) {
  EXPECT_EQ(parse_compression("none"), Compression::none);
  EXPECT_EQ(parse_compression("int8"), Compression::int8);
  EXPECT_EQ(parse_compression("int4"), Compression::int4);
  EXPECT_EQ(parse_compression("topk"), Compression::topk);
  try {
    parse_compression("zstd");
    ADD_FAILURE() << "accepted zstd";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("algo.compression"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("int4"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(default_codec(Compression::none));
  EXPECT_EQ(default_codec(Compression::int8)->chunk, 256u);
  EXPECT_EQ(default_codec(Compression::topk)->chunk, 4096u);
  EXPECT_DOUBLE_EQ(default_codec(Compression::topk)->density, 1.0 / 64);
}

TEST(Codec, RefusesBadParameters) {
  EXPECT_THROW(Codec::int8(0), Error);
  EXPECT_THROW(Codec::topk(0), Error);
  EXPECT_THROW(Codec::topk(1.5), Error);
  EXPECT_THROW(Codec::topk(std::nan("")), Error);
  Codec hand{CodecKind::int8, 0, 1.0};  // built without the checks
  EXPECT_THROW(payload_bytes(hand, 10), Error);
  std::vector<float> x(10);
  std::vector<uint8_t> small(3);
  EXPECT_THROW(encode_into(Codec::int8(), x, small), Error);
}
