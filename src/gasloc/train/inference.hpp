// Using a trained model: scoring it on a token stream (`gasloc eval`) and sampling text from it
// (`gasloc generate`). Both run in fp32 on the model's device, without gradients.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gasloc/data/token_stream.hpp"
#include "gasloc/data/tokenizer.hpp"
#include "gasloc/model/llama.hpp"

namespace gasloc::train {

struct StreamScore {
  double loss = 0;          // mean next-token cross-entropy, nats per token
  double perplexity = 0;    // exp(loss)
  int64_t batches = 0, tokens = 0;  // scored (predicted) tokens
  int64_t bytes = -1;       // UTF-8 bytes of the scored tokens' text; -1 without a tokenizer
  double bits_per_byte = -1;  // loss * tokens / (bytes * ln 2): comparable across tokenizers; -1 if unknown
};

// Scores `model` on the validation batches of `tokens` (data::validation_batches: consecutive
// windows of seq_len + 1 tokens from the start, at most max_batches batches, <= 0: all), the
// same batches and the same mean as the trainer's evaluation. With a tokenizer, also the bytes
// of the text the scored tokens decode to, and bits per byte. DataError if no batch fits.
StreamScore score_stream(model::Llama& model, const data::TokenStream& tokens, int64_t batch_size, int64_t seq_len,
                         int64_t max_batches, const data::Tokenizer* tokenizer = nullptr);

struct SampleOptions {
  int64_t max_tokens = 100;  // new tokens at most
  double temperature = 0.8;  // <= 0: greedy (the most likely token each step)
  int64_t top_k = 50;        // sample among the k most likely tokens (<= 0: all)
  uint64_t seed = 0;         // same seed, model and prompt: same text
  int stop_id = -1;          // stop after producing this token (the document separator); -1: never
};

struct SampleResult {
  std::vector<int> tokens;  // the new tokens only (the stop token included when it came)
  bool stopped = false;     // ended by stop_id rather than max_tokens
};

// Continues `prompt` (token ids, at least one) one token at a time. The context is the last
// max_seq_len tokens. Draws are gasloc's counter-based random numbers (core/rng.hpp), so the
// text depends only on (model, prompt, options). ConfigError for an empty prompt or bad options.
SampleResult sample(model::Llama& model, const std::vector<int>& prompt, const SampleOptions& opt);

}  // namespace gasloc::train
