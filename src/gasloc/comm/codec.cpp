// The codecs of codec.hpp. Built without torch's precompiled header and with
// -ffp-contract=off (CMakeLists.txt): every value is one IEEE fp32 operation rounded as
// written, which is what makes the bytes the same on every CPU. No -ffast-math: the division
// stays a division and the rounding below is not folded away.
#include "gasloc/comm/codec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

namespace gasloc::comm {

static_assert(std::endian::native == std::endian::little, "payloads are little-endian and written with memcpy");
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559);

namespace {

// The loops over a chunk's values, built twice on x86-64 with GCC: for AVX2 and for the
// baseline, chosen once at load time. Both compute the same IEEE operations element by element
// (division, addition, comparison, integer max), so the bytes do not depend on the choice.
// -DGASLOC_CODEC_KERNEL= builds the baseline alone (to test it on an AVX2 machine).
#ifndef GASLOC_CODEC_KERNEL
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GASLOC_CODEC_KERNEL __attribute__((target_clones("avx2", "default")))
#else
#define GASLOC_CODEC_KERNEL
#endif
#endif

// fp32's exponent-all-ones bits: |x|'s bit pattern at or above it is Inf or NaN.
constexpr uint32_t kNonFiniteBits = 0x7f800000u;
// Adding 1.5 * 2^23 to any |v| < 2^22 rounds it to an integer, ties to even, in the default
// rounding mode: the sum lies in [2^23, 2^24), where fp32's spacing is exactly 1, and 1.5 * 2^23
// is even, so a tie goes to the even integer. The sum is then 1.5 * 2^23 + nearbyint(v) exactly,
// and, unlike std::nearbyint, it vectorizes on every x86-64 (tests/test_codec.cpp checks the
// codes against nearbyint).
constexpr float kRoundMagic = 12582912.0f;
constexpr float kInt8Levels = 127.0f, kInt4Levels = 7.0f;

const char* kind_name(CodecKind k) {
  switch (k) {
    case CodecKind::fp32: return "fp32";
    case CodecKind::int8: return "int8";
    case CodecKind::int4: return "int4";
    case CodecKind::topk: return "topk";
  }
  return "?";
}

// Any Codec, however built, is checked at every entry point.
void check(const Codec& c) {
  if (c.chunk == 0) throw Error(c.name() + ": the chunk length is 0", "give a chunk length of at least 1");
  if (c.kind == CodecKind::topk) {
    if (!(c.density > 0 && c.density <= 1))
      throw Error(fmt::format("topk: density {} is not in (0, 1]", c.density), "set the density to a fraction such as 1/64");
    if (c.chunk > (size_t{1} << 32)) throw Error(c.name() + ": chunks longer than 2^32 have no index packing", "use a shorter chunk");
  }
}

// Bytes of k topk indices: 12 bits each, packed as a little-endian bit stream (index j in bits
// 12j..12j+11), when the codec's C <= 4096; otherwise 16-bit when C <= 65536, else 32-bit.
size_t index_bytes(size_t chunk, size_t k) {
  if (chunk <= 4096) return (3 * k + 1) / 2;
  return chunk <= 65536 ? 2 * k : 4 * k;
}

size_t chunk_bytes(const Codec& c, size_t len) {
  switch (c.kind) {
    case CodecKind::fp32: return 4 * len;
    case CodecKind::int8: return 4 + len;
    case CodecKind::int4: return 4 + (len + 1) / 2;
    case CodecKind::topk: {
      const size_t k = topk_count(c.density, len);
      return 4 + index_bytes(c.chunk, k) + k;
    }
  }
  return 0;
}

// Calls fn(chunk index, first element, length, payload offset) for every chunk of n elements.
template <class Fn>
void for_each_chunk(const Codec& c, size_t n, Fn&& fn) {
  const size_t full_bytes = chunk_bytes(c, c.chunk);
  for (size_t j = 0, begin = 0; begin < n; ++j, begin += c.chunk)
    fn(j, begin, std::min(c.chunk, n - begin), j * full_bytes);
}

uint32_t abs_bits(float x) { return std::bit_cast<uint32_t>(x) & 0x7fffffffu; }

// max |x| as its bit pattern: for non-negative floats the integer order is the float order, so
// this is an integer max (vectorizes, no NaN rules), and a result >= kNonFiniteBits says the
// chunk holds Inf or NaN, all in the same pass. kLanes independent maxima so that the loop is
// not one long chain of dependent compares; bit 31 is clear, so a signed max is the same.
constexpr size_t kLanes = 16;

GASLOC_CODEC_KERNEL
uint32_t max_abs_bits(const float* __restrict x, size_t len) {
  int32_t lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= len; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) {
      const auto b = static_cast<int32_t>(abs_bits(x[i + l]));
      lane[l] = b > lane[l] ? b : lane[l];
    }
  int32_t m = 0;
  for (; i < len; ++i) {
    const auto b = static_cast<int32_t>(abs_bits(x[i]));
    m = b > m ? b : m;
  }
  for (int32_t v : lane) m = v > m ? v : m;
  return static_cast<uint32_t>(m);
}

// s = max|x| / levels in fp32; 0 when that is 0 or subnormal (x / s could overflow).
float scale_of(uint32_t max_bits, float levels) {
  const float s = std::bit_cast<float>(max_bits) / levels;
  return s >= FLT_MIN ? s : 0.0f;
}

// q = clamp(rint(x / s), -levels, levels) for s > 0, branch-free so that it vectorizes.
// Clamping before rounding is the same (the bounds are integers). After adding kRoundMagic the
// sum is 1.5 * 2^23 + q exactly, so q is the difference of the two bit patterns.
GASLOC_CODEC_KERNEL
void quantize(const float* __restrict x, size_t len, float s, float levels, int8_t* __restrict q) {
  constexpr auto magic_bits = std::bit_cast<int32_t>(kRoundMagic);
  for (size_t i = 0; i < len; ++i) {
    float v = x[i] / s;
    v = v < -levels ? -levels : v;
    v = v > levels ? levels : v;
    q[i] = static_cast<int8_t>(std::bit_cast<int32_t>(v + kRoundMagic) - magic_bits);
  }
}

void put_scale(uint8_t* p, float s) { std::memcpy(p, &s, 4); }
float get_scale(const uint8_t* p) {
  float s;
  std::memcpy(&s, p, 4);
  return s;
}

[[noreturn]] void bad(const Codec& c, size_t chunk, const std::string& what) {
  throw BadPayload(fmt::format("{} payload, chunk {}: {}", c.name(), chunk, what),
                   "the peer sent bytes its encoder cannot produce (a different codec or chunk, or corruption)");
}

// A scale an encoder writes: +0 or a positive, finite, normal fp32.
void check_scale(const Codec& c, size_t chunk, float s) {
  if (std::bit_cast<uint32_t>(s) != 0 && !(s >= FLT_MIN && s <= FLT_MAX))
    bad(c, chunk, fmt::format("scale {} is not 0 or a positive normal finite number", s));
}

// Codes an encoder writes: within +-levels (the one code below, -levels - 1, is the only one
// outside: -128 for int8, -8 for a sign-extended nibble); all 0 under a zero scale; otherwise
// some code is +-levels (max|x| / fl(max|x| / L) is within 2^-20 of L, so it rounds to L).
// Three OR-reductions of byte compares: they vectorize without SSE4.1's byte min/max. The
// kernel only reports and its caller throws (a throw from inside a target clone terminated the
// test program with GCC 12).
struct CodeScan {
  bool outside, peak, nonzero;
};

GASLOC_CODEC_KERNEL
CodeScan scan_codes(const int8_t* __restrict q, size_t len, int levels) {
  const auto top = static_cast<int8_t>(levels), bottom = static_cast<int8_t>(-levels), below = static_cast<int8_t>(-levels - 1);
  uint8_t outside = 0, peak = 0, nonzero = 0;
  for (size_t i = 0; i < len; ++i) {
    outside |= q[i] == below;
    peak |= (q[i] == top) | (q[i] == bottom);
    nonzero |= static_cast<uint8_t>(q[i]);
  }
  return {outside != 0, peak != 0, nonzero != 0};
}

void check_codes(const Codec& c, size_t chunk, float s, const int8_t* q, size_t len, int levels) {
  const CodeScan scan = scan_codes(q, len, levels);
  if (scan.outside) bad(c, chunk, fmt::format("a code outside [-{0}, {0}]", levels));
  if (s == 0 && scan.nonzero) bad(c, chunk, "nonzero codes under a zero scale");
  if (s != 0 && !scan.peak) bad(c, chunk, fmt::format("a nonzero scale but no code reaches +-{}", levels));
}

// Where a decode puts x^: stored into out, or added to it as w x^ (decode_add).
struct Into {
  bool add = false;
  float w = 1.0f;
};
// A decode checks every chunk before it writes any, so that garbage leaves `out` as it was.
enum class Phase { check, write };

GASLOC_CODEC_KERNEL
void dequantize(const int8_t* __restrict q, size_t len, float s, float* __restrict out, Into into) {
  if (into.add)
    for (size_t i = 0; i < len; ++i) out[i] += into.w * (static_cast<float>(q[i]) * s);
  else
    for (size_t i = 0; i < len; ++i) out[i] = static_cast<float>(q[i]) * s;
}

// ---- fp32 ----

void fp32_encode(const Codec& c, size_t j, size_t begin, const float* x, size_t len, uint8_t* out) {
  if (max_abs_bits(x, len) >= kNonFiniteBits) throw NonFiniteChunk(j, begin, begin + len - 1, c);
  std::memcpy(out, x, 4 * len);
}

void fp32_decode(const Codec& c, size_t j, const uint8_t* p, size_t len, float* __restrict out, Into into, Phase phase,
                 float* x) {
  std::memcpy(x, p, 4 * len);
  if (phase == Phase::check) {
    if (max_abs_bits(x, len) >= kNonFiniteBits) bad(c, j, "a non-finite value");
    return;
  }
  if (into.add)
    for (size_t i = 0; i < len; ++i) out[i] += into.w * x[i];
  else
    std::memcpy(out, x, 4 * len);
}

// ---- int8 / int4 ----

void int8_encode(const Codec& c, size_t j, size_t begin, const float* x, size_t len, uint8_t* out) {
  const uint32_t m = max_abs_bits(x, len);
  if (m >= kNonFiniteBits) throw NonFiniteChunk(j, begin, begin + len - 1, c);
  const float s = scale_of(m, kInt8Levels);
  put_scale(out, s);
  int8_t* q = reinterpret_cast<int8_t*>(out + 4);
  if (s == 0)
    std::memset(q, 0, len);
  else
    quantize(x, len, s, kInt8Levels, q);
}

void int8_decode(const Codec& c, size_t j, const uint8_t* p, size_t len, float* out, Into into, Phase phase) {
  const float s = get_scale(p);
  const int8_t* q = reinterpret_cast<const int8_t*>(p + 4);
  if (phase == Phase::check) {
    check_scale(c, j, s);
    check_codes(c, j, s, q, len, 127);
    return;
  }
  dequantize(q, len, s, out, into);
}

// Two 4-bit two's-complement codes a byte, the even element in the low nibble; an odd
// chunk's last high nibble is 0. `q` is scratch of at least len codes.
void int4_encode(const Codec& c, size_t j, size_t begin, const float* x, size_t len, uint8_t* out, int8_t* q) {
  const uint32_t m = max_abs_bits(x, len);
  if (m >= kNonFiniteBits) throw NonFiniteChunk(j, begin, begin + len - 1, c);
  const float s = scale_of(m, kInt4Levels);
  put_scale(out, s);
  if (s == 0)
    std::memset(q, 0, len);
  else
    quantize(x, len, s, kInt4Levels, q);
  uint8_t* b = out + 4;
  const size_t pairs = len / 2;
  for (size_t i = 0; i < pairs; ++i) b[i] = static_cast<uint8_t>((q[2 * i] & 0x0f) | (q[2 * i + 1] << 4));
  if (len % 2) b[pairs] = static_cast<uint8_t>(q[len - 1] & 0x0f);
}

void int4_decode(const Codec& c, size_t j, const uint8_t* p, size_t len, float* out, Into into, Phase phase, int8_t* q) {
  const float s = get_scale(p);
  const uint8_t* b = p + 4;
  // Sign-extends each nibble: shift it to the top of an int8, then arithmetic-shift back.
  const size_t pairs = len / 2;
  for (size_t i = 0; i < pairs; ++i) {
    q[2 * i] = static_cast<int8_t>(static_cast<int8_t>(b[i] << 4) >> 4);
    q[2 * i + 1] = static_cast<int8_t>(static_cast<int8_t>(b[i]) >> 4);
  }
  if (len % 2) q[len - 1] = static_cast<int8_t>(static_cast<int8_t>(b[pairs] << 4) >> 4);
  if (phase == Phase::check) {
    check_scale(c, j, s);
    if (len % 2 && (b[pairs] >> 4)) bad(c, j, "the padding nibble of an odd chunk is not 0");
    check_codes(c, j, s, q, len, 7);
    return;
  }
  dequantize(q, len, s, out, into);
}

// ---- topk ----

struct TopkScratch {
  std::vector<uint32_t> abs, sorted, idx;
  std::vector<float> val;
};

void put_indices(uint8_t* p, const uint32_t* idx, size_t k, size_t chunk) {
  if (chunk <= 4096) {
    for (size_t i = 0; i + 1 < k; i += 2) {
      p[0] = static_cast<uint8_t>(idx[i]);
      p[1] = static_cast<uint8_t>((idx[i] >> 8) | ((idx[i + 1] & 0x0f) << 4));
      p[2] = static_cast<uint8_t>(idx[i + 1] >> 4);
      p += 3;
    }
    if (k % 2) {
      p[0] = static_cast<uint8_t>(idx[k - 1]);
      p[1] = static_cast<uint8_t>(idx[k - 1] >> 8);
    }
  } else if (chunk <= 65536) {
    for (size_t i = 0; i < k; ++i) {
      const uint16_t v = static_cast<uint16_t>(idx[i]);
      std::memcpy(p + 2 * i, &v, 2);
    }
  } else {
    std::memcpy(p, idx, 4 * k);
  }
}

void get_indices(const Codec& c, size_t j, const uint8_t* p, size_t k, uint32_t* idx) {
  if (c.chunk <= 4096) {
    for (size_t i = 0; i + 1 < k; i += 2) {
      idx[i] = p[0] | (uint32_t{p[1]} & 0x0f) << 8;
      idx[i + 1] = (p[1] >> 4) | uint32_t{p[2]} << 4;
      p += 3;
    }
    if (k % 2) {
      if (p[1] >> 4) bad(c, j, "the padding of the last 12-bit index is not 0");
      idx[k - 1] = p[0] | (uint32_t{p[1]} & 0x0f) << 8;
    }
  } else if (c.chunk <= 65536) {
    for (size_t i = 0; i < k; ++i) {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      idx[i] = v;
    }
  } else {
    std::memcpy(idx, p, 4 * k);
  }
}

// Per chunk: the k largest |x| (ties to the lower index) in ascending index order, then the
// int8 of their values under s = max|x| / 127 (the largest is always among them).
void topk_encode(const Codec& c, size_t j, size_t begin, const float* x, size_t len, uint8_t* out, TopkScratch& t) {
  const size_t k = topk_count(c.density, len);
  uint32_t* a = t.abs.data();
  uint32_t m = 0;
  for (size_t i = 0; i < len; ++i) {
    a[i] = abs_bits(x[i]);
    m = a[i] > m ? a[i] : m;
  }
  if (m >= kNonFiniteBits) throw NonFiniteChunk(j, begin, begin + len - 1, c);
  // T: the k-th largest |x|. Every |x| > T is taken (fewer than k of them), then the |x| == T
  // in index order until there are k: exactly "ties to the lower index".
  uint32_t threshold = 0;
  size_t take_equal = k;
  if (k < len) {
    // Only the |x| >= g can be among the k largest, where g is the least of the maxima of k
    // groups: each group has one value >= g, so T >= g. For spread values that leaves a few
    // times k candidates for nth_element instead of the whole chunk.
    uint32_t g = UINT32_MAX;
    for (size_t grp = 0; grp < k; ++grp) {
      uint32_t gm = 0;
      for (size_t i = grp * len / k, end = (grp + 1) * len / k; i < end; ++i) gm = a[i] > gm ? a[i] : gm;
      g = gm < g ? gm : g;
    }
    uint32_t* s = t.sorted.data();
    size_t candidates = 0;
    for (size_t i = 0; i < len; ++i) {
      s[candidates] = a[i];
      candidates += a[i] >= g;
    }
    std::nth_element(s, s + (k - 1), s + candidates, std::greater<uint32_t>());
    threshold = s[k - 1];
    take_equal = k - static_cast<size_t>(std::count_if(s, s + (k - 1), [&](uint32_t v) { return v > threshold; }));
  }
  uint32_t* idx = t.idx.data();
  float* val = t.val.data();
  for (size_t i = 0, n = 0; i < len && n < k; ++i) {
    if (a[i] > threshold || (a[i] == threshold && take_equal > 0)) {
      if (a[i] == threshold) --take_equal;
      idx[n] = static_cast<uint32_t>(i);
      val[n++] = x[i];
    }
  }
  const float s = scale_of(m, kInt8Levels);
  put_scale(out, s);
  uint8_t* p = out + 4;
  put_indices(p, idx, k, c.chunk);
  p += index_bytes(c.chunk, k);
  int8_t* q = reinterpret_cast<int8_t*>(p);
  if (s == 0)
    std::memset(q, 0, k);
  else
    quantize(val, k, s, kInt8Levels, q);
}

void topk_decode(const Codec& c, size_t j, const uint8_t* p, size_t len, float* out, Into into, Phase phase, uint32_t* idx) {
  const size_t k = topk_count(c.density, len);
  const float s = get_scale(p);
  get_indices(c, j, p + 4, k, idx);
  const int8_t* q = reinterpret_cast<const int8_t*>(p + 4 + index_bytes(c.chunk, k));
  if (phase == Phase::check) {
    check_scale(c, j, s);
    for (size_t i = 0; i < k; ++i)
      if (idx[i] >= len || (i > 0 && idx[i] <= idx[i - 1]))
        bad(c, j, fmt::format("index {} of {} is {}: indices must ascend below the chunk's length {}", i, k, idx[i], len));
    check_codes(c, j, s, q, k, 127);
    return;
  }
  if (into.add) {
    for (size_t i = 0; i < k; ++i) out[idx[i]] += into.w * (static_cast<float>(q[i]) * s);
  } else {
    std::fill(out, out + len, 0.0f);
    for (size_t i = 0; i < k; ++i) out[idx[i]] = static_cast<float>(q[i]) * s;
  }
}

// Encodes chunk after chunk with scratch sized once for the codec's chunk.
class Encoder {
 public:
  Encoder(const Codec& c, size_t n) : c_(c) {
    const size_t len = std::min(c.chunk, n);
    if (c.kind == CodecKind::int4) q_.resize(len);
    if (c.kind == CodecKind::topk) {
      t_.abs.resize(len);
      t_.sorted.resize(len);
      t_.idx.resize(len);
      t_.val.resize(len);
    }
  }
  // Chunk j, elements [begin, begin + len) of the caller's span, at x; its bytes at out.
  void chunk(size_t j, size_t begin, const float* x, size_t len, uint8_t* out) {
    switch (c_.kind) {
      case CodecKind::fp32: fp32_encode(c_, j, begin, x, len, out); break;
      case CodecKind::int8: int8_encode(c_, j, begin, x, len, out); break;
      case CodecKind::int4: int4_encode(c_, j, begin, x, len, out, q_.data()); break;
      case CodecKind::topk: topk_encode(c_, j, begin, x, len, out, t_); break;
    }
  }

 private:
  const Codec& c_;
  std::vector<int8_t> q_;
  TopkScratch t_;
};

// Decodes every chunk into `out`. Storing fills topk's unsent coordinates with 0; adding
// leaves them.
void decode_all(const Codec& c, std::span<const uint8_t> payload, std::span<float> out, Into into) {
  check(c);
  const size_t n = out.size(), want = payload_bytes(c, n);
  if (payload.size() != want)
    throw BadPayload(fmt::format("{} payload for {} elements is {} bytes, expected {}", c.name(), n, payload.size(), want),
                     "sender and receiver disagree on the codec or the buffer's length, or the payload was cut");
  const size_t scratch = std::min(c.chunk, n);  // the longest chunk; topk's k grows with the length
  std::vector<float> x(c.kind == CodecKind::fp32 ? scratch : 0);
  std::vector<int8_t> q(c.kind == CodecKind::int4 ? scratch : 0);
  std::vector<uint32_t> idx(c.kind == CodecKind::topk && n > 0 ? topk_count(c.density, scratch) : 0);
  for (Phase phase : {Phase::check, Phase::write}) {
    for_each_chunk(c, n, [&](size_t j, size_t begin, size_t len, size_t offset) {
      const uint8_t* p = payload.data() + offset;
      float* o = out.data() + begin;
      switch (c.kind) {
        case CodecKind::fp32: fp32_decode(c, j, p, len, o, into, phase, x.data()); break;
        case CodecKind::int8: int8_decode(c, j, p, len, o, into, phase); break;
        case CodecKind::int4: int4_decode(c, j, p, len, o, into, phase, q.data()); break;
        case CodecKind::topk: topk_decode(c, j, p, len, o, into, phase, idx.data()); break;
      }
    });
  }
}

}  // namespace

// ---- Codec ----

Codec Codec::fp32(size_t chunk) {
  Codec c{CodecKind::fp32, chunk, 1.0};
  check(c);
  return c;
}
Codec Codec::int8(size_t chunk) {
  Codec c{CodecKind::int8, chunk, 1.0};
  check(c);
  return c;
}
Codec Codec::int4(size_t chunk) {
  Codec c{CodecKind::int4, chunk, 1.0};
  check(c);
  return c;
}
Codec Codec::topk(double density, size_t chunk) {
  Codec c{CodecKind::topk, chunk, density};
  check(c);
  return c;
}

std::string Codec::name() const {
  if (kind == CodecKind::topk) return fmt::format("topk (density {}, C = {})", density, chunk);
  return fmt::format("{} (C = {})", kind_name(kind), chunk);
}

NonFiniteChunk::NonFiniteChunk(size_t chunk, size_t first, size_t last, const Codec& codec)
    : Error(fmt::format("non-finite value (NaN or Inf) in chunk {} (elements {}..{}) of an {} encoding", chunk, first, last,
                        codec.name()),
            "the values diverged before being sent: lower the learning rate, check the data, or resume from a checkpoint"),
      chunk_(chunk) {}

// ---- sizes ----

size_t topk_count(double density, size_t chunk_len) {
  const auto k = static_cast<size_t>(std::floor(density * static_cast<double>(chunk_len) + 0.5));
  return std::clamp<size_t>(k, 1, std::max<size_t>(chunk_len, 1));
}

size_t payload_bytes(const Codec& c, size_t n) {
  check(c);
  const size_t full = n / c.chunk, tail = n % c.chunk;
  return full * chunk_bytes(c, c.chunk) + (tail ? chunk_bytes(c, tail) : 0);
}

double bits_per_parameter(const Codec& c) {
  check(c);
  return 8.0 * static_cast<double>(chunk_bytes(c, c.chunk)) / static_cast<double>(c.chunk);
}

// ---- encode / decode ----

void encode_into(const Codec& c, std::span<const float> x, std::span<uint8_t> out) {
  check(c);
  const size_t n = x.size(), want = payload_bytes(c, n);
  if (out.size() != want)
    throw Error(fmt::format("{} encoding of {} elements needs {} bytes, given {}", c.name(), n, want, out.size()),
                "size the buffer with payload_bytes()");
  Encoder enc(c, n);
  for_each_chunk(c, n, [&](size_t j, size_t begin, size_t len, size_t offset) {
    enc.chunk(j, begin, x.data() + begin, len, out.data() + offset);
  });
}

std::vector<uint8_t> encode(const Codec& c, std::span<const float> x) {
  std::vector<uint8_t> out(payload_bytes(c, x.size()));
  encode_into(c, x, out);
  return out;
}

void decode(const Codec& c, std::span<const uint8_t> payload, std::span<float> out) {
  decode_all(c, payload, out, Into{});
}

void decode_add(const Codec& c, std::span<const uint8_t> payload, float w, std::span<float> out) {
  decode_all(c, payload, out, Into{true, w});
}

// Two passes so that a throw leaves e untouched: encode a chunk by chunk from a scratch copy,
// then recompute a into e (the same fp32 operations, so the same values) and subtract x^ there
// (decode_add with w = -1: a + (-x^) is a - x^ exactly).
std::vector<uint8_t> encode_with_feedback(const Codec& c, std::span<const float> u, std::span<float> e, float beta) {
  check(c);
  if (u.size() != e.size())
    throw Error(fmt::format("error feedback: {} values but a feedback buffer of {}", u.size(), e.size()),
                "the feedback buffer must match the quantity it corrects");
  const size_t n = u.size();
  std::vector<uint8_t> out(payload_bytes(c, n));
  std::vector<float> a(std::min(c.chunk, n));
  Encoder enc(c, n);
  for_each_chunk(c, n, [&](size_t j, size_t begin, size_t len, size_t offset) {
    for (size_t i = 0; i < len; ++i) a[i] = beta * e[begin + i] + u[begin + i];
    enc.chunk(j, begin, a.data(), len, out.data() + offset);
  });
  for (size_t i = 0; i < n; ++i) e[i] = beta * e[i] + u[i];
  decode_add(c, out, -1.0f, e);
  return out;
}

// ---- algo.compression ----

const config::Choices& compressions() {
  static const config::Choices c("compression", {{"none", "fp32 exchanges, as without a codec"},
                                                 {"int8", "8 bits and one fp32 scale per 256 values"},
                                                 {"int4", "4 bits and one fp32 scale per 256 values"},
                                                 {"topk", "the 1/64 largest of every 4096 values, int8, 12-bit indices"}});
  return c;
}

Compression parse_compression(std::string_view value) {
  if (!compressions().contains(value))
    throw ConfigError(fmt::format("config key 'algo.compression': unknown compression '{}'; valid: {}", value,
                                  compressions().names()),
                      "fix 'algo.compression' in the job file or --set");
  return static_cast<Compression>(compressions().index(value));
}

std::optional<Codec> default_codec(Compression c) {
  switch (c) {
    case Compression::none: return std::nullopt;
    case Compression::int8: return Codec::int8();
    case Compression::int4: return Codec::int4();
    case Compression::topk: return Codec::topk();
  }
  return std::nullopt;
}

}  // namespace gasloc::comm
