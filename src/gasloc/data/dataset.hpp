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
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gasloc/data/token_stream.hpp"
#include "gasloc/data/tokenizer.hpp"

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
  double unigram_val_loss = -1;             // dataset.json's unigram baseline (nats/token); < 0: not recorded
  // What the ranks of one job must agree on: a checksum of dataset.json and of every shard's name
  // and size (16 hex digits). Two datasets with the same vocabulary differ here.
  std::string fingerprint;

  // vocab_size_override > 0 replaces the dataset's vocab size (for example a model's padded
  // vocab); tokens are validated against the resulting size. Throws DataError with a hint.
  // Checks every shard against dataset.json before mapping it: its size (and the token counts
  // of the splits), and with verify_hashes its sha256 too (reads every byte: slow on large data).
  // A shard that was cut short, grew, or (with verify_hashes) changed is a DataError naming it;
  // so is a vocabulary that is not positive or does not match the dataset's tokenizer.
  static Dataset open(const std::filesystem::path& dir, int64_t vocab_size_override = 0, bool verify_hashes = false);
};

// The tokenizer that made the dataset in `dir`, from its dataset.json alone (shards are not
// opened): byte-level or its SentencePiece model. Nothing for an llm.c directory (GPT-2 tokens;
// gasloc has no GPT-2 tokenizer). DataError if dataset.json or the model file is unreadable.
std::optional<Tokenizer> dataset_tokenizer(const std::filesystem::path& dir);

// The number of pieces in a SentencePiece .model file, read from its protobuf without loading
// SentencePiece (top-level field 1 of ModelProto, one per piece). Throws DataError when the file
// is not a model.
int64_t sentencepiece_piece_count(const std::filesystem::path& model);

// The unigram baseline: the cross-entropy (nats per token) of `val` under the token frequencies
// of `train`, add-one smoothed over the vocabulary so that a token unseen in training costs
// log(N + V) instead of infinity. A model that has learned nothing beyond token frequencies
// scores about this; below it, it has learned context.
double unigram_cross_entropy(const TokenStream& train, const TokenStream& val, int64_t vocab_size);
// The same over tokens in memory (`gasloc prepare`, before the shards exist).
double unigram_cross_entropy(std::span<const uint16_t> train, std::span<const uint16_t> val, int64_t vocab_size);

}  // namespace gasloc::data
