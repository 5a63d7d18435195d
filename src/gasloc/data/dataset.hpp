// A prepared dataset: the train and validation token streams, memory-mapped (token_stream.hpp).
//
// Two layouts open:
//  - a `gasloc prepare` directory (dataset.json lists the shards and the tokenizer);
//  - a directory of llm.c shards without dataset.json, as written by llm.c's dataset scripts:
//    *.bin files whose name has a `train` or `val` part (fineweb_train_000001.bin,
//    tiny_shakespeare_val.bin); GPT-2 tokens, so the vocab is 50257 unless overridden.
// Shards are concatenated in file-name order; every token is checked against the vocab.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gasloc/data/token_stream.hpp"

namespace gasloc::data {

inline constexpr const char* kDatasetFormat = "gasloc-dataset-1";
constexpr int64_t kGpt2Vocab = 50257;
constexpr int kGpt2Eot = 50256;  // llm.c puts <|endoftext|> before every document

struct Dataset {
  std::filesystem::path dir;
  std::string tokenizer_kind;              // "sentencepiece", "byte", or "gpt2" (llm.c directory)
  int64_t vocab_size = 0;
  std::shared_ptr<const TokenStream> train, val;
  int bos_id = -1;                          // document separator id
  std::filesystem::path tokenizer_model;    // dir/tokenizer.model, or empty when there is none

  // vocab_size_override > 0 replaces the dataset's vocab size (for example a model's padded
  // vocab); tokens are validated against the resulting size. Throws DataError with a hint.
  static Dataset open(const std::filesystem::path& dir, int64_t vocab_size_override = 0);
};

}  // namespace gasloc::data
