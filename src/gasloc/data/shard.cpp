#include "gasloc/data/shard.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::data {
namespace fs = std::filesystem;

// The format is little-endian on disk; we copy raw memory, so refuse to build elsewhere
// rather than silently writing byte-swapped shards.
static_assert(std::endian::native == std::endian::little, "shard I/O assumes a little-endian host");

std::string encode_shard(const std::vector<uint16_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    throw DataError("shard of " + std::to_string(tokens.size()) + " tokens exceeds the int32 token count of the llm.c header",
                    "split the tokens into several shards");
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::string bytes(kShardHeaderBytes + tokens.size() * sizeof(uint16_t), '\0');
  std::memcpy(bytes.data(), header, kShardHeaderBytes);
  if (!tokens.empty()) std::memcpy(bytes.data() + kShardHeaderBytes, tokens.data(), tokens.size() * sizeof(uint16_t));
  return bytes;
}

void write_shard(const fs::path& path, const std::vector<uint16_t>& tokens) {
  write_file_atomic(path, encode_shard(tokens));
}

MappedShard::MappedShard(MappedShard&& other) noexcept { *this = std::move(other); }

MappedShard& MappedShard::operator=(MappedShard&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedShard::~MappedShard() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

MappedShard MappedShard::open(const fs::path& path, int64_t vocab_size) {
  const std::string name = "token shard '" + path.string() + "'";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw DataError(name + " does not exist", "check the path, or create shards with `gasloc prepare`");
  struct Fd {  // closed on every path; the mapping keeps its own reference to the file
    int fd;
    ~Fd() { if (fd >= 0) ::close(fd); }
  } file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) throw DataError("cannot open " + name + ": " + std::strerror(errno), "check the file's permissions");
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) throw DataError("cannot stat " + name + ": " + std::strerror(errno));
  const auto file_bytes = static_cast<int64_t>(st.st_size);
  if (file_bytes < kShardHeaderBytes)
    throw DataError(name + " is " + std::to_string(file_bytes) + " bytes, shorter than the " +
                        std::to_string(kShardHeaderBytes) + "-byte llm.c header",
                    "the file is truncated or not a token shard; recreate it with `gasloc prepare`");
  MappedShard m;
  void* base = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, file.fd, 0);
  if (base == MAP_FAILED) throw DataError("cannot map " + name + ": " + std::strerror(errno));
  m.base_ = base;
  m.bytes_ = static_cast<size_t>(file_bytes);

  int32_t header[kShardHeaderInts];
  std::memcpy(header, m.base_, kShardHeaderBytes);
  if (header[0] != kShardMagic)
    throw DataError(name + " has bad magic number: expected " + std::to_string(kShardMagic) + ", got " +
                        std::to_string(header[0]),
                    "this is not an llm.c token shard (uint16 tokens after a 256-int32 header); "
                    "create shards with `gasloc prepare` or llm.c's dataset scripts");
  if (header[1] != kShardVersion)
    throw DataError(name + " has unsupported version " + std::to_string(header[1]) + " (supported: " +
                        std::to_string(kShardVersion) + ")",
                    "version 2 and later hold other token widths; re-export the shard with uint16 tokens (version 1)");
  const int64_t count = header[2];
  const int64_t body = file_bytes - kShardHeaderBytes;
  if (count < 0 || body != count * 2)
    throw DataError(name + " is truncated or corrupt: header says " + std::to_string(count) + " tokens (" +
                        std::to_string(count * 2) + " bytes) but " + std::to_string(body) + " bytes follow the header",
                    "the file was cut short (interrupted copy or download?); recreate or re-download it");
  // The body starts 1024 bytes into a page-aligned mapping, so uint16 access is aligned.
  m.tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(m.base_) + kShardHeaderBytes);
  m.size_ = count;

  if (vocab_size > 0) {
    // One branch-free pass for the maximum (the whole corpus goes through here at open), and
    // a second only to name the first offending position.
    uint16_t max_id = 0;
    for (int64_t i = 0; i < count; ++i) max_id = std::max(max_id, m.tokens_[i]);
    if (max_id >= vocab_size) {
      int64_t i = 0;
      while (m.tokens_[i] < vocab_size) ++i;
      throw DataError(name + " has token id " + std::to_string(m.tokens_[i]) + " at position " + std::to_string(i) +
                          ", which is >= the vocabulary size " + std::to_string(vocab_size),
                      "the shard was made with a different tokenizer; re-prepare the data or set the model's "
                      "vocab size to match the tokenizer");
    }
  }
  return m;
}

std::vector<uint16_t> read_shard(const fs::path& path, int64_t vocab_size) {
  const MappedShard m = MappedShard::open(path, vocab_size);
  return std::vector<uint16_t>(m.tokens(), m.tokens() + m.size());
}

}  // namespace gasloc::data
