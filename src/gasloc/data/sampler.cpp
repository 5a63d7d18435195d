#include "gasloc/data/sampler.hpp"

#include <fmt/format.h>

#include "gasloc/core/error.hpp"
#include "gasloc/core/rng.hpp"

namespace gasloc::data {
namespace {

void check_sizes(int64_t batch_size, int64_t seq_len) {
  if (batch_size < 1 || seq_len < 1)
    throw DataError(fmt::format("batch size {} and sequence length {} must both be positive", batch_size, seq_len),
                    "fix the batch size / sequence length in the job file");
}

// Builds one batch from window start offsets: one [B, T+1] buffer, split into shifted views
// and made contiguous so callers may .view() them freely.
Batch make_batch(const TokenStream& tokens, const std::vector<int64_t>& starts, int64_t seq_len) {
  const int64_t b = static_cast<int64_t>(starts.size());
  torch::Tensor buf = torch::empty({b, seq_len + 1}, torch::kLong);
  int64_t* out = buf.data_ptr<int64_t>();
  for (int64_t i = 0; i < b; ++i) tokens.read(starts[i], seq_len + 1, out + i * (seq_len + 1));
  using torch::indexing::Slice;
  return {buf.index({Slice(), Slice(0, seq_len)}).contiguous(), buf.index({Slice(), Slice(1, seq_len + 1)}).contiguous()};
}

}  // namespace

TokenRange slice_of(int64_t size, int rank, int world) {
  return {size * rank / world, size * (rank + 1) / world};
}

WindowSampler::WindowSampler(std::shared_ptr<const TokenStream> tokens, int64_t batch_size, int64_t seq_len,
                             uint64_t seed)
    : WindowSampler(tokens, batch_size, seq_len, seed, TokenRange{0, tokens ? tokens->size() : 0}) {}

WindowSampler::WindowSampler(std::shared_ptr<const TokenStream> tokens, int64_t batch_size, int64_t seq_len,
                             uint64_t seed, TokenRange range)
    : tokens_(std::move(tokens)), batch_size_(batch_size), seq_len_(seq_len), range_(range), seed_(seed) {
  check_sizes(batch_size, seq_len);
  const int64_t total = tokens_ ? tokens_->size() : 0;
  if (range.begin < 0 || range.end > total || range.begin > range.end)
    throw DataError(fmt::format("token range [{}, {}) is outside a stream of {} tokens", range.begin, range.end, total),
                    "a sampler's range must lie within its stream (data::slice_of gives such ranges)");
  const int64_t n = range.end - range.begin;
  const bool whole = n == total;
  if (n < seq_len + 1)
    throw DataError(fmt::format("the token {} has {} tokens, but a window of seq_len {} needs {} (seq_len + 1)",
                                whole ? "stream" : "slice", n, seq_len, seq_len + 1),
                    whole ? "use a shorter sequence length or prepare more text"
                          : "each worker's slice is 1/workers of the training stream (data.sampling = \"disjoint\"): "
                            "use fewer workers, a shorter sequence length, or more text");
}

Batch WindowSampler::next() {
  const auto span = static_cast<uint64_t>(range_.end - range_.begin - seq_len_);  // number of valid starts
  std::vector<int64_t> starts(batch_size_);
  for (int64_t i = 0; i < batch_size_; ++i)
    starts[i] = range_.begin + static_cast<int64_t>(random_below(seed_, position_ + i, span));
  position_ += batch_size_;
  return make_batch(*tokens_, starts, seq_len_);
}

std::vector<Batch> validation_batches(const TokenStream& tokens, int64_t batch_size, int64_t seq_len,
                                      int64_t max_batches) {
  check_sizes(batch_size, seq_len);
  const int64_t windows = tokens.size() / (seq_len + 1);
  int64_t batches = windows / batch_size;
  if (batches < 1)
    throw DataError(fmt::format("the validation stream has {} tokens; one batch of {} windows of {} tokens needs {}",
                                tokens.size(), batch_size, seq_len + 1, batch_size * (seq_len + 1)),
                    "hold out more text (raise --val-fraction in `gasloc prepare`) or lower the eval batch size / "
                    "sequence length");
  if (max_batches > 0) batches = std::min(batches, max_batches);
  std::vector<Batch> out;
  out.reserve(batches);
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<int64_t> starts(batch_size);
    for (int64_t i = 0; i < batch_size; ++i) starts[i] = (b * batch_size + i) * (seq_len + 1);
    out.push_back(make_batch(tokens, starts, seq_len));
  }
  return out;
}

}  // namespace gasloc::data
