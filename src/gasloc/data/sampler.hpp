// Batches of token windows for training and evaluation.
//
// Training draws i.i.d. windows of seq_len + 1 tokens: the k-th window of a sampler starts at
// random_below(seed, k, n - seq_len), so the sampler's whole state is the count of windows
// drawn and a run resumes exactly from that count. Workers pass seed = base seed + rank and
// so see independent streams over the same data (the homogeneous setting). A sampler may be
// confined to a slice of the stream: with disjoint slices per worker, workers see different
// data (the heterogeneous setting); its windows then start at begin + random_below(..., end -
// begin - seq_len) and never leave the slice.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "gasloc/data/token_stream.hpp"

namespace gasloc::data {

struct Batch {
  torch::Tensor inputs, targets;  // [B, T] int64, contiguous; targets[:, t] is the token after inputs[:, t]
};

// Tokens [begin, end) of a stream.
struct TokenRange {
  int64_t begin = 0, end = 0;
};

// The r-th of n equal contiguous slices of a stream of `size` tokens (sizes differ by at most 1).
TokenRange slice_of(int64_t size, int rank, int world);

class WindowSampler {
 public:
  // The whole stream. DataError if it has fewer than seq_len + 1 tokens or a size is not positive.
  WindowSampler(std::shared_ptr<const TokenStream> tokens, int64_t batch_size, int64_t seq_len,
                uint64_t seed);
  // Windows within `range` only; DataError if the range holds fewer than seq_len + 1 tokens.
  WindowSampler(std::shared_ptr<const TokenStream> tokens, int64_t batch_size, int64_t seq_len,
                uint64_t seed, TokenRange range);
  Batch next();                                    // the next batch_size windows
  uint64_t position() const { return position_; }  // windows drawn so far (batch_size per next())
  void set_position(uint64_t windows) { position_ = windows; }

 private:
  std::shared_ptr<const TokenStream> tokens_;
  int64_t batch_size_, seq_len_;
  TokenRange range_;
  uint64_t seed_, position_ = 0;
};

// The fixed validation set: consecutive non-overlapping windows of seq_len + 1 tokens from the
// start of the stream, grouped into batches of batch_size; at most max_batches batches
// (max_batches <= 0: as many as fit). Partial batches are dropped. DataError if not even one
// full batch fits.
std::vector<Batch> validation_batches(const TokenStream& tokens, int64_t batch_size, int64_t seq_len,
                                      int64_t max_batches);

}  // namespace gasloc::data
