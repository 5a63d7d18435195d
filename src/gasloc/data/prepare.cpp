#include "gasloc/data/prepare.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <set>
#include <thread>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/cpus.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/rng.hpp"
#include "gasloc/data/corpus.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/data/sha256.hpp"
#include "gasloc/data/shard.hpp"
#include "gasloc/data/tokenizer.hpp"

namespace gasloc::data {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Independent streams from the one user seed, so that changing how the tokenizer sample is
// drawn never changes the train/val split.
constexpr uint64_t kSplitStream = 0x5a17;
constexpr uint64_t kSampleStream = 0x7e57;

double unit(uint64_t seed, uint64_t k) { return static_cast<double>(random_u64(seed, k) >> 11) * 0x1p-53; }

void validate(const PrepareOptions& opt) {
  if (opt.inputs.empty()) throw DataError("no input files given", "pass one or more --input FILE");
  if (opt.out.empty()) throw DataError("no output directory given", "pass --out DIR");
  if (!(opt.val_fraction >= 0.0 && opt.val_fraction < 1.0))
    throw DataError(fmt::format("val fraction {} is outside [0, 1)", opt.val_fraction),
                    "pass --val-fraction between 0 and 1, e.g. 0.01");
  if (opt.shard_tokens < 1 || opt.shard_tokens > INT32_MAX)
    throw DataError(fmt::format("shard size {} tokens is outside [1, 2^31)", opt.shard_tokens));
  if (opt.byte_level && !opt.tokenizer_model.empty())
    throw DataError("both --byte-level and --tokenizer were given", "choose one tokenizer");
}

// Document i goes to validation with probability val_fraction, decided from (seed, i) alone.
std::vector<char> split_documents(size_t n, const PrepareOptions& opt) {
  if (n < 2)
    throw DataError(fmt::format("the corpus has {} document(s); at least 2 are needed (one is held out for validation)", n),
                    "add text; .txt inputs are split into documents at blank lines");
  // (One document is split by tokens instead; prepare() does not come here for it.)
  const uint64_t s = mix64(opt.seed ^ kSplitStream);
  std::vector<char> is_val(n);
  size_t nval = 0;
  for (size_t i = 0; i < n; ++i) nval += is_val[i] = unit(s, i) < opt.val_fraction;
  if (nval == 0) is_val[random_below(s, n, n)] = 1;
  if (nval == n) is_val[random_below(s, n + 1, n)] = 0;
  return is_val;
}

Tokenizer make_tokenizer(const PrepareOptions& opt, const std::vector<std::string>& docs,
                         const std::vector<char>& is_val, const std::function<void(const std::string&)>& say) {
  if (opt.byte_level) return Tokenizer::byte_level();
  if (!opt.tokenizer_model.empty()) {
    say("loading tokenizer " + opt.tokenizer_model.string());
    return Tokenizer::load_sentencepiece(opt.tokenizer_model);
  }
  // Train on the training documents' lines only, so validation text is truly unseen.
  std::vector<std::string_view> lines;
  for (size_t d = 0; d < docs.size(); ++d) {
    if (is_val[d]) continue;
    std::string_view doc = docs[d];
    for (size_t pos = 0; pos < doc.size();) {
      size_t end = std::min(doc.find('\n', pos), doc.size());
      if (end > pos) lines.push_back(doc.substr(pos, end - pos));
      pos = end + 1;
    }
  }
  if (static_cast<int64_t>(lines.size()) > kMaxTokenizerTrainLines) {
    const uint64_t s = mix64(opt.seed ^ kSampleStream);
    const double keep = static_cast<double>(kMaxTokenizerTrainLines) / static_cast<double>(lines.size());
    size_t j = 0;
    for (size_t i = 0; i < lines.size(); ++i)
      if (unit(s, i) < keep) lines[j++] = lines[i];
    lines.resize(j);
  }
  say(fmt::format("training SentencePiece BPE tokenizer: vocab {}, {} lines", opt.vocab_size, lines.size()));
  const auto t0 = std::chrono::steady_clock::now();
  // The training text goes through a temporary file in out/; if out/ is created for it and
  // training fails, it is removed again so a failed run leaves no directory behind.
  std::error_code ec;
  const bool created = !fs::exists(opt.out, ec);
  fs::create_directories(opt.out, ec);
  if (ec) throw DataError("cannot create output directory '" + opt.out.string() + "': " + ec.message(),
                          "check --out and the permissions of its parent");
  Tokenizer tok;
  try {
    tok = Tokenizer::train_bpe(lines, {opt.vocab_size, opt.threads, opt.seed, opt.out});
  } catch (...) {
    if (created) fs::remove(opt.out, ec);  // only succeeds while empty
    throw;
  }
  say(fmt::format("tokenizer trained in {:.1f} s",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
  return tok;
}

// Encodes documents on `threads` threads; each thread owns a contiguous range of documents and
// the ranges are concatenated in order, so the result does not depend on the thread count.
void encode_all(const Tokenizer& tok, const std::vector<std::string>& docs, const std::vector<char>& is_val,
                int threads, std::vector<uint16_t>& train, std::vector<uint16_t>& val) {
  const size_t n = docs.size();
  const size_t nt = std::max<size_t>(1, std::min<size_t>(threads, n));
  std::vector<std::vector<uint16_t>> tr(nt), va(nt);
  std::vector<std::exception_ptr> errors(nt);
  std::vector<std::thread> pool;
  for (size_t t = 0; t < nt; ++t) {
    pool.emplace_back([&, t] {
      try {
        for (size_t d = n * t / nt; d < n * (t + 1) / nt; ++d) {
          auto& out = is_val[d] ? va[t] : tr[t];
          out.push_back(static_cast<uint16_t>(tok.bos_id()));
          for (int id : tok.encode(docs[d])) out.push_back(static_cast<uint16_t>(id));
        }
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (size_t t = 0; t < nt; ++t) {
    train.insert(train.end(), tr[t].begin(), tr[t].end());
    val.insert(val.end(), va[t].begin(), va[t].end());
  }
}

// Writes `tokens` as prefix_000000.bin, prefix_000001.bin, ... and records their checksums.
std::vector<std::string> write_shards(const fs::path& dir, const std::string& prefix, const std::vector<uint16_t>& tokens,
                                      int64_t per_shard, json& sums, json& sizes,
                                      const std::function<void(const std::string&)>& say) {
  std::vector<std::string> names;
  const int64_t total = static_cast<int64_t>(tokens.size());
  for (int64_t begin = 0, i = 0; begin < total; begin += per_shard, ++i) {
    const int64_t end = std::min(total, begin + per_shard);
    std::vector<uint16_t> part(tokens.begin() + begin, tokens.begin() + end);
    const std::string name = fmt::format("{}_{:06d}.bin", prefix, i);
    const std::string bytes = encode_shard(part);
    write_file_atomic(dir / name, bytes);
    sums[name] = sha256_hex(bytes);
    sizes[name] = bytes.size();
    names.push_back(name);
    say(fmt::format("wrote {} ({} tokens)", (dir / name).string(), end - begin));
  }
  return names;
}

// A previous dataset.json in `dir` is removed before anything is written (so no dataset.json
// ever describes a mix of old and new shards); its shards that the new run does not
// overwrite are removed after.
std::vector<std::string> previous_shards(const fs::path& dir) {
  std::vector<std::string> old;
  const fs::path meta = dir / "dataset.json";
  std::error_code ec;
  if (!fs::exists(meta, ec)) return old;
  try {
    json j = json::parse(read_file(meta));
    for (const char* key : {"train_shards", "val_shards"})
      for (const auto& s : j.at(key)) old.push_back(s.get<std::string>());
    if (j.at("tokenizer").contains("model")) old.push_back(j["tokenizer"]["model"].get<std::string>());
  } catch (const std::exception&) {
    // An unreadable old dataset.json lists nothing we could safely delete.
  }
  fs::remove(meta, ec);
  return old;
}

}  // namespace

namespace {

// The tokenizer: trained on the training documents only, or for one document split by tokens,
// on the text before its validation tail (cut at a line start).
Tokenizer tokenizer_for(const PrepareOptions& opt, const std::vector<std::string>& docs, const std::vector<char>& is_val,
                        bool by_tokens, const std::function<void(const std::string&)>& say) {
  if (!by_tokens) return make_tokenizer(opt, docs, is_val, say);
  const std::string& text = docs[0];
  size_t cut = static_cast<size_t>(static_cast<double>(text.size()) * (1.0 - opt.val_fraction));
  if (const size_t nl = text.rfind('\n', cut); nl != std::string::npos && nl > 0) cut = nl;
  while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not mid-character
  return make_tokenizer(opt, {text.substr(0, cut)}, {0}, say);
}

// One document: the last val_fraction of its tokens become the validation split.
void split_tail(const PrepareOptions& opt, std::vector<uint16_t>& train, std::vector<uint16_t>& val, const std::function<void(const std::string&)>& say) {
  const auto n = static_cast<int64_t>(train.size());
  const int64_t n_val = std::max<int64_t>(1, std::llround(opt.val_fraction * static_cast<double>(n)));
  if (n_val >= n - 1)
    throw DataError(fmt::format("the corpus is one document of {} tokens: too short to split", n),
                    "add text, or lower --val-fraction");
  val.assign(train.end() - n_val, train.end());
  train.resize(static_cast<size_t>(n - n_val));
  say(fmt::format("one document: split by tokens, the last {} of {} tokens are the validation split", n_val, n));
}

// A validation split smaller than one evaluation batch of the default job: a warning with the fix.
std::vector<std::string> small_val_warnings(const std::vector<uint16_t>& train, const std::vector<uint16_t>& val) {
  std::vector<std::string> warnings;
  if (static_cast<int64_t>(val.size()) < kDefaultEvalBatchTokens) {
    const double need = static_cast<double>(kDefaultEvalBatchTokens) / static_cast<double>(train.size() + val.size());
    warnings.push_back(fmt::format(
        "the validation split has {} tokens, fewer than one evaluation batch of the default job ({} = data.batch_size "
        "16 x (data.seq_len 128 + 1)): `gasloc train` would stop with an error. Fix: {}, or train with smaller "
        "batches (data.batch_size x (data.seq_len + 1) <= {})",
        val.size(), kDefaultEvalBatchTokens,
        need < 1 ? fmt::format("pass --val-fraction {:.3g} or more", need) : std::string("add text"), val.size()));
  }
  return warnings;
}

// What the dataset's files need besides the tokens.
struct DatasetMeta {
  json sources;
  int64_t documents = 0, val_documents = 0;
  bool by_tokens = false;
  double unigram = 0;
};

// Writes the shards, the tokenizer and dataset.json (after everything that can fail on bad input
// has run), and removes the shards of an earlier prepare into the same directory.
void write_dataset(const PrepareOptions& opt, const Tokenizer& tok, const std::vector<uint16_t>& train,
                   const std::vector<uint16_t>& val, const DatasetMeta& m, const std::function<void(const std::string&)>& say) {
  const std::vector<std::string> old = previous_shards(opt.out);
  json sums = json::object(), sizes = json::object();
  std::set<std::string> written;
  const auto train_names = write_shards(opt.out, "train", train, opt.shard_tokens, sums, sizes, say);
  const auto val_names = write_shards(opt.out, "val", val, opt.shard_tokens, sums, sizes, say);
  json tokenizer = {{"kind", tok.kind()}, {"vocab_size", tok.vocab_size()}, {"bos_id", tok.bos_id()}};
  if (tok.kind() == "sentencepiece") {
    write_file_atomic(opt.out / "tokenizer.model", tok.serialized_model());
    tokenizer["model"] = "tokenizer.model";
    tokenizer["sha256"] = sha256_hex(tok.serialized_model());
    written.insert("tokenizer.model");
  }
  for (auto it = sums.begin(); it != sums.end(); ++it) written.insert(it.key());
  for (const auto& name : old)
    if (!written.count(name) && fs::path(name).filename() == name) {
      std::error_code ec;
      fs::remove(opt.out / name, ec);
    }
  json meta = {
      {"format", kDatasetFormat},
      {"tokenizer", tokenizer},
      {"train_shards", train_names},
      {"val_shards", val_names},
      {"train_tokens", static_cast<int64_t>(train.size())},
      {"val_tokens", static_cast<int64_t>(val.size())},
      {"documents", m.documents},
      {"val_documents", m.val_documents},
      {"split", m.by_tokens ? "tokens" : "documents"},
      {"val_fraction", opt.val_fraction},
      {"unigram_val_loss", m.unigram},
      {"seed", opt.seed},
      {"sources", m.sources},
      {"shards_sha256", sums},
      {"shards_bytes", sizes},
  };
  write_file_atomic(opt.out / "dataset.json", meta.dump(2) + "\n");
  say("wrote " + (opt.out / "dataset.json").string());
}

}  // namespace

PrepareResult prepare(const PrepareOptions& opt, const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& s) { if (progress) progress(s); };
  validate(opt);
  // Runs trained on a dataset read it back (eval, generate, export): replacing it silently made
  // them score a plausible, wrong loss.
  if (!opt.force && fs::exists(opt.out / "dataset.json"))
    throw DataError("'" + opt.out.string() + "' already holds a prepared dataset: preparing into it would replace the data "
                        "that runs trained on",
                    "choose another --out, or pass --force to replace it");
  const int threads = opt.threads > 0 ? opt.threads : usable_cpus();

  std::vector<std::string> docs;
  DatasetMeta meta;
  meta.sources = json::array();
  for (const auto& in : opt.inputs) {
    SourceInfo info = read_documents(in, opt.text_field, docs);
    say(fmt::format("read {}: {} document{}, {} bytes", in.string(), info.documents, info.documents == 1 ? "" : "s",
                    info.bytes));
    meta.sources.push_back({{"path", in.string()}, {"bytes", info.bytes}, {"sha256", info.sha256}});
  }
  // One document cannot be split into documents: it is split by tokens.
  const bool by_tokens = docs.size() == 1;
  if (by_tokens && !(opt.val_fraction > 0))
    throw DataError("the corpus is one document and --val-fraction is 0: nothing would be held out for validation",
                    "pass --val-fraction > 0 (e.g. 0.1): the last fraction of its tokens becomes the validation split");
  const std::vector<char> is_val = by_tokens ? std::vector<char>{0} : split_documents(docs.size(), opt);
  const Tokenizer tok = tokenizer_for(opt, docs, is_val, by_tokens, say);
  std::vector<uint16_t> train, val;
  encode_all(tok, docs, is_val, threads, train, val);
  if (by_tokens) split_tail(opt, train, val, say);
  say(fmt::format("encoded {} document{}: {} train tokens, {} val tokens", docs.size(), docs.size() == 1 ? "" : "s",
                  train.size(), val.size()));
  meta.unigram = unigram_cross_entropy(train, val, tok.vocab_size());
  meta.documents = static_cast<int64_t>(docs.size());
  meta.val_documents = std::count(is_val.begin(), is_val.end(), 1);
  meta.by_tokens = by_tokens;
  std::vector<std::string> warnings = small_val_warnings(train, val);
  write_dataset(opt, tok, train, val, meta, say);
  PrepareResult r;
  r.train_tokens = static_cast<int64_t>(train.size());
  r.val_tokens = static_cast<int64_t>(val.size());
  r.documents = static_cast<int64_t>(docs.size());
  r.vocab_size = tok.vocab_size();
  r.split = by_tokens ? "tokens" : "documents";
  r.unigram_val_loss = meta.unigram;
  r.warnings = std::move(warnings);
  r.dir = opt.out;
  return r;
}

}  // namespace gasloc::data
