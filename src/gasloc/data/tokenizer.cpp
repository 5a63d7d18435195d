#include "gasloc/data/tokenizer.hpp"

#include "gasloc/data/spm_runtime.hpp"

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::data {
namespace fs = std::filesystem;

namespace {
constexpr int kByteBos = 256;
}

Tokenizer Tokenizer::byte_level() {
  Tokenizer t;
  t.vocab_size_ = 257;
  t.bos_id_ = kByteBos;
  return t;
}

Tokenizer Tokenizer::load_sentencepiece(const fs::path& model) {
  std::error_code ec;
  if (!fs::is_regular_file(model, ec))
    throw DataError("tokenizer model '" + model.string() + "' does not exist",
                    "pass an existing SentencePiece .model file, or omit --tokenizer to train one");
  std::string bytes;
  try {
    bytes = read_file(model);
  } catch (const Error& e) {
    throw DataError(e.what(), "check the tokenizer file's permissions");
  }
  return from_serialized(bytes, model.string());
}

Tokenizer Tokenizer::from_serialized(const std::string& model_bytes, const std::string& source) {
  auto sp = std::make_shared<const spm::Processor>(model_bytes, source);
  const int64_t vocab = sp->piece_size();
  if (vocab > kMaxVocab)
    throw DataError("SentencePiece model '" + source + "' has " + std::to_string(vocab) +
                        " pieces; token shards store uint16 ids, so at most " + std::to_string(kMaxVocab),
                    "use a tokenizer with at most 65536 pieces, or let `gasloc prepare` train one");
  if (sp->bos_id() < 0)
    throw DataError("SentencePiece model '" + source + "' has no BOS piece; documents are separated by BOS",
                    "train the model with bos_id set (e.g. --bos_id=1), or let `gasloc prepare` train one");
  Tokenizer t;
  t.vocab_size_ = vocab;
  t.bos_id_ = sp->bos_id();
  t.model_bytes_ = model_bytes;
  t.sp_ = std::move(sp);
  return t;
}

std::vector<int> Tokenizer::encode(std::string_view text) const {
  if (sp_) return sp_->encode(text);
  std::vector<int> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  for (int id : ids)
    if (id < 0 || id >= vocab_size_)
      throw DataError("cannot decode token id " + std::to_string(id) + ": outside the tokenizer's vocabulary of " +
                          std::to_string(vocab_size_),
                      "the ids come from a model or dataset made with another tokenizer");
  if (sp_) return sp_->decode(ids);
  std::string out;
  out.reserve(ids.size());
  for (int id : ids)
    if (id != kByteBos) out.push_back(static_cast<char>(id));
  return out;
}

std::string Tokenizer::piece(int id) const {
  if (id < 0 || id >= vocab_size_)
    throw DataError("token id " + std::to_string(id) + " is outside the tokenizer's vocabulary of " + std::to_string(vocab_size_));
  if (sp_) return sp_->piece(id);
  if (id == kByteBos) return "<bos>";
  static const char* hex = "0123456789ABCDEF";
  return std::string("<0x") + hex[id >> 4] + hex[id & 15] + ">";
}

int Tokenizer::eos_id() const { return sp_ ? sp_->eos_id() : -1; }
int Tokenizer::unk_id() const { return sp_ ? sp_->unk_id() : -1; }

}  // namespace gasloc::data
