#include <fmt/format.h>

#include "commands.hpp"
#include "gasloc/model/llama.hpp"

namespace gasloc::app {

static std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Action add_model_info(CLI::App& app) {
  struct Opts {
    std::string preset = "tiny";
    int64_t vocab = 0;
    int64_t seq_len = 0;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--preset,-p", o->preset, "nano, tiny, small, 134m, 160m, 551m, 1b")->capture_default_str();
  app.add_option("--vocab-size", o->vocab, "vocabulary size (default: the preset's)");
  app.add_option("--seq-len", o->seq_len, "sequence length for the attention FLOPs (default: max_seq_len)");
  return [o]() {
    auto c = model::LlamaConfig::preset(o->preset);
    if (o->vocab > 0) c.vocab_size = o->vocab;
    const int64_t T = o->seq_len > 0 ? o->seq_len : c.max_seq_len;
    c.validate();
    model::Llama m(c);  // build it: the shapes printed are the real ones
    fmt::print("preset {}: dim {} layers {} heads {} kv_heads {} head_dim {} ffn {} vocab {} max_seq_len {} tied {}\n",
               o->preset, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim(), c.ffn_hidden(), c.vocab_size,
               c.max_seq_len, c.tie_embeddings ? "yes" : "no");
    int64_t total = 0;
    for (auto& [name, p] : m->hf_parameters()) {
      // Print layer 0 in full and skip the identical deeper layers.
      if (name.find("layers.") != std::string::npos && name.find("layers.0.") == std::string::npos) {
        total += p.numel();
        continue;
      }
      fmt::print("  {:<52} {:>16} {:>12}\n", name, shape_str(p.sizes().vec()), p.numel());
      total += p.numel();
    }
    if (c.n_layers > 1) fmt::print("  (layers 1..{} have the shapes of layer 0)\n", c.n_layers - 1);
    fmt::print("parameters: {} ({:.2f}M; {:.2f}M without embeddings)\n", total, static_cast<double>(total) / 1e6,
               static_cast<double>(total - c.num_embedding_params()) / 1e6);
    fmt::print("training FLOPs per token at T={}: {:.3e} (6N + attention)\n", T, c.flops_per_token(T));
    fmt::print("fp32 weights: {:.1f} MB; bf16 message per exchange: {:.1f} MB\n", static_cast<double>(total) * 4 / 1e6,
               static_cast<double>(total) * 2 / 1e6);
    return total == c.num_params() ? 0 : 1;
  };
}

}  // namespace gasloc::app
