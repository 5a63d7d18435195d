#include "gasloc/model/hf_export.hpp"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <set>
#include <vector>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/model/safetensors.hpp"

namespace gasloc::model {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

torch::ScalarType export_dtype(const std::string& name) {
  if (name == "float32") return torch::kFloat32;
  if (name == "bfloat16") return torch::kBFloat16;
  if (name == "float16") return torch::kFloat16;
  throw ConfigError("unknown export dtype '" + name + "'", "use float32, bfloat16 or float16");
}

// "a, b, c and 4 more": error messages stay readable for a 200-tensor model.
std::string name_list(const std::vector<std::string>& names) {
  constexpr size_t kShown = 8;
  std::string s;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > kShown) s += " and " + std::to_string(names.size() - kShown) + " more";
  return s;
}

std::string shape_str(torch::IntArrayRef s) { return json(s.vec()).dump(); }

// Typed access to config.json keys; a wrong type is an error naming the key and the file.
struct ConfigReader {
  const fs::path& path;
  const json& j;

  [[noreturn]] void fail(const std::string& problem) const {
    throw CheckpointError("HF config '" + path.string() + "': " + problem,
                          "gasloc imports plain Llama configs (LlamaForCausalLM, no rope scaling, no biases)");
  }
  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    if (!has(key)) {
      if (!fallback) fail("missing key '" + std::string(key) + "'");
      return *fallback;
    }
    if (!j[key].is_number_integer()) fail("'" + std::string(key) + "' must be an integer, got " + j[key].dump());
    return j[key].get<int64_t>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_number()) fail("'" + std::string(key) + "' must be a number, got " + j[key].dump());
    return j[key].get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j[key].is_boolean()) fail("'" + std::string(key) + "' must be true or false, got " + j[key].dump());
    return j[key].get<bool>();
  }
};

// HF stores only the SwiGLU width; find multiple_of / ffn_dim_multiplier that reproduce it,
// preferring the plain Llama rounding (multiplier 1, the largest power-of-two multiple_of that
// fits) so that usual configs read back with familiar values.
void set_ffn_hidden(LlamaConfig& c, int64_t intermediate, const ConfigReader& r) {
  if (intermediate <= 0) r.fail("intermediate_size must be positive");
  c.ffn_dim_multiplier = 1.0;
  for (int64_t m = 1024; m >= 1; m /= 2) {
    c.multiple_of = m;
    if (c.ffn_hidden() == intermediate) return;
  }
  // Otherwise round up to one multiple of the width itself: ceil(int(h * mult) / F) == 1 needs
  // 1 <= int(h * mult) <= F; mult = (F + 0.5) / h puts h * mult half-way inside when h > F.
  c.multiple_of = intermediate;
  const double h = static_cast<double>(2 * (4 * c.dim) / 3);
  if (h > static_cast<double>(intermediate)) c.ffn_dim_multiplier = (static_cast<double>(intermediate) + 0.5) / h;
  if (c.ffn_hidden() != intermediate) r.fail("cannot represent intermediate_size " + std::to_string(intermediate));
}

}  // namespace

void export_hf(const fs::path& dir, Llama& model, const std::string& dtype, const HfSpecialTokens& special) {
  const auto type = export_dtype(dtype);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& [name, p] : model->hf_parameters()) tensors.emplace_back(name, p.detach().to(type));
  // transformers refuses safetensors files whose metadata lacks format=pt.
  save_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});

  const LlamaConfig& c = model->config();
  auto id = [](const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); };
  json j = {
      {"architectures", json::array({"LlamaForCausalLM"})},
      {"model_type", "llama"},
      {"hidden_size", c.dim},
      {"intermediate_size", c.ffn_hidden()},
      {"num_hidden_layers", c.n_layers},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.n_kv_heads},
      {"head_dim", c.head_dim()},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_seq_len},
      {"rms_norm_eps", c.norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", c.tie_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"pretraining_tp", 1},
      {"initializer_range", c.init_std},
      {"torch_dtype", dtype},
      {"use_cache", true},
      {"bos_token_id", id(special.bos_token_id)},
      {"eos_token_id", id(special.eos_token_id)},
  };
  write_file_atomic(dir / "config.json", j.dump(2) + "\n");
}

void export_hf_tokenizer(const fs::path& dir, const HfTokenizer& t) {
  if (t.sentencepiece_model.empty())
    throw ConfigError("no SentencePiece model to export", "only SentencePiece tokenizers are exported with the weights");
  auto token = [](const std::string& piece) { return piece.empty() ? json(nullptr) : json(piece); };
  const json j = {
      {"tokenizer_class", "LlamaTokenizer"},
      {"bos_token", token(t.bos_token)},
      {"eos_token", token(t.eos_token)},
      {"unk_token", token(t.unk_token)},
      {"pad_token", nullptr},
      // Training put BOS before every document and no EOS after it.
      {"add_bos_token", true},
      {"add_eos_token", false},
      // legacy: plain SentencePiece encoding, which is what gasloc's shards hold.
      {"legacy", true},
      {"clean_up_tokenization_spaces", false},
      {"model_max_length", t.model_max_length},
      {"sp_model_kwargs", json::object()},
  };
  try {
    write_file_atomic(dir / "tokenizer.model", t.sentencepiece_model);
    write_file_atomic(dir / "tokenizer_config.json", j.dump(2) + "\n");
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError(std::string("tokenizer not exported: ") + e.what(), e.hint());
  }
}

LlamaConfig read_hf_config(const fs::path& config_json) {
  if (!fs::is_regular_file(config_json))
    throw CheckpointError("HF config '" + config_json.string() + "' does not exist",
                          "pass the config.json written next to model.safetensors");
  json j;
  try {
    j = json::parse(read_file(config_json));
  } catch (const json::parse_error& e) {
    throw CheckpointError("HF config '" + config_json.string() + "' is not valid JSON: " + e.what());
  }
  const ConfigReader r{config_json, j};
  if (!j.is_object()) r.fail("not a JSON object");
  if (r.has("model_type") && j["model_type"] != "llama") r.fail("model_type is " + j["model_type"].dump() + ", not \"llama\"");
  if (r.has("hidden_act") && j["hidden_act"] != "silu") r.fail("hidden_act " + j["hidden_act"].dump() + " is not supported (silu only)");
  if (r.boolean("attention_bias", false)) r.fail("attention_bias = true is not supported");
  if (r.boolean("mlp_bias", false)) r.fail("mlp_bias = true is not supported");
  // Newer transformers nest rope_theta in rope_parameters; older ones use rope_scaling for the rest.
  double rope_theta = r.number("rope_theta", 10000.0);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!r.has(key)) continue;
    const json& rope = j[key];
    if (!rope.is_object()) r.fail(std::string(key) + " must be an object");
    const json type = rope.value("rope_type", rope.value("type", json("default")));
    if (type != "default") r.fail(std::string(key) + " type " + type.dump() + " is not supported (plain RoPE only)");
    if (rope.contains("rope_theta")) {
      if (!rope["rope_theta"].is_number()) r.fail(std::string(key) + ".rope_theta must be a number");
      rope_theta = rope["rope_theta"].get<double>();
    }
  }

  LlamaConfig c;
  c.dim = r.integer("hidden_size");
  c.n_layers = r.integer("num_hidden_layers");
  c.n_heads = r.integer("num_attention_heads");
  c.n_kv_heads = r.integer("num_key_value_heads", c.n_heads);  // HF default: plain MHA
  c.vocab_size = r.integer("vocab_size");
  c.max_seq_len = r.integer("max_position_embeddings", 2048);
  c.norm_eps = r.number("rms_norm_eps", 1e-6);  // HF LlamaConfig defaults from here on
  c.rope_theta = rope_theta;
  c.tie_embeddings = r.boolean("tie_word_embeddings", false);
  c.init_std = r.number("initializer_range", 0.02);
  if (c.n_heads <= 0 || c.dim % c.n_heads != 0)
    r.fail("num_attention_heads " + std::to_string(c.n_heads) + " does not divide hidden_size " + std::to_string(c.dim));
  if (r.has("head_dim") && r.integer("head_dim") != c.dim / c.n_heads)
    r.fail("head_dim " + std::to_string(r.integer("head_dim")) + " != hidden_size / num_attention_heads (" +
           std::to_string(c.dim / c.n_heads) + ") is not supported");
  set_ffn_hidden(c, r.integer("intermediate_size"), r);
  try {
    c.validate();
  } catch (const ConfigError& e) {
    r.fail(std::string("unusable shape: ") + e.what());
  }
  return c;
}

void import_hf(const fs::path& dir, Llama& model) {
  const fs::path file = dir / "model.safetensors";
  auto tensors = load_safetensors(file);
  auto params = model->hf_parameters();

  // Check everything first: a partial import would leave a model that is neither old nor new.
  std::vector<std::string> missing, mismatched, unexpected;
  std::set<std::string> expected;
  for (const auto& [name, p] : params) {
    expected.insert(name);
    auto it = tensors.find(name);
    if (it == tensors.end()) missing.push_back(name);
    else if (!it->second.sizes().equals(p.sizes()))
      mismatched.push_back(name + " (file " + shape_str(it->second.sizes()) + ", model " + shape_str(p.sizes()) + ")");
  }
  for (const auto& [name, t] : tensors)
    if (!expected.count(name)) unexpected.push_back(name);
  if (!missing.empty() || !mismatched.empty() || !unexpected.empty()) {
    std::string msg = "'" + file.string() + "' does not match the model:";
    if (!missing.empty()) msg += " missing " + name_list(missing) + ";";
    if (!mismatched.empty()) msg += " wrong shape " + name_list(mismatched) + ";";
    if (!unexpected.empty()) msg += " unexpected " + name_list(unexpected) + ";";
    msg.pop_back();
    throw CheckpointError(msg, "build the model from the export's config.json (read_hf_config), or export again");
  }

  torch::NoGradGuard no_grad;
  for (auto& [name, p] : params) p.copy_(tensors.at(name));  // converts dtype and device in place
}

}  // namespace gasloc::model
