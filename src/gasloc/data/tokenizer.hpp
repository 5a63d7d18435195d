// Tokenizers for `gasloc prepare` and for decoding samples: a byte-level one (no training,
// any text) and SentencePiece models (trained here as BPE, or any existing .model file).
// Token ids are stored as uint16 in shards, so vocabularies are capped at 65536.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gasloc::data {
namespace spm {
class Processor;
}

constexpr int64_t kMaxVocab = 65536;

struct BpeTrainOptions {
  int vocab_size = 8192;
  int threads = 0;          // 0: all hardware threads
  uint64_t seed = 1337;     // seeds SentencePiece's generator (used when it subsamples)
  std::filesystem::path work_dir;  // where the temporary training text goes; empty: the system temp dir
};

class Tokenizer {
 public:
  // Ids 0..255 are the bytes of the UTF-8 text; 256 is BOS. vocab_size 257.
  static Tokenizer byte_level();
  // Loads a SentencePiece .model file. DataError if unreadable, invalid or too large a vocab.
  static Tokenizer load_sentencepiece(const std::filesystem::path& model);
  // Same from the bytes of a .model file; `source` names it in error messages.
  static Tokenizer from_serialized(const std::string& model_bytes, const std::string& source);
  // Trains a SentencePiece BPE model on `sentences` (one line of text each; they pass through
  // a temporary file in opt.work_dir, removed afterwards). Deterministic: the same sentences
  // and options give a byte-identical model. DataError (with a hint) when the text cannot
  // support the vocabulary size.
  static Tokenizer train_bpe(const std::vector<std::string_view>& sentences, const BpeTrainOptions& opt);

  std::vector<int> encode(std::string_view text) const;  // without BOS
  std::string decode(const std::vector<int>& ids) const;  // BOS and other control ids vanish
  int64_t vocab_size() const { return vocab_size_; }
  int bos_id() const { return bos_id_; }
  // The text of one token as the tokenizer names it ("<s>", "\u2581the"); byte-level: "<bos>" or "<0xNN>".
  std::string piece(int id) const;
  // SentencePiece's own eos / unk ids (-1 when it has none; byte-level has neither).
  int eos_id() const;
  int unk_id() const;
  std::string kind() const { return sp_ ? "sentencepiece" : "byte"; }
  // The .model file's bytes (empty for byte-level), to copy into a dataset directory.
  const std::string& serialized_model() const { return model_bytes_; }

 private:
  std::shared_ptr<const spm::Processor> sp_;  // null: byte-level
  std::string model_bytes_;
  int64_t vocab_size_ = 0;
  int bos_id_ = -1;
};

}  // namespace gasloc::data
