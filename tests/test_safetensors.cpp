// safetensors I/O, Hugging Face export/import, and the golden comparison against HF's Llama
// semantics (fixtures from tests/fixtures/gen_hf_llama_golden.py, checked in).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/model/hf_export.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/model/safetensors.hpp"
#include "test_paths.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace gasloc::model;
using gasloc::CheckpointError;

namespace {

// A fresh directory per test, under the build tree.
fs::path tmp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path d = gasloc::test_paths::binary_dir() / "test_tmp" / "safetensors" / (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

const fs::path kFixtures = gasloc::test_paths::source_dir() / "tests" / "fixtures" / "hf_llama";

// Expects `fn` to throw CheckpointError whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    return;
  }
  ADD_FAILURE() << "no CheckpointError thrown";
}

// A file made of an 8-byte length, the given header text and `data_bytes` zero bytes.
fs::path raw_file(const fs::path& dir, const std::string& header, size_t data_bytes, uint64_t length_field = UINT64_MAX) {
  const uint64_t n = length_field == UINT64_MAX ? header.size() : length_field;
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  bytes += header + std::string(data_bytes, '\0');
  fs::path p = dir / "raw.safetensors";
  gasloc::write_file_atomic(p, bytes);
  return p;
}

LlamaConfig small_config(bool tied) {
  LlamaConfig c;
  c.dim = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 50;
  c.multiple_of = 32;
  c.max_seq_len = 16;
  c.tie_embeddings = tied;
  c.rope_theta = 10000.0;
  c.norm_eps = 1e-6;
  c.init_std = 0.05;
  return c;
}

torch::Tensor sample_tokens(int64_t vocab) {
  return torch::arange(24, torch::kInt64).mul(7).remainder(vocab).view({2, 12});
}

float max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<float>(); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// safetensors format

TEST(Safetensors, RoundTripDtypesShapesAndMetadata) {
  const fs::path p = tmp_dir() / "t.safetensors";
  auto base = torch::arange(24, torch::kFloat32).view({2, 3, 4});
  std::vector<std::pair<std::string, torch::Tensor>> in = {
      {"f32", base},
      {"f64", torch::randn({3, 2}, torch::kFloat64)},
      {"f16_odd", torch::randn({5}).to(torch::kFloat16)},  // odd byte count: alignment must still hold
      {"bf16", torch::randn({4, 3}).to(torch::kBFloat16)},
      {"i64", torch::tensor({-1L, 0L, INT64_MAX})},
      {"i32", torch::tensor({-7, 9}, torch::kInt32)},
      {"i16", torch::tensor({-3, 4}, torch::kInt16)},
      {"i8", torch::tensor({-128, 127}, torch::kInt8)},
      {"u8", torch::tensor({0, 255}, torch::kUInt8)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar_0d", torch::tensor(3.5)},                   // shape []: one element
      {"empty", torch::empty({0, 3})},                     // zero bytes
      {"transposed", base.transpose(0, 2)},                // non-contiguous input
      {"view_offset", base.view({-1}).narrow(0, 5, 7)},    // storage offset
  };
  save_safetensors(p, in, {{"format", "pt"}, {"note", "hello"}});

  std::map<std::string, std::string> meta;
  auto out = load_safetensors(p, &meta);
  EXPECT_EQ(meta, (std::map<std::string, std::string>{{"format", "pt"}, {"note", "hello"}}));
  ASSERT_EQ(out.size(), in.size());
  for (const auto& [name, t] : in) {
    ASSERT_TRUE(out.count(name)) << name;
    EXPECT_EQ(out[name].scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(out[name].sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(out[name], t)) << name;
  }

  // The header is space-padded to 8 bytes and every tensor starts at a multiple of its element size.
  std::ifstream f(p, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  std::string head(n, '\0');
  f.read(head.data(), static_cast<std::streamsize>(n));
  const json header = json::parse(head);
  EXPECT_EQ(header.at("__metadata__").at("note"), "hello");
  for (const auto& [name, t] : out)
    EXPECT_EQ(header.at(name).at("data_offsets")[0].get<uint64_t>() % t.element_size(), 0u) << name;
}

TEST(Safetensors, ReadsFileWrittenByPythonScript) {
  // Written by the fixture script's own writer, not ours: the format, not just our round trip.
  std::map<std::string, std::string> meta;
  auto g = load_safetensors(kFixtures / "gqa_untied_f32" / "golden.safetensors", &meta);
  EXPECT_EQ(meta.at("generator"), "tests/fixtures/gen_hf_llama_golden.py");
  EXPECT_EQ(g.at("tokens").scalar_type(), torch::kInt64);
  EXPECT_EQ(g.at("logits").sizes(), torch::IntArrayRef({2, 16, 97}));
}

TEST(Safetensors, SaveRejectsBadInput) {
  const fs::path p = tmp_dir() / "bad.safetensors";
  auto t = torch::zeros({2});
  expect_error([&] { save_safetensors(p, {{"a", t}, {"a", t}}); }, {"duplicate tensor name 'a'", p.string()});
  expect_error([&] { save_safetensors(p, {{"__metadata__", t}}); }, {"reserved"});
  expect_error([&] { save_safetensors(p, {{"c", torch::zeros({2}, torch::kComplexFloat)}}); }, {"unsupported dtype"});
  EXPECT_FALSE(fs::exists(p));
}

TEST(Safetensors, RejectsCorruptFiles) {
  const fs::path dir = tmp_dir();
  const fs::path good = dir / "good.safetensors";
  save_safetensors(good, {{"w", torch::ones({4, 4})}});
  const std::string bytes = gasloc::read_file(good);
  const fs::path bad = dir / "bad.safetensors";
  const std::string name = bad.string();
  auto load = [&] { load_safetensors(bad); };

  gasloc::write_file_atomic(bad, bytes.substr(0, 5));
  expect_error(load, {name, "shorter than the 8-byte header length"});
  gasloc::write_file_atomic(bad, bytes.substr(0, bytes.size() - 4));  // truncated data
  expect_error(load, {name, "tensor 'w'", "out of range"});
  gasloc::write_file_atomic(bad, bytes + "xyz");
  expect_error(load, {name, "3 trailing bytes"});

  auto raw = [&](const std::string& header, size_t data, uint64_t len = UINT64_MAX) {
    fs::rename(raw_file(dir, header, data, len), bad);
  };
  raw("{}", 0, 1000);
  expect_error(load, {name, "header length 1000 exceeds the file"});
  raw("{\"w\": {\"dtype\": ", 0);
  expect_error(load, {name, "header is not valid JSON"});
  raw("[1, 2]", 0);
  expect_error(load, {name, "not a JSON object"});
  raw(R"({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", 2);
  expect_error(load, {name, "unknown or unsupported dtype 'F8_E4M3'"});
  raw(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8);
  expect_error(load, {name, "span 8 bytes", "need 12"});
  raw(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8);
  expect_error(load, {name, "non-integer or negative"});
  raw(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12);
  expect_error(load, {name, "overlaps"});
  raw(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8);
  expect_error(load, {name, "bytes 0..4", "belong to no tensor"});
  raw(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8);
  expect_error(load, {name, "out of range"});
  raw(R"({"__metadata__": {"n": 1}})", 0);
  expect_error(load, {name, "metadata value of 'n' is not a string"});
  expect_error([&] { load_safetensors(dir / "absent.safetensors"); }, {"cannot open", "absent.safetensors"});
}

// ---------------------------------------------------------------------------------------------
// Hugging Face export / import

TEST(HfExport, RoundTripGivesIdenticalParametersAndLogits) {
  const fs::path dir = tmp_dir();
  Llama a(small_config(false));
  a->init_weights(7);
  export_hf(dir, a, "float32", {.bos_token_id = 1, .eos_token_id = 2});

  const json cfg = json::parse(gasloc::read_file(dir / "config.json"));
  EXPECT_EQ(cfg["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_EQ(cfg["intermediate_size"], a->config().ffn_hidden());
  EXPECT_EQ(cfg["num_key_value_heads"], 2);
  EXPECT_EQ(cfg["torch_dtype"], "float32");
  EXPECT_EQ(cfg["bos_token_id"], 1);
  EXPECT_EQ(cfg["eos_token_id"], 2);
  std::map<std::string, std::string> meta;
  EXPECT_EQ(load_safetensors(dir / "model.safetensors", &meta).size(), a->hf_parameters().size());
  EXPECT_EQ(meta.at("format"), "pt");  // transformers refuses the file without it

  const LlamaConfig c = read_hf_config(dir / "config.json");
  const LlamaConfig& o = a->config();
  EXPECT_EQ(c.dim, o.dim);
  EXPECT_EQ(c.n_layers, o.n_layers);
  EXPECT_EQ(c.n_heads, o.n_heads);
  EXPECT_EQ(c.n_kv_heads, o.n_kv_heads);
  EXPECT_EQ(c.vocab_size, o.vocab_size);
  EXPECT_EQ(c.ffn_hidden(), o.ffn_hidden());
  EXPECT_EQ(c.norm_eps, o.norm_eps);
  EXPECT_EQ(c.rope_theta, o.rope_theta);
  EXPECT_EQ(c.max_seq_len, o.max_seq_len);
  EXPECT_EQ(c.tie_embeddings, o.tie_embeddings);
  EXPECT_EQ(c.init_std, o.init_std);

  Llama b(c);
  b->init_weights(8);
  auto tokens = sample_tokens(c.vocab_size);
  torch::NoGradGuard no_grad;
  ASSERT_GT(max_diff(a->forward(tokens), b->forward(tokens)), 1e-3);  // the import has work to do
  import_hf(dir, b);
  auto pa = a->hf_parameters(), pb = b->hf_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << pa[i].first;
  }
  EXPECT_TRUE(torch::equal(a->forward(tokens), b->forward(tokens)));
}

TEST(HfExport, Bfloat16ExportStoresBf16AndImportsRounded) {
  const fs::path dir = tmp_dir();
  Llama a(small_config(false));
  a->init_weights(3);
  export_hf(dir, a, "bfloat16");
  EXPECT_EQ(json::parse(gasloc::read_file(dir / "config.json"))["torch_dtype"], "bfloat16");
  EXPECT_TRUE(json::parse(gasloc::read_file(dir / "config.json"))["bos_token_id"].is_null());
  for (const auto& [name, t] : load_safetensors(dir / "model.safetensors")) EXPECT_EQ(t.scalar_type(), torch::kBFloat16) << name;

  Llama b(read_hf_config(dir / "config.json"));
  import_hf(dir, b);
  auto pa = a->hf_parameters(), pb = b->hf_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pb[i].second.scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::equal(pb[i].second, pa[i].second.to(torch::kBFloat16).to(torch::kFloat32))) << pa[i].first;
  }
}

// The tokenizer files LlamaTokenizer reads: the model bytes unchanged, BOS added as in training,
// legacy (plain SentencePiece) encoding, and the special tokens by their pieces.
TEST(HfExport, TokenizerFilesForLlamaTokenizer) {
  const fs::path dir = tmp_dir();
  HfTokenizer t;
  t.sentencepiece_model = std::string("\x0a\x03<s>\0binary", 11);
  t.bos_token = t.eos_token = "<s>";
  t.unk_token = "<unk>";
  t.model_max_length = 256;
  export_hf_tokenizer(dir, t);
  EXPECT_EQ(gasloc::read_file(dir / "tokenizer.model"), t.sentencepiece_model);
  const json j = json::parse(gasloc::read_file(dir / "tokenizer_config.json"));
  EXPECT_EQ(j["tokenizer_class"], "LlamaTokenizer");
  EXPECT_EQ(j["bos_token"], "<s>");
  EXPECT_EQ(j["eos_token"], "<s>");
  EXPECT_EQ(j["unk_token"], "<unk>");
  EXPECT_TRUE(j["pad_token"].is_null());
  EXPECT_EQ(j["add_bos_token"], true);
  EXPECT_EQ(j["add_eos_token"], false);
  EXPECT_EQ(j["legacy"], true);
  EXPECT_EQ(j["model_max_length"], 256);
  EXPECT_THROW(export_hf_tokenizer(dir, HfTokenizer{}), gasloc::ConfigError);
}

TEST(HfExport, UnknownDtypeIsConfigError) {
  Llama a(small_config(false));
  EXPECT_THROW(export_hf(tmp_dir(), a, "fp8"), gasloc::ConfigError);
}

TEST(HfExport, TiedEmbeddingsOmitLmHeadAndImport) {
  const fs::path dir = tmp_dir();
  Llama a(small_config(true));
  a->init_weights(11);
  export_hf(dir, a);
  auto file = load_safetensors(dir / "model.safetensors");
  EXPECT_FALSE(file.count("lm_head.weight"));
  EXPECT_TRUE(file.count("model.embed_tokens.weight"));
  EXPECT_EQ(json::parse(gasloc::read_file(dir / "config.json"))["tie_word_embeddings"], true);

  Llama b(read_hf_config(dir / "config.json"));
  EXPECT_TRUE(b->config().tie_embeddings);
  import_hf(dir, b);
  auto tokens = sample_tokens(50);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(a->forward(tokens), b->forward(tokens)));

  // Tied and untied files do not cross over silently.
  Llama untied(small_config(false));
  expect_error([&] { import_hf(dir, untied); }, {"missing lm_head.weight", (dir / "model.safetensors").string()});
  const fs::path dir2 = dir / "untied";
  export_hf(dir2, untied);
  expect_error([&] { import_hf(dir2, b); }, {"unexpected lm_head.weight"});
}

TEST(HfExport, ImportKeepsFlatParameterViews) {
  // Training binds parameters to one flat buffer; import must write through, not rebind.
  const fs::path dir = tmp_dir();
  Llama a(small_config(false));
  a->init_weights(5);
  export_hf(dir, a);

  Llama b(small_config(false));
  gasloc::FlatParams flat(b->hf_parameters());
  std::vector<void*> ptrs;
  for (auto& [name, p] : b->hf_parameters()) ptrs.push_back(p.data_ptr());
  import_hf(dir, b);
  auto pa = a->hf_parameters(), pb = b->hf_parameters();
  for (size_t i = 0; i < pb.size(); ++i) EXPECT_EQ(pb[i].second.data_ptr(), ptrs[i]) << pb[i].first;
  for (const auto& seg : flat.segments()) {
    auto it = std::find_if(pa.begin(), pa.end(), [&](const auto& np) { return np.first == seg.name; });
    ASSERT_NE(it, pa.end());
    EXPECT_TRUE(torch::equal(flat.view(flat.data(), seg), it->second)) << seg.name;
  }
}

TEST(HfExport, ImportRejectsMismatchedFilesAndLeavesModelUntouched) {
  const fs::path dir = tmp_dir();
  Llama a(small_config(false));
  a->init_weights(1);
  export_hf(dir, a);
  const fs::path file = dir / "model.safetensors";
  auto good = load_safetensors(file);
  auto rewrite = [&](const std::function<void(std::map<std::string, torch::Tensor>&)>& edit) {
    auto t = good;
    edit(t);
    save_safetensors(file, std::vector<std::pair<std::string, torch::Tensor>>(t.begin(), t.end()));
  };

  Llama b(small_config(false));
  b->init_weights(2);
  auto before = b->hf_parameters()[0].second.clone();

  rewrite([](auto& t) { t.erase("model.layers.1.mlp.up_proj.weight"); });
  expect_error([&] { import_hf(dir, b); }, {file.string(), "missing model.layers.1.mlp.up_proj.weight"});
  rewrite([](auto& t) { t["model.norm.weight"] = torch::ones({31}); });
  expect_error([&] { import_hf(dir, b); }, {"wrong shape model.norm.weight (file [31], model [32])"});
  rewrite([](auto& t) { t["model.layers.2.mlp.up_proj.weight"] = torch::ones({1}); });
  expect_error([&] { import_hf(dir, b); }, {"unexpected model.layers.2.mlp.up_proj.weight"});
  expect_error([&] { import_hf(dir / "nowhere", b); }, {"nowhere"});
  EXPECT_TRUE(torch::equal(b->hf_parameters()[0].second, before));
}

TEST(HfConfig, ReadsHfDefaultsAndOddWidthsAndRejectsUnsupported) {
  const fs::path dir = tmp_dir();
  const fs::path p = dir / "config.json";
  auto write = [&](const json& j) { gasloc::write_file_atomic(p, j.dump()); };
  // Llama 3 8B's shape: 14336 is not Llama's default rounding of 4096, so the reader must
  // still reproduce it exactly.
  json base = {{"model_type", "llama"}, {"hidden_size", 4096}, {"intermediate_size", 14336},
               {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
               {"vocab_size", 128256}, {"rope_theta", 500000.0}};
  write(base);
  LlamaConfig c = read_hf_config(p);
  EXPECT_EQ(c.ffn_hidden(), 14336);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.norm_eps, 1e-6);  // HF's default when absent
  EXPECT_EQ(c.max_seq_len, 2048);
  EXPECT_FALSE(c.tie_embeddings);
  for (int64_t width : {1, 7, 96, 10922, 11008, 40000}) {
    base["intermediate_size"] = width;
    write(base);
    EXPECT_EQ(read_hf_config(p).ffn_hidden(), width);
  }
  base["intermediate_size"] = 14336;

  auto rejects = [&](const char* key, const json& value, const std::string& part) {
    json j = base;
    if (value.is_discarded()) j.erase(key);
    else j[key] = value;
    write(j);
    expect_error([&] { read_hf_config(p); }, {p.string(), part});
  };
  rejects("rope_scaling", {{"rope_type", "llama3"}, {"factor", 32.0}}, "rope_scaling type \"llama3\" is not supported");
  rejects("hidden_act", "gelu", "hidden_act \"gelu\"");
  rejects("attention_bias", true, "attention_bias");
  rejects("head_dim", 64, "head_dim 64");
  rejects("hidden_size", json::value_t::discarded, "missing key 'hidden_size'");
  rejects("num_hidden_layers", "32", "'num_hidden_layers' must be an integer");
  rejects("num_key_value_heads", 5, "unusable shape");
  rejects("model_type", "mistral", "model_type");
  gasloc::write_file_atomic(p, "{ nope");
  expect_error([&] { read_hf_config(p); }, {p.string(), "not valid JSON"});
  expect_error([&] { read_hf_config(dir / "absent.json"); }, {"absent.json", "does not exist"});
}

// ---------------------------------------------------------------------------------------------
// Golden: our forward on HF-layout weights equals a re-implementation of transformers'
// LlamaForCausalLM (tests/fixtures/gen_hf_llama_golden.py).

class HfGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(HfGolden, LogitsMatchHfReference) {
  const fs::path dir = kFixtures / GetParam();
  const LlamaConfig c = read_hf_config(dir / "config.json");
  Llama m(c);
  import_hf(dir, m);
  auto golden = load_safetensors(dir / "golden.safetensors");
  const auto& tokens = golden.at("tokens");
  const auto& expected = golden.at("logits");
  torch::NoGradGuard no_grad;
  auto logits = m->forward(tokens);
  ASSERT_EQ(logits.sizes(), expected.sizes());
  // fp32 on both sides with O(1)-O(10) logits: rounding differences are ~1e-6; any layout error
  // (rope halves vs pairs, kv head grouping, norm placement) moves logits by > 1e-2.
  EXPECT_LT(max_diff(logits, expected), 1e-4);
  EXPECT_GT(expected.abs().max().item<float>(), 1.0f);  // the reference is not degenerate

  // The comparison is sensitive: a different model is far off.
  Llama other(c);
  other->init_weights(0);
  EXPECT_GT(max_diff(other->forward(tokens), expected), 0.1);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfGolden, ::testing::Values("gqa_untied_f32", "mha_tied_bf16"));

TEST(HfGoldenConfig, FixtureConfigsReadAsIntended) {
  const LlamaConfig a = read_hf_config(kFixtures / "gqa_untied_f32" / "config.json");
  EXPECT_EQ(a.n_kv_heads, 2);
  EXPECT_EQ(a.ffn_hidden(), 96);
  EXPECT_EQ(a.rope_theta, 500000.0);
  EXPECT_FALSE(a.tie_embeddings);
  const LlamaConfig b = read_hf_config(kFixtures / "mha_tied_bf16" / "config.json");
  EXPECT_EQ(b.n_kv_heads, b.n_heads);
  EXPECT_EQ(b.ffn_hidden(), 80);
  EXPECT_TRUE(b.tie_embeddings);
}
