// `gasloc prepare`: raw corpus -> tokenizer + llm.c token shards + dataset.json.
//
// Output directory layout:
//   train_000000.bin ...  training tokens, at most shard_tokens per shard
//   val_000000.bin ...    held-out tokens
//   tokenizer.model       the SentencePiece model (absent for byte-level)
//   dataset.json          metadata (format "gasloc-dataset-1"), written last
// Every document is preceded by the tokenizer's BOS id. The output depends only on the input
// bytes and the options (byte-identical across runs and thread counts).
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
  double val_fraction = 0.01;             // fraction of documents held out (at least 1 document)
  uint64_t seed = 1337;
  int threads = 0;                        // 0: all hardware threads
  int64_t shard_tokens = 100'000'000;     // most tokens per shard file
};

struct PrepareResult {
  int64_t train_tokens = 0, val_tokens = 0, documents = 0;
  int64_t vocab_size = 0;
  std::filesystem::path dir;
};

// Most lines fed to SentencePiece training; larger corpora are subsampled (deterministically)
// so that training stays fast. 2M lines is far more than a BPE vocab of 64k needs.
constexpr int64_t kMaxTokenizerTrainLines = 2'000'000;

PrepareResult prepare(const PrepareOptions& opt, const std::function<void(const std::string&)>& progress = {});

}  // namespace gasloc::data
