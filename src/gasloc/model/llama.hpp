// Llama-3-style decoder-only transformer.
//
// Shape legend: B batch, T time (sequence), C channels (dim), V vocab, H query heads,
// K key/value heads (GQA: H % K == 0), D head dim (C / H), F SwiGLU hidden size.
//
// Parameter names are exactly Hugging Face's LlamaForCausalLM names (model.embed_tokens.weight,
// model.layers.{i}.self_attn.q_proj.weight, ..., lm_head.weight), and rotary embeddings use
// HF's rotate-half layout, so exported weights load into `transformers` without permutation.
// The model knows nothing about parallelism: training code moves its parameters into a
// FlatParams buffer after construction.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gasloc/core/choice.hpp"

namespace gasloc::model {

struct LlamaConfig {
  int64_t dim = 256;                 // C: residual stream width
  int64_t n_layers = 6;              // transformer blocks
  int64_t n_heads = 8;               // H: query heads
  int64_t n_kv_heads = 4;            // K: key/value heads (GQA); == n_heads for plain MHA
  int64_t vocab_size = 8192;         // V
  int64_t multiple_of = 256;         // SwiGLU hidden size is rounded up to a multiple of this
  double ffn_dim_multiplier = 1.0;   // extra factor on the SwiGLU hidden size (Llama 3 uses 1.3 at 8B)
  double norm_eps = 1e-5;            // RMSNorm epsilon
  double rope_theta = 500000.0;      // rotary base (Llama 3)
  int64_t max_seq_len = 256;         // longest sequence the model accepts
  bool tie_embeddings = false;       // share embed_tokens and lm_head
  double init_std = 0.02;            // normal init std; residual outputs get init_std / sqrt(2 * n_layers)
  // Fused CPU kernels (model/fused.hpp) for fp32 on CPU; false selects the reference ops, which
  // bf16 autocast and CUDA always use. Same parameters and, to rounding, the same values.
  bool fused = true;

  int64_t head_dim() const { return dim / n_heads; }
  // Llama's rounding: F = multiple_of * ceil(ffn_dim_multiplier * int(2 * 4C / 3) / multiple_of).
  int64_t ffn_hidden() const;
  int64_t num_params() const;        // total parameters (tied weights counted once)
  int64_t num_embedding_params() const;
  // Training FLOPs per token (forward + backward = 3x forward): 6 * matmul params + attention
  // 6 * n_layers * T * C (causal masking not discounted, as in the PaLM/Chinchilla convention).
  double flops_per_token(int64_t seq_len) const;
  // Throws ConfigError naming the offending field if the shape is inconsistent.
  void validate() const;
  // A named preset of preset_choices(). Throws ConfigError listing them for others.
  static LlamaConfig preset(const std::string& name);
  // nano, micro, tiny, small, 134m, 160m, 551m, 1b (model.preset).
  static const config::Choices& preset_choices();
};

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, bool fused = false);
  torch::Tensor forward(const torch::Tensor& x);  // [..., C] -> [..., C]
  torch::Tensor weight;

 private:
  double eps_;
  bool fused_;
};
TORCH_MODULE(RMSNorm);

// Rotary tables cos/sin [T, D] for positions 0..T-1 (HF rotate-half layout: frequencies repeat
// in the two halves of D).
std::pair<torch::Tensor, torch::Tensor> rope_tables(int64_t T, int64_t D, double theta,
                                                    const torch::TensorOptions& opts);
// Applies the rotation to x [B, heads, T, D] with tables [T, D].
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const LlamaConfig& cfg);
  // x [B, T, C] -> [B, T, C], causal.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  torch::Tensor forward_fused(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  int64_t n_heads_, n_kv_heads_, head_dim_;
  bool fused_;
};
TORCH_MODULE(Attention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const LlamaConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);  // SwiGLU: down(silu(gate(x)) * up(x))
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  bool fused_;
};
TORCH_MODULE(MLP);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const LlamaConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  Attention self_attn{nullptr};
  MLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(Block);

// The decoder body, registered as "model" so parameter names match HF.
class DecoderImpl : public torch::nn::Module {
 public:
  explicit DecoderImpl(const LlamaConfig& cfg);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers;
  RMSNorm norm{nullptr};
};
TORCH_MODULE(Decoder);

class LlamaImpl : public torch::nn::Module {
 public:
  explicit LlamaImpl(const LlamaConfig& cfg);
  // tokens [B, T] int64 -> logits [B, T, V].
  torch::Tensor forward(const torch::Tensor& tokens);
  // Mean cross-entropy of next-token prediction; inputs and targets [B, T] int64.
  torch::Tensor loss(const torch::Tensor& inputs, const torch::Tensor& targets);
  // Llama initialization (see LlamaConfig::init_std), deterministic for the given seed.
  void init_weights(uint64_t seed);
  // Parameters in HF order and names; a tied lm_head is not listed (HF omits it too).
  std::vector<std::pair<std::string, torch::Tensor>> hf_parameters();
  const LlamaConfig& config() const { return cfg_; }

  Decoder model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tie_embeddings

 private:
  torch::Tensor hidden(const torch::Tensor& tokens);  // the final norm's output [B, T, C]
  // Rotary tables for max_seq_len positions, built on first use for the activations' dtype and
  // device (a step then only narrows them).
  std::pair<torch::Tensor, torch::Tensor> rope_for(const torch::TensorOptions& opts);
  LlamaConfig cfg_;
  std::shared_ptr<std::mutex> rope_mutex_ = std::make_shared<std::mutex>();
  torch::Tensor rope_cos_, rope_sin_;
};
TORCH_MODULE(Llama);

}  // namespace gasloc::model
