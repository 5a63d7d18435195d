// gasloc eval: loss, perplexity and bits per byte of a run's model (the average of its workers
// by default) or of an export, on any prepared dataset's validation or training split.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>

#include "commands.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/data/sampler.hpp"
#include "gasloc/model/safetensors.hpp"
#include "gasloc/train/inference.hpp"
#include "model_source.hpp"

namespace gasloc::app {
namespace fs = std::filesystem;

namespace {
// Batch k of score_stream's batches, with the model's logits on it and its loss.
void write_batch_logits(const fs::path& path, model::Llama& model, const data::TokenStream& stream, int64_t bs,
                        int64_t T, int64_t k) {
  const auto batches = data::validation_batches(stream, bs, T, k + 1);
  if (static_cast<int64_t>(batches.size()) <= k)
    throw DataError(fmt::format("--logits-batch {}: the split holds {} batches of {} x {} tokens", k, batches.size(), bs, T),
                    "pass a smaller --logits-batch, --batch-size or --seq-len");
  torch::NoGradGuard no_grad;
  const auto& b = batches[static_cast<size_t>(k)];
  const auto dev = model->parameters().front().device();
  const torch::Tensor logits = model->forward(b.inputs.to(dev)).to(torch::kCPU, torch::kFloat);
  const double loss = model->loss(b.inputs.to(dev), b.targets.to(dev)).item<double>();
  model::save_safetensors(path, {{"inputs", b.inputs}, {"targets", b.targets}, {"logits", logits}},
                          {{"loss", fmt::format("{}", loss)}});
}
}  // namespace

Action add_eval(CLI::App& app) {
  struct Opts {
    ModelChoice model;
    std::string data, split = "val", logits_out;
    int64_t batch_size = 0, seq_len = 0, batches = -1, logits_batch = 0;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  add_model_options(app, o->model);
  app.add_option("--data", o->data, "prepared dataset directory (gasloc prepare) or llm.c shards")->required();
  app.add_option("--split", o->split, "which split to score")->capture_default_str()->check(CLI::IsMember({"val", "train"}));
  app.add_option("--batch-size", o->batch_size, "sequences per batch (default: the run's data.batch_size, else 16)");
  app.add_option("--seq-len", o->seq_len, "tokens per sequence (default: the run's data.seq_len, else 128)");
  app.add_option("--batches", o->batches,
                 "batches from the start of the split, 0 = all that fit (default: the run's data.val_batches, else all)");
  app.add_flag("--json", o->json, "print one JSON object instead of text");
  app.add_option("--logits-out", o->logits_out,
                 "also write one batch's tokens, targets and logits (safetensors: inputs, targets, logits) and its loss "
                 "(metadata), to check the model against another implementation (e.g. transformers)");
  app.add_option("--logits-batch", o->logits_batch, "which batch --logits-out writes, from 0")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  return [o]() {
    LoadedModel m = load_model(o->model);
    const int64_t bs = o->batch_size > 0 ? o->batch_size : m.batch_size;
    const int64_t T = o->seq_len > 0 ? o->seq_len : m.seq_len;
    const int64_t nb = o->batches >= 0 ? o->batches : m.val_batches;
    // The run's own data directory, prepared again since: a plausible loss on other text.
    std::error_code ec;
    if (const std::string now = data::Dataset::open(o->data).fingerprint;
        !m.run_data_fingerprint.empty() && fs::equivalent(o->data, m.run_data_dir, ec) && now != m.run_data_fingerprint)
      throw DataError(fmt::format("'{}' is the directory {} trained on, but it holds another dataset now (fingerprint {}, "
                                  "{} when the run started): it was prepared again",
                                  o->data, m.what, now, m.run_data_fingerprint),
                      "evaluate on the data the run trained on (restore it, or prepare its corpus again elsewhere with "
                      "the same options); any dataset prepared with the run's tokenizer also works");
    // Token ids beyond the model's vocabulary are refused when the shards are opened.
    const data::Dataset ds = data::Dataset::open(o->data, m.model->config().vocab_size);
    // Bytes come from the tokenizer that made the data; another than the model's scores ids
    // that mean other text.
    const std::optional<data::Tokenizer> tok = data::dataset_tokenizer(o->data);
    if (tok && m.tokenizer && tok->serialized_model() != m.tokenizer->serialized_model())
      throw DataError(fmt::format("'{}' was tokenized with another tokenizer than {}'s: its loss would mean nothing", o->data,
                                  m.what),
                      "prepare the text with the model's tokenizer: gasloc prepare --tokenizer RUN/dataset/tokenizer.model "
                      "(a run's copy) or HF_DIR/tokenizer.model; byte-level models need --byte-level data");
    const auto& stream = o->split == "val" ? *ds.val : *ds.train;
    const train::StreamScore s = train::score_stream(m.model, stream, bs, T, nb, tok ? &*tok : nullptr);
    if (!o->logits_out.empty()) write_batch_logits(o->logits_out, m.model, stream, bs, T, o->logits_batch);
    if (o->json) {
      nlohmann::json j = {{"model", m.what},     {"data", o->data},        {"split", o->split},
                          {"batch_size", bs},    {"seq_len", T},           {"batches", s.batches},
                          {"tokens", s.tokens},  {"loss", s.loss},         {"perplexity", s.perplexity},
                          {"bytes", s.bytes >= 0 ? nlohmann::json(s.bytes) : nlohmann::json(nullptr)},
                          {"bits_per_byte", s.bits_per_byte >= 0 ? nlohmann::json(s.bits_per_byte) : nlohmann::json(nullptr)}};
      if (o->split == "val" && ds.unigram_val_loss >= 0) j["unigram_val_loss"] = ds.unigram_val_loss;
      fmt::print("{}\n", j.dump());
      return 0;
    }
    fmt::print("model: {}\n", m.what);
    fmt::print("data: {} ({} split), {} batches of {} x {} tokens: {} tokens scored\n", o->data, o->split, s.batches, bs, T,
               s.tokens);
    fmt::print("loss {:.6f} nats/token, perplexity {:.3f}", s.loss, s.perplexity);
    if (s.bits_per_byte >= 0) fmt::print(", {:.4f} bits per byte ({} bytes of text)", s.bits_per_byte, s.bytes);
    fmt::print("\n");
    if (o->split == "val" && ds.unigram_val_loss >= 0)
      fmt::print("unigram baseline of this split: {:.4f} (token frequencies alone)\n", ds.unigram_val_loss);
    return 0;
  };
}

}  // namespace gasloc::app
