// Hugging Face interchange: a directory with model.safetensors + config.json that
// `transformers.LlamaForCausalLM.from_pretrained(dir)` loads, and the reverse import.
//
// Our parameter names are already HF's and rotary embeddings use HF's rotate-half layout, so
// tensors are written and read unchanged (no renaming, no q/k permutation). See docs/model.md.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "gasloc/model/llama.hpp"

namespace gasloc::model {

// Token ids recorded in config.json; null when unknown (the tokenizer decides them).
struct HfSpecialTokens {
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;
};

// Writes DIR/model.safetensors (model->hf_parameters(), cast to `dtype`: "float32", "bfloat16"
// or "float16") and DIR/config.json (LlamaConfig fields, torch_dtype = dtype), each atomically.
// A tied lm_head is not written (HF re-ties it from tie_word_embeddings). Throws ConfigError
// for an unknown dtype, CheckpointError if a file cannot be written.
void export_hf(const std::filesystem::path& dir, Llama& model, const std::string& dtype = "float32",
               const HfSpecialTokens& special = {});

// A SentencePiece tokenizer as transformers' LlamaTokenizer loads it.
struct HfTokenizer {
  std::string sentencepiece_model;              // the .model file's bytes
  std::string bos_token, eos_token, unk_token;  // their pieces ("<s>", ...); empty: none
  int64_t model_max_length = 0;
};

// Writes DIR/tokenizer.model and DIR/tokenizer_config.json (LlamaTokenizer, BOS added in front
// of every text as in training, legacy SentencePiece encoding so ids equal gasloc's), atomically.
// `AutoTokenizer.from_pretrained(DIR)` then tokenizes as gasloc did. CheckpointError if a file
// cannot be written; ConfigError if the model bytes are empty.
void export_hf_tokenizer(const std::filesystem::path& dir, const HfTokenizer& tokenizer);

// Reads an HF config.json into our config. intermediate_size is represented exactly (multiple_of
// and ffn_dim_multiplier are chosen so that ffn_hidden() == intermediate_size). Throws
// CheckpointError naming the file for a missing or mistyped key, or for a feature the model does
// not have (rope_scaling, biases, an activation other than silu, head_dim != hidden / heads).
LlamaConfig read_hf_config(const std::filesystem::path& config_json);

// Loads DIR/model.safetensors into `model` in place: every parameter must be present with the
// exact shape and no other tensor may be in the file (CheckpointError listing the missing,
// mismatched and unexpected names). Values are converted to each parameter's dtype and device
// and copied into the existing storage, so parameters bound to a FlatParams buffer stay bound.
// Nothing is modified unless the whole file matches.
void import_hf(const std::filesystem::path& dir, Llama& model);

}  // namespace gasloc::model
