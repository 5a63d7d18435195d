// `gasloc prepare`: raw corpus -> tokenizer + llm.c token shards + dataset.json.
//
// Output directory layout:
//   train_000000.bin ...  training tokens, at most shard_tokens per shard
//   val_000000.bin ...    held-out tokens
//   tokenizer.model       the SentencePiece model (absent for byte-level)
//   dataset.json          metadata (format "gasloc-dataset-1"), written last
// Every document is preceded by the tokenizer's BOS id. The output depends only on the input
// bytes and the options (byte-identical across runs and thread counts).
//
// The split: with two or more documents each is held out whole with probability val_fraction
// (at least one). A single document (one book, a one-sentence-per-line file) is split by tokens
// instead, as llm.c and nanoGPT do: validation is its last val_fraction of tokens, and a trained
// tokenizer sees only the text before that point.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace gasloc::data {

struct PrepareOptions {
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path out;
  std::string text_field = "text";
  int vocab_size = 8192;
  bool byte_level = false;
  std::filesystem::path tokenizer_model;  // load instead of train when set
  double val_fraction = 0.01;             // fraction of documents (one document: of tokens) held out
  uint64_t seed = 1337;
  int threads = 0;                        // 0: all hardware threads
  int64_t shard_tokens = 100'000'000;     // most tokens per shard file
  bool force = false;                     // replace a dataset already prepared in `out`
};

// The smallest validation split that a job with the default data.batch_size (16) and
// data.seq_len (128) can evaluate: one batch of 16 windows of 129 tokens.
constexpr int64_t kDefaultEvalBatchTokens = 16 * (128 + 1);

struct PrepareResult {
  int64_t train_tokens = 0, val_tokens = 0, documents = 0;
  int64_t vocab_size = 0;
  std::string split;              // "documents" or "tokens"
  double unigram_val_loss = 0;    // the unigram baseline (dataset.hpp), also in dataset.json
  std::vector<std::string> warnings;  // the dataset is written, but a default job cannot use it as is
  std::filesystem::path dir;
};

// Most lines fed to SentencePiece training; larger corpora are subsampled (deterministically)
// so that training stays fast. 2M lines is far more than a BPE vocab of 64k needs.
constexpr int64_t kMaxTokenizerTrainLines = 2'000'000;

PrepareResult prepare(const PrepareOptions& opt, const std::function<void(const std::string&)>& progress = {});

}  // namespace gasloc::data
