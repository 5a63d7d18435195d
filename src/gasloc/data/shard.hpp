// Token shards in llm.c's format, so that shards written by llm.c's dataset scripts (for
// example fineweb.py) load unchanged and ours load in llm.c:
//   header: 256 little-endian int32 -- [0] magic 20240520, [1] version 1, [2] token count
//   body:   token count little-endian uint16 token ids
// uint16 ids cap the vocabulary at 65536.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace gasloc::data {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr int64_t kShardHeaderInts = 256;
constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// Serializes a shard (header + tokens) into bytes; write_shard writes exactly these.
std::string encode_shard(const std::vector<uint16_t>& tokens);

// Writes a shard atomically (a crash leaves either the old file or the complete new one).
void write_shard(const std::filesystem::path& path, const std::vector<uint16_t>& tokens);

// A shard mapped read-only into memory; its tokens stay valid while the object lives. The file
// must not be truncated meanwhile (reading a page cut from a mapped file is a SIGBUS).
class MappedShard {
 public:
  // Maps and validates a shard. With vocab_size > 0, every id must be below it. Throws
  // DataError naming the file for a missing, short, foreign, truncated or out-of-vocab shard.
  static MappedShard open(const std::filesystem::path& path, int64_t vocab_size = 0);
  MappedShard(MappedShard&& other) noexcept;
  MappedShard& operator=(MappedShard&& other) noexcept;
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;
  ~MappedShard();

  const uint16_t* tokens() const { return tokens_; }
  int64_t size() const { return size_; }

 private:
  MappedShard() = default;
  void* base_ = nullptr;  // the whole file, header included
  size_t bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t size_ = 0;
};

// Reads a shard into memory: MappedShard::open's checks, then a copy.
std::vector<uint16_t> read_shard(const std::filesystem::path& path, int64_t vocab_size = 0);

}  // namespace gasloc::data
