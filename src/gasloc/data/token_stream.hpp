// A read-only stream of token ids: a dataset's shards end to end.
//
// Shards are memory-mapped, not read: a run keeps none of the corpus in its own memory, the
// kernel's page cache serves every process and worker on a host from one copy, and opening a
// 20 GB FineWeb sample costs one validating pass instead of 20 GB of RAM per process. A stream
// may also hold its tokens in a vector (tests, and the reference the mapped path is checked
// against). Shard boundaries are invisible: a window may start in one shard and end in the next,
// exactly as in the concatenated stream.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "gasloc/data/shard.hpp"

namespace gasloc::data {

class TokenStream {
 public:
  explicit TokenStream(std::vector<uint16_t> tokens);  // held in memory
  // Maps the shards in order, validating each as read_shard does (DataError naming the file).
  static std::shared_ptr<const TokenStream> map_shards(const std::vector<std::filesystem::path>& shards,
                                                       int64_t vocab_size);

  int64_t size() const { return begin_.back(); }
  // Tokens [start, start + n), widened to int64, into out. std::out_of_range past the end.
  void read(int64_t start, int64_t n, int64_t* out) const;
  uint16_t at(int64_t i) const;

 private:
  TokenStream() = default;
  void add_piece(const uint16_t* data, int64_t n);

  std::vector<uint16_t> owned_;
  std::vector<MappedShard> maps_;
  std::vector<const uint16_t*> piece_;  // each non-empty piece's first token
  std::vector<int64_t> begin_{0};       // piece i covers [begin_[i], begin_[i + 1]); back() = size
};

}  // namespace gasloc::data
