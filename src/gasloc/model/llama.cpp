#include "gasloc/model/llama.hpp"

#include <torch/torch.h>

#include <cmath>

#include "gasloc/core/error.hpp"
#include "gasloc/model/fused.hpp"

namespace gasloc::model {
namespace F = torch::nn::functional;

// ---------------------------------------------------------------------------------------------
// Config

int64_t LlamaConfig::ffn_hidden() const {
  int64_t hidden = 2 * (4 * dim) / 3;
  hidden = static_cast<int64_t>(ffn_dim_multiplier * static_cast<double>(hidden));
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

int64_t LlamaConfig::num_embedding_params() const { return vocab_size * dim; }

int64_t LlamaConfig::num_params() const {
  const int64_t D = head_dim();
  const int64_t attn = dim * n_heads * D * 2 + dim * n_kv_heads * D * 2;  // q, o + k, v
  const int64_t mlp = 3 * dim * ffn_hidden();
  const int64_t norms = 2 * dim;
  const int64_t head = tie_embeddings ? 0 : vocab_size * dim;
  return vocab_size * dim + n_layers * (attn + mlp + norms) + dim + head;
}

double LlamaConfig::flops_per_token(int64_t seq_len) const {
  // Every matmul parameter (all but embeddings and norms) costs 6 FLOPs per token in training;
  // the output head is a matmul even when tied.
  const int64_t non_matmul = vocab_size * dim + n_layers * 2 * dim + dim;
  const int64_t head_extra = tie_embeddings ? vocab_size * dim : 0;
  const double matmul = static_cast<double>(num_params() - non_matmul + head_extra);
  const double attn = 6.0 * static_cast<double>(n_layers * seq_len * dim);
  return 6.0 * matmul + attn;
}

void LlamaConfig::validate() const {
  auto need = [](bool ok, const std::string& field, const std::string& msg) {
    if (!ok) throw ConfigError("model." + field + ": " + msg, "fix the model shape in [model]");
  };
  need(dim > 0, "dim", "must be positive");
  need(n_layers > 0, "n_layers", "must be positive");
  need(n_heads > 0 && dim % n_heads == 0, "n_heads", "must divide dim (" + std::to_string(dim) + ")");
  need(head_dim() % 2 == 0, "n_heads", "dim / n_heads must be even for rotary embeddings");
  need(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "n_kv_heads",
       "must divide n_heads (" + std::to_string(n_heads) + ")");
  need(vocab_size > 1, "vocab_size", "must be at least 2");
  need(multiple_of > 0, "multiple_of", "must be positive");
  need(ffn_dim_multiplier > 0, "ffn_dim_multiplier", "must be positive");
  need(norm_eps > 0, "norm_eps", "must be positive");
  need(rope_theta > 0, "rope_theta", "must be positive");
  need(max_seq_len > 0, "max_seq_len", "must be positive");
  need(init_std > 0, "init_std", "must be positive");
}

namespace {
LlamaConfig make(int64_t dim, int64_t layers, int64_t heads, int64_t kv, int64_t vocab,
                 int64_t multiple_of, int64_t max_seq, bool tie = false) {
  LlamaConfig c;
  c.dim = dim;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv;
  c.vocab_size = vocab;
  c.multiple_of = multiple_of;
  c.max_seq_len = max_seq;
  c.tie_embeddings = tie;
  return c;
}

LlamaConfig with_ffn_multiplier(LlamaConfig c, double m) {
  c.ffn_dim_multiplier = m;
  return c;
}

struct Preset {
  config::Option option;
  LlamaConfig config;
};

// Vocabulary sizes are the defaults for model-info; training replaces them with the dataset's
// tokenizer size.
const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {{"nano", "tests"}, make(64, 2, 4, 2, 512, 32, 128)},
      {{"micro", "research preset, ~1.0M"}, make(128, 4, 4, 2, 1024, 32, 256)},
      {{"tiny", "CPU default, ~7.3M"}, make(256, 4, 8, 4, 8192, 256, 256)},
      {{"small", "~34M"}, make(512, 8, 8, 4, 8192, 256, 512)},
      {{"134m", "GASLoC paper scale"}, make(768, 12, 12, 12, 32000, 256, 1024)},
      {{"160m", "GPA paper scale, GPT-2 vocab"}, make(768, 12, 12, 12, 50304, 256, 1024)},
      {{"551m", "GASLoC paper scale"}, make(1536, 16, 16, 16, 32000, 256, 1024)},
      {{"1b", "Llama 3.2 1B shape"}, with_ffn_multiplier(make(2048, 16, 32, 8, 128256, 256, 2048, true), 1.5)},
  };
  return p;
}
}  // namespace

const config::Choices& LlamaConfig::preset_choices() {
  static const config::Choices c = [] {
    std::vector<config::Option> o;
    for (const auto& p : presets()) o.push_back(p.option);
    return config::Choices("model preset", std::move(o));
  }();
  return c;
}

LlamaConfig LlamaConfig::preset(const std::string& name) { return presets().at(preset_choices().index(name)).config; }

// ---------------------------------------------------------------------------------------------
// Layers

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, bool fused) : eps_(eps), fused_(fused) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  if (fused_ && fused::eligible(x)) return fused::rms_norm(x, weight, eps_);
  // Normalize in fp32 (as HF does) so bf16 activations do not lose the mean-square's precision.
  const bool reduced = x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kHalf;
  auto xf = reduced ? x.to(torch::kFloat32) : x;
  auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * y.to(x.scalar_type());
}

std::pair<torch::Tensor, torch::Tensor> rope_tables(int64_t T, int64_t D, double theta,
                                                    const torch::TensorOptions& opts) {
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  auto inv_freq = 1.0 / torch::pow(theta, torch::arange(0, D, 2, f64) / static_cast<double>(D));  // [D/2]
  auto pos = torch::arange(T, f64);                                                           // [T]
  auto freqs = torch::outer(pos, inv_freq);                                                   // [T, D/2]
  auto emb = torch::cat({freqs, freqs}, -1);                                                  // [T, D]
  return {emb.cos().to(opts), emb.sin().to(opts)};
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  auto rotated = torch::cat({-x2, x1}, -1);  // HF rotate_half
  return x * cos + rotated * sin;
}

AttentionImpl::AttentionImpl(const LlamaConfig& cfg)
    : n_heads_(cfg.n_heads), n_kv_heads_(cfg.n_kv_heads), head_dim_(cfg.head_dim()), fused_(cfg.fused) {
  auto lin = [](int64_t in, int64_t out) { return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)); };
  q_proj = register_module("q_proj", lin(cfg.dim, n_heads_ * head_dim_));
  k_proj = register_module("k_proj", lin(cfg.dim, n_kv_heads_ * head_dim_));
  v_proj = register_module("v_proj", lin(cfg.dim, n_kv_heads_ * head_dim_));
  o_proj = register_module("o_proj", lin(n_heads_ * head_dim_, cfg.dim));
}

torch::Tensor AttentionImpl::forward_fused(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1), G = n_heads_ / n_kv_heads_;
  // Rotation and head split in one pass; the G query heads sharing a key/value head are stacked
  // as G*T rows, so one product per key head serves the whole group (no repeat_interleave).
  auto qkv = fused::linear_group(x, q_proj->weight, k_proj->weight, v_proj->weight);
  auto q_BKRD = fused::rope_heads(qkv[0], n_heads_, cos, sin).view({B, n_kv_heads_, G * T, head_dim_});
  auto k_BKTD = fused::rope_heads(qkv[1], n_kv_heads_, cos, sin);
  auto v_BKTD = qkv[2].view({B, T, n_kv_heads_, head_dim_}).transpose(1, 2);
  auto probs = fused::causal_softmax(torch::matmul(q_BKRD, k_BKTD.transpose(-2, -1)),
                                     1.0 / std::sqrt(static_cast<double>(head_dim_)));
  auto y_BHTD = torch::matmul(probs, v_BKTD).view({B, n_heads_, T, head_dim_});
  return o_proj(y_BHTD.transpose(1, 2).reshape({B, T, n_heads_ * head_dim_}));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  if (fused_ && fused::eligible(x)) return forward_fused(x, cos, sin);
  const int64_t B = x.size(0), T = x.size(1);
  auto q_BHTD = q_proj(x).view({B, T, n_heads_, head_dim_}).transpose(1, 2);
  auto k_BKTD = k_proj(x).view({B, T, n_kv_heads_, head_dim_}).transpose(1, 2);
  auto v_BKTD = v_proj(x).view({B, T, n_kv_heads_, head_dim_}).transpose(1, 2);
  auto cos_T = cos.narrow(0, 0, T), sin_T = sin.narrow(0, 0, T);
  q_BHTD = apply_rope(q_BHTD, cos_T.to(q_BHTD.scalar_type()), sin_T.to(q_BHTD.scalar_type()));
  k_BKTD = apply_rope(k_BKTD, cos_T.to(k_BKTD.scalar_type()), sin_T.to(k_BKTD.scalar_type()));
  // GQA: each group of H/K query heads shares one key/value head.
  const int64_t rep = n_heads_ / n_kv_heads_;
  auto k_BHTD = rep == 1 ? k_BKTD : k_BKTD.repeat_interleave(rep, 1);
  auto v_BHTD = rep == 1 ? v_BKTD : v_BKTD.repeat_interleave(rep, 1);
#if TORCH_VERSION_MAJOR >= 2
  auto y_BHTD = at::scaled_dot_product_attention(q_BHTD, k_BHTD, v_BHTD, {}, 0.0, /*is_causal=*/true);
#else
  auto scores = torch::matmul(q_BHTD, k_BHTD.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
  auto mask = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  // Softmax in at least fp32 (bf16 scores would lose the small probabilities).
  const bool reduced = scores.scalar_type() == torch::kBFloat16 || scores.scalar_type() == torch::kHalf;
  auto probs = reduced ? torch::softmax(scores, -1, torch::kFloat32).to(v_BHTD.scalar_type()) : torch::softmax(scores, -1);
  auto y_BHTD = torch::matmul(probs, v_BHTD);
#endif
  return o_proj(y_BHTD.transpose(1, 2).reshape({B, T, n_heads_ * head_dim_}));
}

MLPImpl::MLPImpl(const LlamaConfig& cfg) : fused_(cfg.fused) {
  auto lin = [](int64_t in, int64_t out) { return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)); };
  const int64_t F_ = cfg.ffn_hidden();
  gate_proj = register_module("gate_proj", lin(cfg.dim, F_));
  up_proj = register_module("up_proj", lin(cfg.dim, F_));
  down_proj = register_module("down_proj", lin(F_, cfg.dim));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  if (fused_ && fused::eligible(x)) {
    auto gate_up = fused::linear_group(x, gate_proj->weight, up_proj->weight);
    return down_proj(fused::swiglu(gate_up[0], gate_up[1]));
  }
  return down_proj(F::silu(gate_proj(x)) * up_proj(x));
}

BlockImpl::BlockImpl(const LlamaConfig& cfg) {
  self_attn = register_module("self_attn", Attention(cfg));
  mlp = register_module("mlp", MLP(cfg));
  input_layernorm = register_module("input_layernorm", RMSNorm(cfg.dim, cfg.norm_eps, cfg.fused));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(cfg.dim, cfg.norm_eps, cfg.fused));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto h = x + self_attn(input_layernorm(x), cos, sin);
  return h + mlp(post_attention_layernorm(h));
}

DecoderImpl::DecoderImpl(const LlamaConfig& cfg) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(cfg.vocab_size, cfg.dim));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.n_layers; ++i) layers->push_back(Block(cfg));
  norm = register_module("norm", RMSNorm(cfg.dim, cfg.norm_eps, cfg.fused));
}

// ---------------------------------------------------------------------------------------------
// Model

LlamaImpl::LlamaImpl(const LlamaConfig& cfg) : cfg_(cfg) {
  fused::keep_freed_memory();
  cfg_.validate();
  model = register_module("model", Decoder(cfg_));
  if (!cfg_.tie_embeddings)
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg_.dim, cfg_.vocab_size).bias(false)));
  init_weights(0);
}

std::pair<torch::Tensor, torch::Tensor> LlamaImpl::rope_for(const torch::TensorOptions& opts) {
  // Positions are computed independently, so a prefix of the max_seq_len table is exactly the
  // table for a shorter sequence.
  const std::lock_guard<std::mutex> lock(*rope_mutex_);
  if (!rope_cos_.defined() || rope_cos_.dtype() != opts.dtype() || rope_cos_.device() != opts.device())
    std::tie(rope_cos_, rope_sin_) = rope_tables(cfg_.max_seq_len, cfg_.head_dim(), cfg_.rope_theta, opts);
  return {rope_cos_, rope_sin_};
}

torch::Tensor LlamaImpl::hidden(const torch::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  TORCH_CHECK(T <= cfg_.max_seq_len, "sequence length ", T, " exceeds max_seq_len ", cfg_.max_seq_len);
  auto x_BTC = model->embed_tokens(tokens);
  auto [cos, sin] = rope_for(x_BTC.options());
  for (const auto& layer : *model->layers) x_BTC = layer->as<Block>()->forward(x_BTC, cos, sin);
  return model->norm(x_BTC);
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& tokens) {
  const auto& head = cfg_.tie_embeddings ? model->embed_tokens->weight : lm_head->weight;
  return torch::matmul(hidden(tokens), head.t());  // [B, T, V]
}

torch::Tensor LlamaImpl::loss(const torch::Tensor& inputs, const torch::Tensor& targets) {
  const auto& head = cfg_.tie_embeddings ? model->embed_tokens->weight : lm_head->weight;
  auto x_BTC = hidden(inputs);
  if (cfg_.fused && fused::eligible(x_BTC))
    return fused::linear_cross_entropy(x_BTC.reshape({-1, cfg_.dim}), head, targets.reshape({-1}));
  auto logits_BTV = torch::matmul(x_BTC, head.t());
  // Reduced-precision logits are upcast: the log-sum-exp over V needs fp32.
  if (logits_BTV.scalar_type() == torch::kBFloat16 || logits_BTV.scalar_type() == torch::kHalf)
    logits_BTV = logits_BTV.to(torch::kFloat32);
  return F::cross_entropy(logits_BTV.reshape({-1, cfg_.vocab_size}), targets.reshape({-1}));
}

void LlamaImpl::init_weights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  const double resid_std = cfg_.init_std / std::sqrt(2.0 * static_cast<double>(cfg_.n_layers));
  for (auto& [name, p] : hf_parameters()) {
    if (p.dim() == 1) {
      p.fill_(1.0);  // RMSNorm gains
      continue;
    }
    const bool residual_out = name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos;
    // Draw on CPU with our generator so the init is identical on every device.
    auto w = at::normal(0.0, residual_out ? resid_std : cfg_.init_std, p.sizes(), gen,
                        torch::TensorOptions().dtype(torch::kFloat32));
    p.copy_(w);
  }
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaImpl::hf_parameters() {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  return out;
}

}  // namespace gasloc::model
