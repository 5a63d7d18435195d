#include "gasloc/data/dataset.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "gasloc/core/atomic_file.hpp"
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

Dataset Dataset::open(const fs::path& dir, int64_t vocab_size_override) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw DataError("dataset directory '" + dir.string() + "' does not exist", kPrepareHint);
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
  } catch (const json::exception& e) {
    throw DataError("'" + meta_path.string() + "': bad \"tokenizer\" entry: " + e.what(), "re-run `gasloc prepare`");
  }
  if (vocab_size_override > 0) ds.vocab_size = vocab_size_override;
  ds.train = load(dir, shard_list(meta, "train_shards", meta_path), ds.vocab_size);
  ds.val = load(dir, shard_list(meta, "val_shards", meta_path), ds.vocab_size);
  return ds;
}

}  // namespace gasloc::data
