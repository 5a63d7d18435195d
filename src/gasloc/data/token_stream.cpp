#include "gasloc/data/token_stream.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gasloc::data {

TokenStream::TokenStream(std::vector<uint16_t> tokens) : owned_(std::move(tokens)) {
  add_piece(owned_.data(), static_cast<int64_t>(owned_.size()));
}

std::shared_ptr<const TokenStream> TokenStream::map_shards(const std::vector<std::filesystem::path>& shards,
                                                           int64_t vocab_size) {
  std::shared_ptr<TokenStream> s(new TokenStream());
  s->maps_.reserve(shards.size());
  for (const auto& path : shards) {
    s->maps_.push_back(MappedShard::open(path, vocab_size));
    s->add_piece(s->maps_.back().tokens(), s->maps_.back().size());
  }
  return s;
}

void TokenStream::add_piece(const uint16_t* data, int64_t n) {
  if (n == 0) return;  // an empty shard would make two pieces start at the same offset
  piece_.push_back(data);
  begin_.push_back(begin_.back() + n);
}

void TokenStream::read(int64_t start, int64_t n, int64_t* out) const {
  if (start < 0 || n < 0 || start + n > size())
    throw std::out_of_range("token range [" + std::to_string(start) + ", " + std::to_string(start + n) +
                            ") outside a stream of " + std::to_string(size()) + " tokens");
  // The piece holding `start`: the last one that begins at or before it.
  size_t p = static_cast<size_t>(std::upper_bound(begin_.begin(), begin_.end(), start) - begin_.begin()) - 1;
  while (n > 0) {
    const int64_t offset = start - begin_[p];
    const int64_t take = std::min(n, begin_[p + 1] - start);
    const uint16_t* src = piece_[p] + offset;
    for (int64_t i = 0; i < take; ++i) out[i] = src[i];
    out += take;
    start += take;
    n -= take;
    ++p;
  }
}

uint16_t TokenStream::at(int64_t i) const {
  int64_t v = 0;
  read(i, 1, &v);
  return static_cast<uint16_t>(v);
}

}  // namespace gasloc::data
