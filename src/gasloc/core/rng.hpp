// Counter-based random numbers: the k-th draw of a stream is a pure function of (seed, k), so
// a stream's whole state is one counter, which makes samplers trivially resumable and
// identical across machines (no dependence on library RNG implementations).
#pragma once
#include <cstdint>

namespace gasloc {

// SplitMix64 finalizer: a bijective mix with good avalanche (Steele et al., 2014).
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The k-th 64-bit value of stream `seed`.
constexpr uint64_t random_u64(uint64_t seed, uint64_t k) { return mix64(mix64(seed) ^ mix64(k + 0x632be59bd9b4e019ULL)); }

// Uniform integer in [0, n) for the k-th draw of stream `seed` (n > 0). The modulo bias is
// below n / 2^64, negligible for token positions.
constexpr uint64_t random_below(uint64_t seed, uint64_t k, uint64_t n) { return random_u64(seed, k) % n; }

}  // namespace gasloc
