#include "gasloc/train/inference.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <numbers>

#include "gasloc/core/error.hpp"
#include "gasloc/core/rng.hpp"
#include "gasloc/data/sampler.hpp"

namespace gasloc::train {

namespace {
torch::Device device_of(model::Llama& m) {
  for (const auto& p : m->parameters()) return p.device();
  return torch::kCPU;
}

std::vector<int> row_ids(const torch::Tensor& row) {
  const auto r = row.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* p = r.data_ptr<int64_t>();
  return std::vector<int>(p, p + r.numel());
}

// Bytes of the text that targets t1..tT add after t0: decoding drops a leading space (and
// control tokens), so the difference of the two decodings counts the targets' own bytes.
int64_t target_bytes(const data::Tokenizer& tok, const torch::Tensor& inputs_row, const torch::Tensor& targets_row) {
  std::vector<int> first = {row_ids(inputs_row.slice(0, 0, 1))[0]};
  std::vector<int> all = first;
  const auto t = row_ids(targets_row);
  all.insert(all.end(), t.begin(), t.end());
  return static_cast<int64_t>(tok.decode(all).size()) - static_cast<int64_t>(tok.decode(first).size());
}
}  // namespace

StreamScore score_stream(model::Llama& model, const data::TokenStream& tokens, int64_t batch_size, int64_t seq_len,
                         int64_t max_batches, const data::Tokenizer* tokenizer) {
  if (seq_len > model->config().max_seq_len)
    throw ConfigError(fmt::format("sequence length {} exceeds the model's max_seq_len {}", seq_len, model->config().max_seq_len),
                      "pass a shorter --seq-len");
  const auto batches = data::validation_batches(tokens, batch_size, seq_len, max_batches);
  const torch::Device dev = device_of(model);
  torch::NoGradGuard no_grad;
  StreamScore s;
  double total = 0;
  for (const auto& b : batches) {
    total += model->loss(b.inputs.to(dev), b.targets.to(dev)).item<double>();
    s.tokens += b.targets.numel();
    if (tokenizer) {
      if (s.bytes < 0) s.bytes = 0;
      for (int64_t i = 0; i < b.targets.size(0); ++i) s.bytes += target_bytes(*tokenizer, b.inputs[i], b.targets[i]);
    }
  }
  s.batches = static_cast<int64_t>(batches.size());
  s.loss = total / static_cast<double>(batches.size());  // as the trainer: the mean of equal batches' means
  s.perplexity = std::exp(s.loss);
  if (s.bytes > 0) s.bits_per_byte = s.loss * static_cast<double>(s.tokens) / (static_cast<double>(s.bytes) * std::numbers::ln2);
  return s;
}

SampleResult sample(model::Llama& model, const std::vector<int>& prompt, const SampleOptions& opt) {
  if (prompt.empty()) throw ConfigError("the prompt has no tokens", "pass a non-empty --prompt");
  if (opt.max_tokens < 0) throw ConfigError("--max-tokens must be >= 0");
  const int64_t vocab = model->config().vocab_size, ctx = model->config().max_seq_len;
  for (int id : prompt)
    if (id < 0 || id >= vocab)
      throw ConfigError(fmt::format("prompt token {} is outside the model's vocabulary of {}", id, vocab),
                        "use the tokenizer the model was trained with");
  const torch::Device dev = device_of(model);
  torch::NoGradGuard no_grad;
  std::vector<int> seq(prompt.begin(), prompt.end());
  SampleResult r;
  const uint64_t stream = mix64(opt.seed ^ 0x9e7e);
  for (int64_t k = 0; k < opt.max_tokens; ++k) {
    const int64_t begin = std::max<int64_t>(0, static_cast<int64_t>(seq.size()) - ctx);
    std::vector<int64_t> window(seq.begin() + begin, seq.end());
    const auto input = torch::tensor(window, torch::kInt64).unsqueeze(0).to(dev);
    const auto logits = model->forward(input)[0][-1].to(torch::kCPU, torch::kFloat64);
    int next = 0;
    if (opt.temperature <= 0) {
      next = static_cast<int>(logits.argmax().item<int64_t>());
    } else {
      auto scaled = logits / opt.temperature;
      if (opt.top_k > 0 && opt.top_k < vocab) {
        const double kth = std::get<0>(scaled.topk(opt.top_k))[-1].item<double>();
        scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<double>::infinity());
      }
      const auto probs = torch::softmax(scaled, 0).contiguous();
      const double* p = probs.data_ptr<double>();
      // Inverse CDF of one uniform draw: a pure function of (seed, k).
      const double u = static_cast<double>(random_u64(stream, static_cast<uint64_t>(k)) >> 11) * 0x1p-53;
      double acc = 0;
      next = -1;
      for (int64_t i = 0; i < vocab; ++i) {
        if (p[i] <= 0) continue;
        next = static_cast<int>(i);
        acc += p[i];
        if (u < acc) break;
      }
    }
    seq.push_back(next);
    r.tokens.push_back(next);
    if (next == opt.stop_id) {
      r.stopped = true;
      break;
    }
  }
  return r;
}

}  // namespace gasloc::train
