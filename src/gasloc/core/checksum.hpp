// A fast 64-bit checksum for detecting damaged files (checkpoints, shards): not cryptographic,
// but any change of a byte changes it with probability 1 - 2^-64. It runs at memory speed
// (several GB/s), so every checkpoint can be verified when it is loaded.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace gasloc {

class Checksum {
 public:
  void update(const void* data, size_t bytes);
  uint64_t value() const;
  std::string hex() const;  // 16 lowercase hex digits

 private:
  // Four independent lanes (as in xxHash64) keep the multiplier pipeline full.
  uint64_t lane_[4] = {0x9E3779B185EBCA87ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull, 0x85EBCA77C2B2AE63ull};
  uint64_t total_ = 0;
  unsigned char tail_[32] = {};
  size_t tail_len_ = 0;
  void block(const unsigned char* p);
};

}  // namespace gasloc
