#include "gasloc/core/checksum.hpp"

#include <cstring>

#include <fmt/format.h>

namespace gasloc {

namespace {
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull;
uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
uint64_t mix(uint64_t acc, uint64_t in) { return rotl(acc + in * kP2, 31) * kP1; }
uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
}  // namespace

void Checksum::block(const unsigned char* p) {
  for (int k = 0; k < 4; ++k) lane_[k] = mix(lane_[k], load64(p + 8 * k));
}

void Checksum::update(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += bytes;
  if (tail_len_ > 0) {
    const size_t take = std::min(bytes, sizeof tail_ - tail_len_);
    std::memcpy(tail_ + tail_len_, p, take);
    tail_len_ += take;
    p += take;
    bytes -= take;
    if (tail_len_ < sizeof tail_) return;
    block(tail_);
    tail_len_ = 0;
  }
  for (; bytes >= 32; p += 32, bytes -= 32) block(p);
  std::memcpy(tail_, p, bytes);
  tail_len_ = bytes;
}

uint64_t Checksum::value() const {
  uint64_t h = rotl(lane_[0], 1) + rotl(lane_[1], 7) + rotl(lane_[2], 12) + rotl(lane_[3], 18);
  for (int k = 0; k < 4; ++k) h = (h ^ mix(0, lane_[k])) * kP1 + kP3;
  h += total_;
  for (size_t i = 0; i < tail_len_; ++i) h = rotl(h ^ (tail_[i] * kP3), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

std::string Checksum::hex() const { return fmt::format("{:016x}", value()); }

}  // namespace gasloc
