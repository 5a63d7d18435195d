// SentencePiece, loaded privately at run time.
//
// Debian's libsentencepiece embeds its own copy of protobuf-lite 3.14 and exports its
// symbols; LibTorch links the system libprotobuf 3.21. Linked into one program, the two
// interpose each other's symbols and the program crashes before main() (or SentencePiece
// aborts on a protobuf version check). So gasloc never links SentencePiece: this file
// dlopen()s it with RTLD_LOCAL | RTLD_DEEPBIND, which keeps its protobuf to itself, and
// reaches it only through dlsym'd entry points and virtual calls (no link-time references).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>
#include <unordered_map>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace gasloc::data::spm {

// A loaded SentencePiece model. All calls into the library go through this file, where
// they are checked not to create link-time references (see spm_runtime.cpp).
class Processor {
 public:
  // Throws DataError (naming `source`) if SentencePiece cannot be loaded or rejects the model.
  Processor(const std::string& model_bytes, const std::string& source);
  std::vector<int> encode(std::string_view text) const;
  std::string decode(const std::vector<int>& ids) const;
  int piece_size() const;
  int bos_id() const;
  int eos_id() const;  // -1: none
  int unk_id() const;
  std::string piece(int id) const;

 private:
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> p_;
};

// Runs SentencePieceTrainer::Train(args) and returns the serialized model. `seed` seeds
// SentencePiece's generator. On failure returns false and sets *error to its status text.
bool train(const std::unordered_map<std::string, std::string>& args, unsigned seed, std::string* model,
           std::string* error);

// Empty where this build can load SentencePiece; otherwise why it cannot (an ASan build: ASan
// refuses RTLD_DEEPBIND). Loading it there throws a DataError with this text.
std::string unavailable_reason();

}  // namespace gasloc::data::spm
