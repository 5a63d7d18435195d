// Tests of the data layer: shard format (and llm.c compatibility), corpus reading, prepare
// (determinism, errors), dataset directories, samplers.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <set>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/rng.hpp"
#include "gasloc/data/corpus.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/data/prepare.hpp"
#include "gasloc/data/sampler.hpp"
#include "gasloc/data/sha256.hpp"
#include "gasloc/data/shard.hpp"
#include "gasloc/data/spm_runtime.hpp"
#include "gasloc/data/tokenizer.hpp"
#include "test_paths.hpp"

// Ends a test at its SentencePiece part where this build cannot load SentencePiece (an ASan
// build, spm_runtime.hpp), with the reason as the skip message.
#define SKIP_WITHOUT_SENTENCEPIECE()                                                  \
  if (const std::string why = gasloc::data::spm::unavailable_reason(); !why.empty()) \
  GTEST_SKIP() << why

namespace fs = std::filesystem;
using namespace gasloc::data;
using gasloc::DataError;

namespace {

// A fresh directory per test, removed afterwards.
class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = gasloc::test_paths::binary_dir() / "test_data_tmp" / (std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

// Runs fn, expecting a DataError whose message (or hint) contains every given piece.
template <class F>
void expect_data_error(F&& fn, std::initializer_list<std::string> pieces) {
  try {
    fn();
    ADD_FAILURE() << "expected a DataError";
  } catch (const DataError& e) {
    const std::string text = std::string(e.what()) + " | hint: " + e.hint();
    for (const auto& p : pieces) EXPECT_NE(text.find(p), std::string::npos) << "'" << p << "' not in: " << text;
    EXPECT_FALSE(e.hint().empty()) << text;
  }
}

// Deterministic English-like text: sentences of syllable words, `docs` documents.
std::vector<std::string> make_docs(int docs, uint64_t seed) {
  static const char* syl[] = {"ta", "ke", "mon", "ri", "sel", "po", "an", "du", "ver", "li", "go", "thes",
                              "ba", "nor", "qui", "em", "zo", "fal", "ig", "run"};
  std::vector<std::string> out;
  uint64_t k = 0;
  for (int d = 0; d < docs; ++d) {
    std::string doc;
    const int words = 8 + static_cast<int>(gasloc::random_below(seed, k++, 20));
    for (int w = 0; w < words; ++w) {
      const int ns = 1 + static_cast<int>(gasloc::random_below(seed, k++, 3));
      if (w) doc += ' ';
      for (int s = 0; s < ns; ++s) doc += syl[gasloc::random_below(seed, k++, 20)];
    }
    doc += ". Number " + std::to_string(d) + "!";
    out.push_back(doc);
  }
  return out;
}

void write_json_array(const fs::path& p, const std::vector<std::string>& docs) {
  write_text(p, nlohmann::json(docs).dump());
}

// A stream's tokens, copied out one by one through at() (independent of read()'s bulk path).
std::vector<uint16_t> tokens_of(const TokenStream& s) {
  std::vector<uint16_t> v(static_cast<size_t>(s.size()));
  for (int64_t i = 0; i < s.size(); ++i) v[static_cast<size_t>(i)] = s.at(i);
  return v;
}

std::map<std::string, std::string> dir_files(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files[e.path().filename().string()] = gasloc::read_file(e.path());
  return files;
}

}  // namespace

// ---- shards ---------------------------------------------------------------------------------

TEST_F(DataTest, ShardRoundTrip) {
  std::vector<uint16_t> tokens = {0, 1, 2, 65535, 50256, 7, 7, 300};
  write_shard(dir_ / "s.bin", tokens);
  EXPECT_EQ(read_shard(dir_ / "s.bin"), tokens);
  EXPECT_EQ(fs::file_size(dir_ / "s.bin"), 1024u + 2 * tokens.size());
  write_shard(dir_ / "empty.bin", {});
  EXPECT_TRUE(read_shard(dir_ / "empty.bin").empty());
}

TEST_F(DataTest, ShardRejectsCorruptFiles) {
  std::string good = encode_shard({1, 2, 3, 4});
  std::string bad_magic = good;
  bad_magic[0] = 0x11;
  write_text(dir_ / "magic.bin", bad_magic);
  expect_data_error([&] { read_shard(dir_ / "magic.bin"); }, {"magic.bin", "magic", "expected 20240520", "not an llm.c"});

  write_text(dir_ / "trunc.bin", good.substr(0, good.size() - 3));
  expect_data_error([&] { read_shard(dir_ / "trunc.bin"); }, {"trunc.bin", "truncated", "4 tokens"});

  write_text(dir_ / "short.bin", good.substr(0, 100));
  expect_data_error([&] { read_shard(dir_ / "short.bin"); }, {"short.bin", "shorter than", "header"});

  std::string v2 = good;
  v2[4] = 2;
  write_text(dir_ / "v2.bin", v2);
  expect_data_error([&] { read_shard(dir_ / "v2.bin"); }, {"v2.bin", "version 2"});

  write_shard(dir_ / "vocab.bin", {5, 9, 300, 1, 400});
  EXPECT_EQ(read_shard(dir_ / "vocab.bin", 401).size(), 5u);
  expect_data_error([&] { read_shard(dir_ / "vocab.bin", 300); }, {"vocab.bin", "token id 300", "position 2", "300"});

  expect_data_error([&] { read_shard(dir_ / "nope.bin"); }, {"nope.bin", "does not exist"});
}

// The bytes llm.c's Python writes (np.zeros(256, int32) header; header.tobytes(); then
// np.uint16 tokens), built here by hand, independent of encode_shard.
TEST_F(DataTest, ShardWrittenLikeLlmcPythonLoads) {
  std::string bytes;
  auto put32 = [&](int32_t v) { for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((uint32_t(v) >> (8 * i)) & 0xff)); };
  auto put16 = [&](uint16_t v) { bytes.push_back(static_cast<char>(v & 0xff)); bytes.push_back(static_cast<char>(v >> 8)); };
  const std::vector<uint16_t> tokens = {50256, 15496, 995, 0, 258, 50255};
  put32(20240520);
  put32(1);
  put32(static_cast<int32_t>(tokens.size()));
  for (int i = 3; i < 256; ++i) put32(0);
  for (uint16_t t : tokens) put16(t);
  write_text(dir_ / "py.bin", bytes);
  EXPECT_EQ(read_shard(dir_ / "py.bin", 50257), tokens);
  EXPECT_EQ(encode_shard(tokens), bytes);  // and ours is byte-identical to llm.c's
}

// The mapped stream against the in-memory reference: every range that starts or ends near a
// shard boundary, over shards of 0, 1 and many tokens, reads the same tokens.
TEST_F(DataTest, MappedStreamEqualsConcatenatedShards) {
  const std::vector<size_t> sizes = {5, 0, 1, 1, 37, 0, 300, 2, 64};
  std::vector<uint16_t> all;
  std::vector<fs::path> paths;
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<uint16_t> part(sizes[k]);
    for (size_t i = 0; i < part.size(); ++i) part[i] = static_cast<uint16_t>(gasloc::random_below(7, all.size() + i, 65536));
    paths.push_back(dir_ / fmt::format("s{}.bin", k));
    write_shard(paths.back(), part);
    all.insert(all.end(), part.begin(), part.end());
  }
  const auto mapped = TokenStream::map_shards(paths, 65536);
  const TokenStream reference(all);
  ASSERT_EQ(mapped->size(), static_cast<int64_t>(all.size()));
  EXPECT_EQ(tokens_of(*mapped), all);
  const int64_t n = mapped->size();
  std::vector<int64_t> a(all.size()), b(all.size());
  for (int64_t start = 0; start <= n; ++start) {
    for (int64_t len : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{40}, n - start}) {
      if (start + len > n) continue;
      mapped->read(start, len, a.data());
      reference.read(start, len, b.data());
      ASSERT_TRUE(std::equal(a.begin(), a.begin() + len, b.begin())) << "start " << start << " length " << len;
    }
  }
  EXPECT_THROW(mapped->read(n - 3, 4, a.data()), std::out_of_range);
  EXPECT_THROW(mapped->read(-1, 1, a.data()), std::out_of_range);
  EXPECT_THROW(mapped->at(n), std::out_of_range);
  EXPECT_EQ(TokenStream::map_shards({}, 0)->size(), 0);

  // A mapping keeps its file: re-preparing a dataset (which replaces shards by rename) under a
  // running job leaves the job reading the tokens it opened.
  for (const auto& p : paths) fs::remove(p);
  EXPECT_EQ(tokens_of(*mapped), all);
  expect_data_error([&] { TokenStream::map_shards(paths, 0); }, {"s0.bin", "does not exist"});
}

// Windows drawn from mapped shards are the windows of the concatenated stream, including those
// that straddle a boundary (shards of 50 tokens, windows of 33).
TEST_F(DataTest, SamplerOverMappedShardsMatchesInMemory) {
  std::vector<uint16_t> all;
  std::vector<fs::path> paths;
  for (int k = 0; k < 12; ++k) {
    std::vector<uint16_t> part(50);
    for (size_t i = 0; i < part.size(); ++i) part[i] = static_cast<uint16_t>((all.size() + i) * 31 % 1000);
    paths.push_back(dir_ / fmt::format("train_{:06d}.bin", k));
    write_shard(paths.back(), part);
    all.insert(all.end(), part.begin(), part.end());
  }
  const auto mapped = TokenStream::map_shards(paths, 1000);
  const auto memory = std::make_shared<TokenStream>(all);
  WindowSampler a(mapped, 4, 32, 5), b(memory, 4, 32, 5);
  for (int i = 0; i < 50; ++i) {
    const Batch x = a.next(), y = b.next();
    ASSERT_TRUE(torch::equal(x.inputs, y.inputs) && torch::equal(x.targets, y.targets)) << "batch " << i;
  }
  const auto va = validation_batches(*mapped, 2, 32, 0), vb = validation_batches(*memory, 2, 32, 0);
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) EXPECT_TRUE(torch::equal(va[i].inputs, vb[i].inputs)) << "batch " << i;
}

TEST_F(DataTest, LlmcDirectoryOpensWithGpt2Vocab) {
  std::vector<uint16_t> train(3000), val(500);
  for (size_t i = 0; i < train.size(); ++i) train[i] = static_cast<uint16_t>((i * 7919) % 50257);
  for (size_t i = 0; i < val.size(); ++i) val[i] = static_cast<uint16_t>((i * 104729) % 50257);
  std::vector<uint16_t> train2 = {50256, 1, 2, 3};
  write_shard(dir_ / "fineweb_train_000001.bin", train);
  write_shard(dir_ / "fineweb_train_000002.bin", train2);
  write_shard(dir_ / "fineweb_val_000000.bin", val);
  write_text(dir_ / "README.txt", "not a shard");
  Dataset ds = Dataset::open(dir_);
  EXPECT_EQ(ds.vocab_size, 50257);
  EXPECT_EQ(ds.tokenizer_kind, "gpt2");
  EXPECT_EQ(ds.bos_id, 50256);
  ASSERT_EQ(ds.train->size(), static_cast<int64_t>(train.size() + train2.size()));
  std::vector<uint16_t> concatenated = train;  // file-name order
  concatenated.insert(concatenated.end(), train2.begin(), train2.end());
  EXPECT_EQ(tokens_of(*ds.train), concatenated);
  EXPECT_EQ(tokens_of(*ds.val), val);
  // A smaller override vocab makes the GPT-2 ids invalid.
  expect_data_error([&] { Dataset::open(dir_, 1000); }, {"fineweb_train_000001.bin", ">= the vocabulary size 1000"});
  write_shard(dir_ / "tiny_shakespeare_val.bin", val);  // llm.c's unnumbered names count too
  EXPECT_EQ(Dataset::open(dir_).val->size(), static_cast<int64_t>(2 * val.size()));
  fs::remove(dir_ / "fineweb_val_000000.bin");
  fs::remove(dir_ / "tiny_shakespeare_val.bin");
  expect_data_error([&] { Dataset::open(dir_); }, {"no llm.c validation shards"});
  // The hint is the exact command that creates the directory, not a template of it.
  const std::string missing = (dir_ / "missing").string();
  expect_data_error([&] { Dataset::open(dir_ / "missing"); },
                    {"does not exist", "gasloc prepare --input FILE... --out " + missing + "`",
                     "scripts/prepare_data.sh " + missing + " 8192`"});
  // The research regime's directory is named for its 1024-token tokenizer.
  const std::string research = (dir_ / "micro1024").string();
  expect_data_error([&] { Dataset::open(dir_ / "micro1024"); }, {"scripts/prepare_data.sh " + research + " 1024`"});
}

// ---- corpus reading -------------------------------------------------------------------------

TEST_F(DataTest, ReadsTxtJsonlAndJson) {
  EXPECT_EQ(split_text_documents("a\nb\n\n\nc\r\n \r\nd\n"), (std::vector<std::string>{"a\nb", "c", "d"}));
  write_text(dir_ / "a.jsonl", "{\"text\": \"one\"}\n\n{\"text\": \"two\", \"id\": 3}\n");
  write_text(dir_ / "b.json", R"(["x", "", "y"])");
  write_text(dir_ / "c.json", R"([{"body": "p"}, {"body": "q"}])");
  std::vector<std::string> docs;
  EXPECT_EQ(read_documents(dir_ / "a.jsonl", "text", docs).documents, 2);
  EXPECT_EQ(read_documents(dir_ / "b.json", "text", docs).documents, 2);
  auto info = read_documents(dir_ / "c.json", "body", docs);
  EXPECT_EQ(info.documents, 2);
  EXPECT_EQ(info.bytes, 30);
  EXPECT_EQ(docs, (std::vector<std::string>{"one", "two", "x", "y", "p", "q"}));
  expect_data_error([&] { read_documents(dir_ / "c.json", "text", docs); }, {"c.json", "element 0", "--text-field"});
}

TEST_F(DataTest, Sha256KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 h;  // a million 'a', fed in uneven pieces
  std::string chunk(997, 'a');
  size_t left = 1000000;
  while (left) { size_t n = std::min(left, chunk.size()); h.update(std::string_view(chunk).substr(0, n)); left -= n; }
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// ---- prepare --------------------------------------------------------------------------------

TEST_F(DataTest, PrepareSentencePieceIsDeterministic) {
  SKIP_WITHOUT_SENTENCEPIECE();
  write_json_array(dir_ / "corpus.json", make_docs(1500, 7));
  PrepareOptions opt;
  opt.inputs = {dir_ / "corpus.json"};
  opt.vocab_size = 400;
  opt.val_fraction = 0.05;
  opt.threads = 1;
  opt.out = dir_ / "out1";
  std::vector<std::string> log;
  PrepareResult r1 = prepare(opt, [&](const std::string& s) { log.push_back(s); });
  opt.out = dir_ / "out2";
  opt.threads = 2;  // thread count must not change the output
  PrepareResult r2 = prepare(opt);
  EXPECT_FALSE(log.empty());
  EXPECT_EQ(r1.documents, 1500);
  EXPECT_EQ(r1.vocab_size, 400);
  EXPECT_GT(r1.val_tokens, 0);
  EXPECT_EQ(r1.train_tokens, r2.train_tokens);

  auto f1 = dir_files(dir_ / "out1"), f2 = dir_files(dir_ / "out2");
  ASSERT_EQ(f1.size(), 4u);  // train_000000.bin val_000000.bin tokenizer.model dataset.json
  for (const auto& name : {"train_000000.bin", "val_000000.bin", "tokenizer.model", "dataset.json"}) {
    ASSERT_TRUE(f1.count(name) && f2.count(name)) << name;
    EXPECT_TRUE(f1[name] == f2[name]) << name << " differs between runs";
  }

  auto meta = nlohmann::json::parse(f1["dataset.json"]);
  EXPECT_EQ(meta["format"], "gasloc-dataset-1");
  EXPECT_EQ(meta["tokenizer"]["kind"], "sentencepiece");
  EXPECT_EQ(meta["tokenizer"]["vocab_size"], 400);
  EXPECT_EQ(meta["train_tokens"], r1.train_tokens);
  EXPECT_EQ(meta["shards_sha256"]["train_000000.bin"], sha256_hex(f1["train_000000.bin"]));
  EXPECT_EQ(meta["sources"][0]["sha256"], sha256_hex(gasloc::read_file(dir_ / "corpus.json")));

  Dataset ds = Dataset::open(dir_ / "out1");
  EXPECT_EQ(ds.vocab_size, 400);
  EXPECT_EQ(ds.train->size(), r1.train_tokens);
  Tokenizer tok = Tokenizer::load_sentencepiece(ds.tokenizer_model);
  const std::vector<uint16_t> train = tokens_of(*ds.train), val = tokens_of(*ds.val);
  EXPECT_EQ(train[0], tok.bos_id());
  EXPECT_EQ(std::count(train.begin(), train.end(), tok.bos_id()) + std::count(val.begin(), val.end(), tok.bos_id()),
            1500);  // one BOS per document
  const std::string text = "monri selpo 1234 — ünïcode ✓ and  two  spaces";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);  // byte fallback + identity normalization
}

TEST_F(DataTest, PrepareByteLevelRoundTrip) {
  write_text(dir_ / "a.txt", "first document\nline two\n\nsecond ✓ document\n\n\nthird\n");
  write_text(dir_ / "b.jsonl", "{\"text\": \"fourth\"}\n{\"text\": \"fifth\"}\n");
  PrepareOptions opt;
  opt.inputs = {dir_ / "a.txt", dir_ / "b.jsonl"};
  opt.out = dir_ / "out";
  opt.byte_level = true;
  opt.val_fraction = 0.2;
  PrepareResult r = prepare(opt);
  EXPECT_EQ(r.documents, 5);
  EXPECT_EQ(r.vocab_size, 257);
  EXPECT_FALSE(fs::exists(dir_ / "out" / "tokenizer.model"));
  Dataset ds = Dataset::open(dir_ / "out");
  EXPECT_EQ(ds.tokenizer_kind, "byte");
  EXPECT_EQ(ds.bos_id, 256);
  const std::vector<uint16_t> train = tokens_of(*ds.train), val = tokens_of(*ds.val);
  std::vector<int> all(train.begin(), train.end());
  all.insert(all.end(), val.begin(), val.end());
  EXPECT_EQ(std::count(all.begin(), all.end(), 256), 5);
  const Tokenizer tok = Tokenizer::byte_level();
  const std::string text = "any bytes: \x01\xff ✓ \n";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
  // Decoding the dataset gives back the documents' text (order: train then val).
  std::string decoded = tok.decode(all);
  for (const char* doc : {"first document\nline two", "second ✓ document", "third", "fourth", "fifth"})
    EXPECT_NE(decoded.find(doc), std::string::npos) << doc;
  EXPECT_EQ(decoded.size(), std::string("first document\nline twosecond ✓ documentthirdfourthfifth").size());
}

TEST_F(DataTest, PrepareSplitsLargeTrainStreamsIntoShards) {
  write_json_array(dir_ / "c.json", make_docs(200, 3));
  PrepareOptions opt;
  opt.inputs = {dir_ / "c.json"};
  opt.out = dir_ / "out";
  opt.byte_level = true;
  opt.shard_tokens = 2000;
  PrepareResult r = prepare(opt);
  const int64_t expect_shards = (r.train_tokens + 1999) / 2000;
  ASSERT_GT(expect_shards, 2);
  EXPECT_TRUE(fs::exists(dir_ / "out" / fmt::format("train_{:06d}.bin", expect_shards - 1)));
  EXPECT_FALSE(fs::exists(dir_ / "out" / fmt::format("train_{:06d}.bin", expect_shards)));
  EXPECT_EQ(Dataset::open(dir_ / "out").train->size(), r.train_tokens);

  // Without dataset.json (an interrupted prepare) the shards are not mistaken for llm.c's.
  const std::string meta = gasloc::read_file(dir_ / "out" / "dataset.json");
  fs::remove(dir_ / "out" / "dataset.json");
  expect_data_error([&] { Dataset::open(dir_ / "out"); }, {"no dataset.json", "gasloc prepare"});
  write_text(dir_ / "out" / "dataset.json", meta);

  // Re-preparing into the same directory is refused without --force, and with it removes the
  // shards the new dataset no longer uses.
  opt.shard_tokens = 100'000'000;
  expect_data_error([&] { prepare(opt); }, {"already holds a prepared dataset", "--force"});
  opt.force = true;
  prepare(opt);
  EXPECT_FALSE(fs::exists(dir_ / "out" / "train_000001.bin"));
  EXPECT_EQ(Dataset::open(dir_ / "out").train->size(), r.train_tokens);
}

TEST_F(DataTest, PrepareErrorsAreClear) {
  PrepareOptions opt;
  opt.out = dir_ / "out";
  opt.byte_level = true;

  opt.inputs = {dir_ / "missing.jsonl"};
  expect_data_error([&] { prepare(opt); }, {"missing.jsonl", "does not exist"});

  write_text(dir_ / "empty.txt", "\n  \n");
  opt.inputs = {dir_ / "empty.txt"};
  expect_data_error([&] { prepare(opt); }, {"empty.txt", "no text"});

  write_text(dir_ / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"ok too\"}\n{text: oops}\n");
  opt.inputs = {dir_ / "bad.jsonl"};
  expect_data_error([&] { prepare(opt); }, {"bad.jsonl", "line 3", "not valid JSON"});

  write_text(dir_ / "nofield.jsonl", "{\"text\": \"ok\"}\n{\"content\": \"x\"}\n");
  opt.inputs = {dir_ / "nofield.jsonl"};
  expect_data_error([&] { prepare(opt); }, {"nofield.jsonl", "line 2", "\"text\"", "--text-field"});

  write_text(dir_ / "doc.csv", "a,b\n");
  opt.inputs = {dir_ / "doc.csv"};
  expect_data_error([&] { prepare(opt); }, {"doc.csv", "unsupported extension"});

  // One document is split by tokens; it needs something to hold out, and room to do it.
  write_text(dir_ / "one.txt", "a single document\n");
  opt.inputs = {dir_ / "one.txt"};
  opt.val_fraction = 0;
  expect_data_error([&] { prepare(opt); }, {"one document", "--val-fraction"});
  write_text(dir_ / "tiny.txt", "a");
  opt.inputs = {dir_ / "tiny.txt"};
  opt.val_fraction = 0.5;
  expect_data_error([&] { prepare(opt); }, {"one document of 2 tokens", "too short"});
  opt.val_fraction = 0.01;

  write_json_array(dir_ / "small.json", make_docs(30, 1));
  opt.inputs = {dir_ / "small.json"};
  opt.byte_level = false;
  if (!gasloc::data::spm::unavailable_reason().empty()) {
    expect_data_error([&] { prepare(opt); }, {"AddressSanitizer", "--byte-level"});
    SKIP_WITHOUT_SENTENCEPIECE();
  }
  opt.vocab_size = 8192;
  expect_data_error([&] { prepare(opt); }, {"vocab size 8192", "--vocab-size", "--byte-level"});

  opt.vocab_size = 260;  // 3 specials + 256 bytes leave room for 1 character, the text has ~30
  expect_data_error([&] { prepare(opt); }, {"vocab size 260", "required_chars", "raise --vocab-size"});

  opt.tokenizer_model = dir_ / "nope.model";
  expect_data_error([&] { prepare(opt); }, {"nope.model", "does not exist"});
  write_text(dir_ / "garbage.model", "this is not a protobuf");
  opt.tokenizer_model = dir_ / "garbage.model";
  expect_data_error([&] { prepare(opt); }, {"garbage.model", "cannot load SentencePiece model"});

  EXPECT_FALSE(fs::exists(dir_ / "out")) << "a failed prepare must not create the output directory";
}

TEST_F(DataTest, PrepareSplitsOneDocumentByTokens) {
  // One text with no blank line (a one-sentence-per-line corpus): the last 10% of its tokens
  // are the validation split, and they are exactly the end of the text.
  std::string text;
  for (int i = 0; i < 600; ++i) text += fmt::format("Sentence {} of one long document about {}.\n", i, i % 13);
  write_text(dir_ / "book.txt", text);
  PrepareOptions opt;
  opt.inputs = {dir_ / "book.txt"};
  opt.out = dir_ / "out";
  opt.byte_level = true;
  opt.val_fraction = 0.1;
  const PrepareResult r = prepare(opt);
  EXPECT_EQ(r.documents, 1);
  EXPECT_EQ(r.split, "tokens");
  // read_documents trims the document's trailing newline; BOS comes first.
  const std::string doc = text.substr(0, text.size() - 1);
  const int64_t total = static_cast<int64_t>(doc.size()) + 1;
  EXPECT_EQ(r.train_tokens + r.val_tokens, total);
  EXPECT_EQ(r.val_tokens, std::llround(0.1 * static_cast<double>(total)));
  const Dataset ds = Dataset::open(dir_ / "out");
  const auto val = tokens_of(*ds.val);
  const std::string val_text(val.begin(), val.end());
  EXPECT_EQ(val_text, doc.substr(doc.size() - val_text.size()));
  const auto meta = nlohmann::json::parse(gasloc::read_file(dir_ / "out" / "dataset.json"));
  EXPECT_EQ(meta["split"], "tokens");
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.front();  // ~2700 validation tokens: one default batch fits

  // A trained tokenizer learns only from the text before the validation tail; the split holds.
  SKIP_WITHOUT_SENTENCEPIECE();
  opt.byte_level = false;
  opt.vocab_size = 300;
  opt.out = dir_ / "sp";
  const PrepareResult s = prepare(opt);
  EXPECT_EQ(s.split, "tokens");
  EXPECT_NEAR(static_cast<double>(s.val_tokens) / static_cast<double>(s.train_tokens + s.val_tokens), 0.1, 1e-3);
}

TEST_F(DataTest, PrepareWarnsWhenValidationIsSmallerThanOneBatch) {
  write_json_array(dir_ / "c.json", make_docs(200, 3));
  PrepareOptions opt;
  opt.inputs = {dir_ / "c.json"};
  opt.out = dir_ / "out";
  opt.byte_level = true;
  opt.val_fraction = 0.01;  // ~2 documents, ~100 tokens: less than 16 x 129
  const PrepareResult small = prepare(opt);
  ASSERT_LT(small.val_tokens, kDefaultEvalBatchTokens);
  ASSERT_EQ(small.warnings.size(), 1u);
  EXPECT_NE(small.warnings[0].find("fewer than one evaluation batch"), std::string::npos) << small.warnings[0];
  EXPECT_NE(small.warnings[0].find("--val-fraction"), std::string::npos) << small.warnings[0];
  opt.val_fraction = 0.5;
  opt.force = true;
  const PrepareResult big = prepare(opt);
  ASSERT_GE(big.val_tokens, kDefaultEvalBatchTokens);
  EXPECT_TRUE(big.warnings.empty());
}

TEST_F(DataTest, UnigramBaselineByHandAndRecordedByPrepare) {
  // train {0, 0, 1}, val {0, 2}, vocab 3: add-one counts 3, 2, 1 of 6.
  const std::vector<uint16_t> train = {0, 0, 1}, val = {0, 2};
  const double expect = -(std::log(3.0 / 6.0) + std::log(1.0 / 6.0)) / 2.0;
  EXPECT_NEAR(unigram_cross_entropy(train, val, 3), expect, 1e-12);
  EXPECT_NEAR(unigram_cross_entropy(TokenStream(train), TokenStream(val), 3), expect, 1e-12);
  EXPECT_THROW(unigram_cross_entropy(train, std::vector<uint16_t>{}, 3), DataError);

  write_json_array(dir_ / "c.json", make_docs(200, 3));
  PrepareOptions opt;
  opt.inputs = {dir_ / "c.json"};
  opt.out = dir_ / "out";
  opt.byte_level = true;
  opt.val_fraction = 0.2;
  const PrepareResult r = prepare(opt);
  const Dataset ds = Dataset::open(dir_ / "out");
  EXPECT_NEAR(ds.unigram_val_loss, unigram_cross_entropy(*ds.train, *ds.val, 257), 1e-12);
  EXPECT_EQ(ds.unigram_val_loss, r.unigram_val_loss);
  // Between knowing nothing (log V) and the text itself.
  EXPECT_GT(ds.unigram_val_loss, 1.0);
  EXPECT_LT(ds.unigram_val_loss, std::log(257.0));
  // The tokenizer comes back from dataset.json alone.
  const auto tok = dataset_tokenizer(dir_ / "out");
  ASSERT_TRUE(tok.has_value());
  EXPECT_EQ(tok->kind(), "byte");
  EXPECT_FALSE(dataset_tokenizer(dir_).has_value());
}

// ---- samplers -------------------------------------------------------------------------------

namespace {
std::shared_ptr<const TokenStream> ramp(size_t n) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(i % 60000);
  return std::make_shared<TokenStream>(std::move(v));
}
}  // namespace

TEST(Sampler, DeterministicAndResumable) {
  auto tokens = ramp(10000);
  WindowSampler a(tokens, 4, 16, 42), b(tokens, 4, 16, 42);
  std::vector<Batch> seq;
  for (int i = 0; i < 5; ++i) {
    seq.push_back(a.next());
    Batch other = b.next();
    EXPECT_TRUE(torch::equal(seq.back().inputs, other.inputs));
  }
  EXPECT_EQ(a.position(), 20u);
  WindowSampler c(tokens, 4, 16, 42);
  c.set_position(3 * 4);  // resume after three batches
  Batch resumed = c.next();
  EXPECT_TRUE(torch::equal(resumed.inputs, seq[3].inputs));
  EXPECT_TRUE(torch::equal(resumed.targets, seq[3].targets));
  EXPECT_EQ(c.position(), 16u);
  EXPECT_FALSE(torch::equal(seq[0].inputs, seq[1].inputs));
}

TEST(Sampler, SeedsDifferAndTargetsAreShiftedInputs) {
  auto tokens = ramp(50000);
  WindowSampler a(tokens, 8, 32, 1), b(tokens, 8, 32, 2);
  Batch x = a.next(), y = b.next();
  EXPECT_FALSE(torch::equal(x.inputs, y.inputs));
  ASSERT_EQ(x.inputs.sizes(), (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(x.inputs.dtype(), torch::kLong);
  EXPECT_EQ(x.targets.dtype(), torch::kLong);
  EXPECT_TRUE(x.inputs.is_contiguous() && x.targets.is_contiguous());
  using torch::indexing::Slice;
  EXPECT_TRUE(torch::equal(x.inputs.index({Slice(), Slice(1, torch::indexing::None)}), x.targets.index({Slice(), Slice(0, -1)})));
  // Each row is a contiguous window of the stream (the ramp makes consecutive ids).
  for (int r = 0; r < 8; ++r) {
    const int64_t start = x.inputs[r][0].item<int64_t>();
    EXPECT_EQ(x.targets[r][31].item<int64_t>(), start + 32);
  }
}

TEST(Sampler, CoversWholeStreamIncludingLastWindow) {
  auto tokens = ramp(20);  // T = 4: 16 valid starts, 0..15
  WindowSampler s(tokens, 1, 4, 9);
  std::set<int64_t> starts;
  for (int i = 0; i < 2000; ++i) starts.insert(s.next().inputs[0][0].item<int64_t>());
  EXPECT_EQ(starts.size(), 16u);
  EXPECT_EQ(*starts.rbegin(), 15);
  expect_data_error([&] { WindowSampler(ramp(16), 1, 16, 0); }, {"16 tokens", "seq_len 16", "17"});
}

TEST(Sampler, SlicesPartitionTheStream) {
  for (int64_t size : {0, 1, 7, 100, 1001}) {
    for (int world : {1, 2, 3, 8, 64}) {
      int64_t next = 0, smallest = size, largest = 0;
      for (int r = 0; r < world; ++r) {
        const TokenRange s = slice_of(size, r, world);
        EXPECT_EQ(s.begin, next) << size << " tokens, rank " << r << " of " << world;  // no gap, no overlap
        next = s.end;
        smallest = std::min(smallest, s.end - s.begin);
        largest = std::max(largest, s.end - s.begin);
      }
      EXPECT_EQ(next, size);
      EXPECT_LE(largest - smallest, 1);
    }
  }
}

TEST(Sampler, ASliceConfinesEveryWindowAndTheWholeRangeChangesNothing) {
  auto tokens = ramp(1000);
  // The whole stream as an explicit range is the plain sampler, batch for batch.
  WindowSampler plain(tokens, 4, 16, 3), ranged(tokens, 4, 16, 3, TokenRange{0, 1000});
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(torch::equal(plain.next().inputs, ranged.next().inputs)) << "batch " << i;
  // Rank 2 of 4 owns tokens [500, 750): windows of 17 tokens start in [500, 733], all of them.
  WindowSampler s(tokens, 1, 16, 9, slice_of(1000, 2, 4));
  std::set<int64_t> starts;
  for (int i = 0; i < 5000; ++i) {
    const Batch b = s.next();
    starts.insert(b.inputs[0][0].item<int64_t>());
    ASSERT_LT(b.targets[0][15].item<int64_t>(), 750);
  }
  EXPECT_EQ(*starts.begin(), 500);
  EXPECT_EQ(*starts.rbegin(), 733);
  EXPECT_EQ(starts.size(), 234u);
  expect_data_error([&] { WindowSampler(tokens, 1, 16, 0, slice_of(1000, 0, 64)); },
                    {"slice has 15 tokens", "seq_len 16", "fewer workers"});
  expect_data_error([&] { WindowSampler(tokens, 1, 16, 0, TokenRange{900, 1001}); }, {"[900, 1001)", "1000 tokens"});
}

TEST(Sampler, ValidationBatchesAreFixed) {
  auto tokens = ramp(1000);
  auto v1 = validation_batches(*tokens, 3, 10, 100), v2 = validation_batches(*tokens, 3, 10, 100);
  ASSERT_EQ(v1.size(), 1000u / 11 / 3);  // 90 windows -> 30 batches
  ASSERT_EQ(v1.size(), v2.size());
  for (size_t i = 0; i < v1.size(); ++i) {
    EXPECT_TRUE(torch::equal(v1[i].inputs, v2[i].inputs));
    EXPECT_TRUE(torch::equal(v1[i].targets, v2[i].targets));
  }
  EXPECT_EQ(v1[0].inputs[1][0].item<int64_t>(), 11);  // stride seq_len + 1
  EXPECT_EQ(v1[1].inputs[0][0].item<int64_t>(), 33);
  EXPECT_EQ(validation_batches(*tokens, 3, 10, 4).size(), 4u);
  expect_data_error([&] { validation_batches(*ramp(30), 3, 10, 4); }, {"30 tokens", "33", "--val-fraction"});
}

// A shard that changed after `prepare` (cut short with a consistent header, or its bytes
// altered) must not load as a smaller or different dataset without a word.
TEST_F(DataTest, ShardsThatChangedSincePrepareAreRefused) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "document number " + std::to_string(i) + " about foxes\n\n";
  write_text(dir_ / "c.txt", text);
  PrepareOptions opt;
  opt.inputs = {dir_ / "c.txt"};
  opt.out = dir_ / "out";
  opt.byte_level = true;
  opt.val_fraction = 0.1;
  prepare(opt);
  const fs::path shard = dir_ / "out" / "train_000000.bin";
  const std::string original = gasloc::read_file(shard);
  ASSERT_NO_THROW(Dataset::open(dir_ / "out"));

  // Cut short by 100 tokens, header rewritten to match: the shard itself is consistent.
  std::string cut = original.substr(0, original.size() - 200);
  int32_t count = 0;
  std::memcpy(&count, cut.data() + 8, 4);
  count -= 100;
  std::memcpy(cut.data() + 8, &count, 4);
  gasloc::write_file_atomic(shard, cut);
  try {
    Dataset::open(dir_ / "out");
    ADD_FAILURE() << "a shortened shard was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("train_000000.bin' has"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("records"), std::string::npos) << e.what();
  }
  // A dataset.json of an older gasloc (no shard sizes): the token counts catch it.
  auto meta = nlohmann::json::parse(gasloc::read_file(dir_ / "out" / "dataset.json"));
  meta.erase("shards_bytes");
  gasloc::write_file_atomic(dir_ / "out" / "dataset.json", meta.dump());
  try {
    Dataset::open(dir_ / "out");
    ADD_FAILURE() << "a shortened shard was accepted without shard sizes";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("the train split of"), std::string::npos) << e.what();
  }
  // Same size, other bytes: found by the sha256 check (data.verify_shards), which reads it all.
  std::string altered = original;
  altered[altered.size() / 2] = static_cast<char>(altered[altered.size() / 2] ^ 1);
  gasloc::write_file_atomic(shard, altered);
  EXPECT_NO_THROW(Dataset::open(dir_ / "out"));
  try {
    Dataset::open(dir_ / "out", 0, /*verify_hashes=*/true);
    ADD_FAILURE() << "an altered shard passed the sha256 check";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("does not match the sha256"), std::string::npos) << e.what();
  }
  gasloc::write_file_atomic(shard, original);
  EXPECT_NO_THROW(Dataset::open(dir_ / "out", 0, true));
}
