// The modulo codec of gossip (docs/design.md section 12, after Moniqua): pure functions of their
// inputs, like comm/codec.hpp, so that both ends of a pair compute the same bits on every CPU.
// Legend: C the chunk, L the levels each side of 0 (127 for int8, 7 for int4), M = 2L + 1, s a
// worker's values, step the pair's grid per chunk (theta = M step), n = round(s / step).
// A worker sends, per chunk: a uint32 checksum of its n, then n mod M for every element (int8:
// one byte each; int4: two per byte, low nibble first). The receiver, from its own n_i, takes the
// difference k = (x_j - n_i) mod M centred into [-L, L], which is n_j - n_i whenever
// |n_j - n_i| <= L; otherwise (a wrap) the checksum of n_i + k differs from the sender's, and the
// chunk is reported wrapped. Both ends see the same wrap (the checks' errors are negatives of each
// other) and d_ji = -d_ij exactly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace gasloc::algo {

struct ModuloGrid {
  int levels = 127;   // L
  size_t chunk = 256; // C
};

// Exact payload bytes for n elements.
size_t modulo_payload_bytes(const ModuloGrid& g, size_t n);
// The pair's step for one chunk from both ends' (gap, max |s|): theta = margin x the larger gap,
// or 5 x the larger max |s| when either gap is unknown (< 0), which no difference can wrap; never
// finer than the larger max |s| x 2^-22 (fp32 resolution, and n fits), 1 for a chunk of zeros.
// Symmetric in its two ends.
double modulo_step(const ModuloGrid& g, double margin, float gap_i, float gap_j, float max_i, float max_j);
// Per chunk, max |s| (the second half of what a pair swaps first). Throws comm::NonFiniteChunk
// (with an int8 or int4 codec's name) on NaN or Inf.
std::vector<float> chunk_max_abs(const ModuloGrid& g, std::span<const float> s);
// out = the residues of s on `steps` (one per chunk); out is modulo_payload_bytes long.
void modulo_encode(const ModuloGrid& g, std::span<const float> s, std::span<const double> steps, std::span<uint8_t> out);
// d = (n_j - n_i) step per element from own s and the peer's payload; wrapped[c] = 1 for a chunk
// whose checksum failed (its d is 0 there). Throws comm::BadPayload if the payload is not one
// modulo_encode produces (wrong size, a residue out of range).
void modulo_difference(const ModuloGrid& g, std::span<const float> s, std::span<const double> steps,
                       std::span<const uint8_t> peer, std::span<float> d, std::span<uint8_t> wrapped);

}  // namespace gasloc::algo
