#include "gasloc/data/dataset.hpp"

#include "gasloc/data/sha256.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/checksum.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::data {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const char* kPrepareHint = "create a dataset with `gasloc prepare --input FILE... --out DIR`";

std::shared_ptr<const TokenStream> load(const fs::path& dir, const std::vector<std::string>& names, int64_t vocab) {
  std::vector<fs::path> paths;
  paths.reserve(names.size());
  for (const auto& n : names) paths.push_back(dir / n);
  return TokenStream::map_shards(paths, vocab);
}

// True when `word` is one of the `_`-separated parts of the file stem after the first: llm.c
// names always carry a dataset prefix (fineweb_train_000001, tiny_shakespeare_val), while
// gasloc's own unprefixed train_000000.bin must never be mistaken for GPT-2 tokens.
bool has_part(const std::string& stem, const std::string& word) {
  size_t pos = stem.find('_');
  while (pos != std::string::npos && pos + 1 <= stem.size()) {
    const size_t begin = pos + 1;
    const size_t end = std::min(stem.find('_', begin), stem.size());
    if (end - begin == word.size() && stem.compare(begin, end - begin, word) == 0) return true;
    pos = end < stem.size() ? end : std::string::npos;
  }
  return false;
}

std::string dataset_fingerprint(const fs::path& dir, const std::string& meta_text, const json& meta);

Dataset open_llmc(const fs::path& dir, int64_t vocab_override) {
  std::vector<std::string> train, val;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().extension() != ".bin") continue;
    const std::string stem = e.path().stem().string();
    if (has_part(stem, "train")) train.push_back(e.path().filename().string());
    else if (has_part(stem, "val")) val.push_back(e.path().filename().string());
  }
  std::sort(train.begin(), train.end());
  std::sort(val.begin(), val.end());
  const std::string where = "'" + dir.string() + "'";
  if (fs::exists(dir / "train_000000.bin"))
    throw DataError(where + " holds gasloc shards but no dataset.json (an interrupted `gasloc prepare`?)",
                    "re-run `gasloc prepare` into this directory");
  if (train.empty())
    throw DataError(where + " has no dataset.json and no llm.c training shards (*_train_*.bin)", kPrepareHint);
  if (val.empty())
    throw DataError(where + " has no dataset.json and no llm.c validation shards (*_val_*.bin)",
                    std::string("llm.c's scripts write the validation shard as *_val_000000.bin; or ") + kPrepareHint);
  Dataset ds;
  ds.dir = dir;
  ds.tokenizer_kind = "gpt2";
  ds.vocab_size = vocab_override > 0 ? vocab_override : kGpt2Vocab;
  ds.bos_id = kGpt2Eot;
  ds.train = load(dir, train, ds.vocab_size);
  ds.val = load(dir, val, ds.vocab_size);
  ds.fingerprint = dataset_fingerprint(dir, "llm.c shards", json{{"train_shards", train}, {"val_shards", val}});
  return ds;
}

std::vector<std::string> shard_list(const json& meta, const char* key, const fs::path& file) {
  std::vector<std::string> names;
  try {
    names = meta.at(key).get<std::vector<std::string>>();
  } catch (const json::exception& e) {
    throw DataError("'" + file.string() + "': bad or missing \"" + key + "\": " + e.what(),
                    std::string("the file is damaged; re-run `gasloc prepare`"));
  }
  if (names.empty())
    throw DataError("'" + file.string() + "' lists no " + key, std::string("re-run `gasloc prepare` with more text"));
  return names;
}

}  // namespace

namespace {
// The shards must be the ones `gasloc prepare` wrote: a shard cut short with a consistent header
// would otherwise be read as a smaller dataset without a word.
void check_shards(const fs::path& dir, const json& meta, const fs::path& meta_path, bool verify_hashes) {
  const char* fix = "the dataset changed since `gasloc prepare` wrote it: re-run prepare, or restore the shard";
  for (const char* key : {"train_shards", "val_shards"})
    for (const auto& name : meta.value(key, std::vector<std::string>{})) {
      const fs::path p = dir / name;
      std::error_code ec;
      const auto size = fs::file_size(p, ec);
      if (ec) continue;  // a missing shard is reported by the mapping, with its own message
      if (meta.contains("shards_bytes") && meta["shards_bytes"].contains(name) &&
          meta["shards_bytes"][name].get<uintmax_t>() != size)
        throw DataError(fmt::format("shard '{}' has {} bytes but {} records {}", p.string(), size, meta_path.string(),
                                    meta["shards_bytes"][name].get<uintmax_t>()),
                        fix);
      if (verify_hashes && meta.contains("shards_sha256") && meta["shards_sha256"].contains(name) &&
          sha256_hex(read_file(p)) != meta["shards_sha256"][name].get<std::string>())
        throw DataError(fmt::format("shard '{}' does not match the sha256 in {}", p.string(), meta_path.string()), fix);
    }
}
}  // namespace

namespace {
// dataset.json's vocabulary is the model's output size: it must be positive and be the
// tokenizer's (a larger one trains a bigger model silently; a smaller one fails on the first
// token beyond it).
void check_vocabulary(const Dataset& ds, const fs::path& meta_path) {
  const char* fix = "dataset.json is damaged or was edited: re-run `gasloc prepare` (data.vocab_size pads a model's "
                    "vocabulary without touching the dataset)";
  if (ds.vocab_size <= 0)
    throw DataError(fmt::format("'{}' records a vocabulary of {} tokens", meta_path.string(), ds.vocab_size), fix);
  int64_t tokenizer_vocab = -1;
  if (ds.tokenizer_kind == "byte") tokenizer_vocab = Tokenizer::byte_level().vocab_size();
  else if (ds.tokenizer_kind == "sentencepiece" && !ds.tokenizer_model.empty() && fs::exists(ds.tokenizer_model))
    tokenizer_vocab = sentencepiece_piece_count(ds.tokenizer_model);
  if (tokenizer_vocab > 0 && tokenizer_vocab != ds.vocab_size)
    throw DataError(fmt::format("'{}' records a vocabulary of {} tokens but its tokenizer ({}) has {}", meta_path.string(),
                                ds.vocab_size, ds.tokenizer_kind == "byte" ? "byte-level" : ds.tokenizer_model.string(),
                                tokenizer_vocab),
                    fix);
}

// dataset.json's bytes and every shard's name and size, in file order.
std::string dataset_fingerprint(const fs::path& dir, const std::string& meta_text, const json& meta) {
  Checksum c;
  c.update(meta_text.data(), meta_text.size());
  for (const char* key : {"train_shards", "val_shards"})
    for (const auto& name : meta.value(key, std::vector<std::string>{})) {
      std::error_code ec;
      const auto size = fs::file_size(dir / name, ec);
      const std::string entry = fmt::format("{}:{}\n", name, ec ? -1 : static_cast<int64_t>(size));
      c.update(entry.data(), entry.size());
    }
  return c.hex();
}
}  // namespace

int64_t sentencepiece_piece_count(const fs::path& model) {
  const std::string b = read_file(model);
  auto bad = [&] {
    return DataError("'" + model.string() + "' is not a SentencePiece model", "re-run `gasloc prepare`, or restore the file");
  };
  size_t at = 0;
  auto varint = [&]() -> uint64_t {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at >= b.size()) throw bad();
      const auto byte = static_cast<uint8_t>(b[at++]);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return v;
    }
    throw bad();
  };
  int64_t pieces = 0;
  while (at < b.size()) {
    const uint64_t tag = varint();
    const uint64_t field = tag >> 3, wire = tag & 7;
    if (wire == 0) varint();
    else if (wire == 1) at += 8;
    else if (wire == 5) at += 4;
    else if (wire == 2) {
      const uint64_t len = varint();
      if (len > b.size() - at) throw bad();
      at += len;
      if (field == 1) ++pieces;
    } else {
      throw bad();
    }
    if (at > b.size()) throw bad();
  }
  if (pieces == 0) throw bad();
  return pieces;
}

Dataset Dataset::open(const fs::path& dir, int64_t vocab_size_override, bool verify_hashes) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw DataError("dataset directory '" + dir.string() + "' does not exist",
                    fmt::format("tokenize a corpus into it with `gasloc prepare --input FILE... --out {}`; in a gasloc "
                                "checkout, `scripts/prepare_data.sh {} {}` prepares the default corpus there with a "
                                "tokenizer of that many tokens",
                                dir.string(), dir.string(), dir.filename() == "micro1024" ? 1024 : 8192));
  const fs::path meta_path = dir / "dataset.json";
  if (!fs::exists(meta_path, ec)) return open_llmc(dir, vocab_size_override);

  json meta;
  try {
    meta = json::parse(read_file(meta_path));
  } catch (const json::exception& e) {
    throw DataError("'" + meta_path.string() + "' is not valid JSON: " + e.what(), "re-run `gasloc prepare`");
  }
  if (!meta.is_object() || meta.value("format", "") != kDatasetFormat)
    throw DataError("'" + meta_path.string() + "' is not a " + kDatasetFormat + " file",
                    "re-run `gasloc prepare` with this version of gasloc");
  Dataset ds;
  ds.dir = dir;
  try {
    const json& tok = meta.at("tokenizer");
    ds.tokenizer_kind = tok.at("kind").get<std::string>();
    ds.vocab_size = tok.at("vocab_size").get<int64_t>();
    ds.bos_id = tok.value("bos_id", -1);
    if (tok.contains("model")) ds.tokenizer_model = dir / tok.at("model").get<std::string>();
    ds.unigram_val_loss = meta.value("unigram_val_loss", -1.0);
  } catch (const json::exception& e) {
    throw DataError("'" + meta_path.string() + "': bad \"tokenizer\" entry: " + e.what(), "re-run `gasloc prepare`");
  }
  check_vocabulary(ds, meta_path);
  if (vocab_size_override > 0) ds.vocab_size = vocab_size_override;
  check_shards(dir, meta, meta_path, verify_hashes);
  ds.fingerprint = dataset_fingerprint(dir, read_file(meta_path), meta);
  ds.train = load(dir, shard_list(meta, "train_shards", meta_path), ds.vocab_size);
  ds.val = load(dir, shard_list(meta, "val_shards", meta_path), ds.vocab_size);
  // Older datasets record no shard sizes; their token counts still catch a shortened shard.
  for (const auto& [key, stream] : {std::pair{"train_tokens", ds.train}, std::pair{"val_tokens", ds.val}})
    if (meta.contains(key) && meta[key].get<int64_t>() != stream->size())
      throw DataError(fmt::format("the {} split of '{}' has {} tokens but {} records {}", std::string(key).substr(0, std::string(key).find('_')),
                                  dir.string(), stream->size(), meta_path.string(), meta[key].get<int64_t>()),
                      "the dataset changed since `gasloc prepare` wrote it: re-run prepare, or restore its shards");
  return ds;
}

std::optional<Tokenizer> dataset_tokenizer(const fs::path& dir) {
  const fs::path meta_path = dir / "dataset.json";
  std::error_code ec;
  if (!fs::exists(meta_path, ec)) return std::nullopt;
  json meta;
  try {
    meta = json::parse(read_file(meta_path));
    const std::string kind = meta.at("tokenizer").at("kind").get<std::string>();
    if (kind == "byte") return Tokenizer::byte_level();
    if (kind != "sentencepiece") return std::nullopt;
    return Tokenizer::load_sentencepiece(dir / meta["tokenizer"].value("model", std::string("tokenizer.model")));
  } catch (const json::exception& e) {
    throw DataError("'" + meta_path.string() + "': bad \"tokenizer\" entry: " + e.what(), "re-run `gasloc prepare`");
  }
}

namespace {
// Calls f on every token of `s`, read in chunks (one piece lookup per chunk, not per token).
template <class F>
void each_token(const TokenStream& s, F&& f) {
  constexpr int64_t kChunk = 1 << 20;
  std::vector<int64_t> buf;
  for (int64_t at = 0; at < s.size(); at += kChunk) {
    const int64_t n = std::min(kChunk, s.size() - at);
    buf.resize(static_cast<size_t>(n));
    s.read(at, n, buf.data());
    for (int64_t t : buf) f(t);
  }
}
template <class F>
void each_token(std::span<const uint16_t> s, F&& f) {
  for (uint16_t t : s) f(static_cast<int64_t>(t));
}

template <class Tokens>
double unigram(const Tokens& train, const Tokens& val, int64_t vocab_size, int64_t val_size) {
  if (vocab_size <= 0) throw DataError("unigram baseline of an empty vocabulary");
  if (val_size == 0) throw DataError("unigram baseline of an empty validation split", "prepare more text");
  std::vector<int64_t> count(static_cast<size_t>(vocab_size), 0);
  int64_t n = 0;
  each_token(train, [&](int64_t t) {
    ++count.at(static_cast<size_t>(t));
    ++n;
  });
  const double total = static_cast<double>(n + vocab_size);
  double nll = 0;
  each_token(val, [&](int64_t t) { nll -= std::log(static_cast<double>(count.at(static_cast<size_t>(t)) + 1) / total); });
  return nll / static_cast<double>(val_size);
}
}  // namespace

double unigram_cross_entropy(const TokenStream& train, const TokenStream& val, int64_t vocab_size) {
  return unigram(train, val, vocab_size, val.size());
}

double unigram_cross_entropy(std::span<const uint16_t> train, std::span<const uint16_t> val, int64_t vocab_size) {
  return unigram(train, val, vocab_size, static_cast<int64_t>(val.size()));
}

}  // namespace gasloc::data
