// SentencePiece BPE training. Settings follow Llama's tokenizer (identity normalization so
// text round-trips, byte fallback so any text encodes, digits split), with everything that
// could vary between runs pinned: sentences arrive in a fixed order, SentencePiece neither
// subsamples nor shuffles, and its generator is seeded.
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <unordered_map>

#include "gasloc/core/cpus.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/data/spm_runtime.hpp"
#include "gasloc/data/tokenizer.hpp"

namespace gasloc::data {
namespace fs = std::filesystem;

namespace {

// Turns SentencePiece's status texts into what the user should change.
[[noreturn]] void rethrow(std::string msg, int vocab) {
  // Drop the "./src/file.cc(123) [check expression] " prefix of failed CHECKs.
  if (msg.rfind("./src/", 0) == 0 && msg.find("] ") != std::string::npos) msg = msg.substr(msg.find("] ") + 2);
  const std::string what = "SentencePiece BPE training with vocab size " + std::to_string(vocab) + " failed: " + msg;
  if (msg.find("Vocabulary size too high") != std::string::npos)
    throw DataError(what + " (the corpus has too little text for that many pieces)",
                    "lower --vocab-size, add more text, or use --byte-level");
  if (msg.find("smaller than required_chars") != std::string::npos)
    throw DataError(what + " (the corpus needs more distinct characters plus 256 byte pieces than that)",
                    "raise --vocab-size, or use --byte-level");
  throw DataError(what, "check the corpus, or use --byte-level or --tokenizer MODEL");
}

// SentencePiece reads its training text from files (an in-memory iterator would need its
// Status type constructed on our side, see spm_runtime.hpp); this one is removed on exit.
struct TempText {
  fs::path path;
  ~TempText() {
    std::error_code ec;
    if (!path.empty()) fs::remove(path, ec);
  }
};

fs::path temp_name(const fs::path& dir) {
  static std::atomic<int> counter{0};
  fs::path base = dir;
  // SentencePiece splits its `input` at commas.
  if (base.empty() || base.string().find(',') != std::string::npos) base = fs::temp_directory_path();
  return base / fmt::format(".gasloc-tokenizer-train-{}-{}.txt", ::getpid(), counter++);
}

// --- protobuf wire format, just enough to edit the model's TrainerSpec ---
// SentencePiece records its training options in the model (ModelProto field 2, TrainerSpec),
// including the input file name (field 1, our temporary path) and num_threads (field 16).
// Both vary between runs without changing the tokenizer, so they are dropped to keep
// tokenizer.model byte-identical for identical input.
uint64_t read_varint(std::string_view s, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0; pos < s.size() && shift < 64; shift += 7) {
    const auto b = static_cast<uint8_t>(s[pos++]);
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  throw DataError("SentencePiece produced a malformed model (bad varint)", "report this as a gasloc bug");
}

void write_varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7f) | 0x80));
  out.push_back(static_cast<char>(v));
}

// Calls fn(field, wire_type, whole_field_bytes, payload) for each field of a message.
template <class F>
void for_each_field(std::string_view msg, F&& fn) {
  for (size_t pos = 0; pos < msg.size();) {
    const size_t start = pos;
    const uint64_t key = read_varint(msg, pos);
    const int type = static_cast<int>(key & 7);
    size_t len = 0;
    if (type == 0) read_varint(msg, pos);
    else if (type == 1) len = 8;
    else if (type == 5) len = 4;
    else if (type == 2) len = read_varint(msg, pos);
    else throw DataError("SentencePiece produced a model with an unexpected wire type", "report this as a gasloc bug");
    if (len > msg.size() - pos) throw DataError("SentencePiece produced a truncated model", "report this as a gasloc bug");
    const std::string_view payload = msg.substr(pos, len);
    pos += len;
    fn(key >> 3, type, msg.substr(start, pos - start), payload);
  }
}

std::string drop_run_specific_fields(const std::string& model) {
  std::string out;
  for_each_field(model, [&](uint64_t field, int type, std::string_view whole, std::string_view payload) {
    if (field != 2 || type != 2) {
      out += whole;
      return;
    }
    std::string spec;
    for_each_field(payload, [&](uint64_t f, int, std::string_view w, std::string_view) {
      if (f != 1 && f != 16) spec += w;
    });
    write_varint(out, (2 << 3) | 2);
    write_varint(out, spec.size());
    out += spec;
  });
  return out;
}

}  // namespace

Tokenizer Tokenizer::train_bpe(const std::vector<std::string_view>& sentences, const BpeTrainOptions& opt) {
  if (sentences.empty())
    throw DataError("cannot train a tokenizer on an empty corpus", "pass input files that contain text");
  // 3 specials + 256 byte-fallback pieces come before any learned piece.
  if (opt.vocab_size < 260 || opt.vocab_size > kMaxVocab)
    throw DataError("vocab size " + std::to_string(opt.vocab_size) + " is out of range for a BPE tokenizer with byte fallback",
                    "choose --vocab-size between 260 and 65536 (uint16 shards), or use --byte-level");
  TempText tmp{temp_name(opt.work_dir)};
  {
    std::ofstream out(tmp.path, std::ios::binary);
    for (auto s : sentences) out << s << '\n';
    out.flush();
    if (!out)
      throw DataError("cannot write the tokenizer training text to '" + tmp.path.string() + "'",
                      "check free disk space and that the output directory is writable");
  }
  const int threads = opt.threads > 0 ? opt.threads : usable_cpus();
  const std::unordered_map<std::string, std::string> args = {
      {"input", tmp.path.string()},
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(opt.vocab_size)},
      {"character_coverage", "0.9995"},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "true"},
      {"split_digits", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"max_sentence_length", "16384"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"input_sentence_size", "0"},  // the caller already capped and chose the sentences
      {"shuffle_input_sentence", "false"},
      {"num_threads", std::to_string(threads)},
  };
  std::string model, error;
  if (!spm::train(args, static_cast<unsigned>(opt.seed % 0xfffffffeULL), &model, &error)) rethrow(error, opt.vocab_size);
  return from_serialized(drop_run_specific_fields(model), "trained BPE model");
}

}  // namespace gasloc::data
