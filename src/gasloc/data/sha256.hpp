// SHA-256 (FIPS 180-4) for the checksums in dataset.json. Self-contained so the data layer
// needs no crypto library.
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace gasloc::data {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  std::array<uint8_t, 32> digest();  // finalizes; the object must not be updated afterwards
  std::string hex_digest();

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view bytes);
// Streams the file; throws DataError naming it if it cannot be read.
std::string sha256_file_hex(const std::filesystem::path& path);

}  // namespace gasloc::data
