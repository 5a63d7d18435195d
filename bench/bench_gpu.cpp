// GPU checks for scripts/gpu_check.sh (not part of CI; builds everywhere, needs CUDA to run).
//
//   bench_gpu parity     [--preset tiny] [--batch 8] [--seq 128] [--steps 50] [--seed 1234]
//     The model on CUDA against the CPU fp32 reference, from the same weights: logits and loss
//     on one batch, then a `steps`-step AdamW loss curve on the same batches, at fp32 and at bf16
//     autocast (against the same fp32 CPU reference). Tolerances are printed with each line;
//     exits 1 when one is exceeded.
//   bench_gpu throughput [--preset 134m] [--seq 1024] [--batches 8,16,32,64,128] [--steps 10]
//     Full inner steps (forward, backward, clip, AdamW) in bf16 autocast on CUDA at each batch
//     size until one does not fit: tokens/s and model FLOP utilization against --peak-tflops
//     (dense bf16 datasheet) and --gemm-tflops (a GEMM rate measured by the caller).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "gasloc/core/flat_params.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/optim/adamw.hpp"
#include "gasloc/optim/optimizer.hpp"
#include "gasloc/train/worker.hpp"

using namespace gasloc;

namespace {

struct Args {
  std::string preset;
  int64_t batch = 8, seq = 128, steps = 50;
  std::vector<int64_t> batches = {8, 16, 32, 64, 128};
  double lr = 1e-3, peak_tflops = 989.4, gemm_tflops = 0;
  uint64_t seed = 1234;
  std::string device = "cuda";  // cpu: a dry run of the same code (checks the program, not CUDA)
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void sync(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize();
}

// A learnable stream: each row is an arithmetic progression modulo V with its own start and
// stride, so the next token follows from the two before it and the loss falls within 50 steps.
std::pair<torch::Tensor, torch::Tensor> make_batch(int64_t B, int64_t T, int64_t V, torch::Generator& g) {
  auto start = torch::randint(0, V, {B, 1}, g, torch::kInt64);
  auto stride = torch::randint(1, 17, {B, 1}, g, torch::kInt64);
  auto pos = torch::arange(T + 1, torch::kInt64).unsqueeze(0);
  auto seq = (start + stride * pos).remainder(V);
  return {seq.narrow(1, 0, T).contiguous(), seq.narrow(1, 1, T).contiguous()};
}

struct Replica {
  model::Llama m{nullptr};
  FlatParams flat;
  std::unique_ptr<optim::AdamW> opt;
  torch::Device device;
  std::string dtype;
  Replica(const model::LlamaConfig& cfg, uint64_t seed, torch::Device dev, std::string dt, bool fused_adamw)
      : device(dev), dtype(std::move(dt)) {
    m = model::Llama(cfg);
    m->init_weights(seed);
    m->to(device);
    flat = FlatParams(m->hf_parameters());
    optim::AdamWOptions o;
    o.fused = fused_adamw;
    opt = std::make_unique<optim::AdamW>(flat, o);
  }
  // One full step; returns the loss before the update.
  double step(const torch::Tensor& x, const torch::Tensor& y, double lr) {
    flat.zero_grad();
    torch::Tensor loss;
    {
      train::AutocastGuard ac(device, dtype);
      loss = m->loss(x.to(device), y.to(device));
    }
    loss.backward();
    optim::clip_grad_norm(flat.grad(), 1.0);
    opt->step(lr);
    return loss.item<double>();
  }
};

double rel_err(const torch::Tensor& a, const torch::Tensor& ref) {
  auto d = (a.to(torch::kCPU, torch::kFloat64) - ref.to(torch::kCPU, torch::kFloat64)).norm().item<double>();
  return d / std::max(ref.to(torch::kFloat64).norm().item<double>(), 1e-30);
}

int parity(const Args& a) {
  if (a.device == "cuda" && !torch::cuda::is_available()) {
    fmt::print("parity: no CUDA device visible to LibTorch\n");
    return 2;
  }
  auto cfg = model::LlamaConfig::preset(a.preset.empty() ? "tiny" : a.preset);
  cfg.max_seq_len = std::max(cfg.max_seq_len, a.seq);
  cfg.fused = false;  // the reference ops on both sides (CUDA always uses them)
  const torch::Device cpu(torch::kCPU), gpu = a.device == "cuda" ? torch::Device(torch::kCUDA, 0) : cpu;
  fmt::print("parity (device {}): preset {} ({:.2f}M parameters), batch {}x{}, vocab {}, seed {}, lr {:g}, {} steps; "
             "CPU fp32 reference (reference ops, AdamW reference ops)\n",
             a.device, a.preset.empty() ? "tiny" : a.preset, cfg.num_params() / 1e6, a.batch, a.seq, cfg.vocab_size, a.seed,
             a.lr, a.steps);
  // Tolerances. fp32: CUDA sums in other orders than the CPU (cuBLAS, SDPA kernels; TF32 is off
  // by default in LibTorch), so logits agree to ~1e-6 relative; 1e-4 leaves room. The curve
  // drifts as rounding differences compound through AdamW; 50 steps stay far under 1e-2.
  // bf16 autocast (8-bit mantissa: ~4e-3 per operation) against the fp32 reference: 3e-2
  // relative on the logits, 5e-2 on the loss, 0.1 along the curve.
  struct Tol {
    std::string dtype;
    double logits, loss, curve;
  };
  const std::vector<Tol> tols = {{"fp32", 1e-4, 1e-4, 1e-2}, {"bf16", 3e-2, 5e-2, 1e-1}};
  bool ok = true;
  Replica ref(cfg, a.seed, cpu, "fp32", false);
  torch::Generator g0 = at::detail::createCPUGenerator(a.seed);
  auto [x0, y0] = make_batch(a.batch, a.seq, cfg.vocab_size, g0);
  torch::Tensor logits_ref, loss_ref;
  {
    torch::NoGradGuard ng;
    logits_ref = ref.m->forward(x0);
    loss_ref = ref.m->loss(x0, y0);
  }
  // The CPU curve once, shared by both dtypes.
  std::vector<double> curve_ref;
  {
    torch::Generator g = at::detail::createCPUGenerator(a.seed + 1);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t k = 1; k <= a.steps; ++k) {
      auto [x, y] = make_batch(a.batch, a.seq, cfg.vocab_size, g);
      curve_ref.push_back(ref.step(x, y, a.lr));
    }
    fmt::print("parity: CPU fp32 curve {:.4f} -> {:.4f} in {:.1f} s\n", curve_ref.front(), curve_ref.back(),
               seconds_since(t0));
  }
  for (const auto& t : tols) {
    Replica r(cfg, a.seed, gpu, t.dtype, false);
    torch::Tensor logits, loss;
    {
      torch::NoGradGuard ng;
      train::AutocastGuard ac(gpu, t.dtype);
      logits = r.m->forward(x0.to(gpu)).to(torch::kFloat32);
      loss = r.m->loss(x0.to(gpu), y0.to(gpu)).to(torch::kFloat32);
    }
    const double e_logits = rel_err(logits, logits_ref);
    const double e_max = (logits.cpu() - logits_ref).abs().max().item<double>();
    const double d_loss = std::abs(loss.item<double>() - loss_ref.item<double>());
    const bool ok1 = std::isfinite(e_logits) && e_logits <= t.logits && d_loss <= t.loss;
    fmt::print("parity {} one batch: logits |d|/|ref| {:.3e} (max abs {:.3e}; tol {:g}), loss {:.6f} vs CPU {:.6f} "
               "|d| {:.3e} (tol {:g}): {}\n",
               t.dtype, e_logits, e_max, t.logits, loss.item<double>(), loss_ref.item<double>(), d_loss, t.loss,
               ok1 ? "PASS" : "FAIL");
    torch::Generator g = at::detail::createCPUGenerator(a.seed + 1);
    double worst = 0;
    std::vector<double> curve;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t k = 1; k <= a.steps; ++k) {
      auto [x, y] = make_batch(a.batch, a.seq, cfg.vocab_size, g);
      curve.push_back(r.step(x, y, a.lr));
      const double d = std::abs(curve.back() - curve_ref[k - 1]);
      worst = std::isfinite(d) ? std::max(worst, d) : INFINITY;
    }
    const double secs = seconds_since(t0);
    std::string pts;
    for (int64_t k : {1, 10, 20, 30, 40, 50})
      if (k <= a.steps) pts += fmt::format(" {}:{:.4f}/{:.4f}", k, curve[k - 1], curve_ref[k - 1]);
    const bool ok2 = worst <= t.curve;
    fmt::print("parity {} {}-step curve (CUDA/CPU):{}; max |d| {:.3e} (tol {:g}) in {:.1f} s: {}\n", t.dtype, a.steps,
               pts, worst, t.curve, secs, ok2 ? "PASS" : "FAIL");
    ok = ok && ok1 && ok2;
  }
  return ok ? 0 : 1;
}

int throughput(const Args& a) {
  if (a.device == "cuda" && !torch::cuda::is_available()) {
    fmt::print("throughput: no CUDA device visible to LibTorch\n");
    return 2;
  }
  auto cfg = model::LlamaConfig::preset(a.preset.empty() ? "134m" : a.preset);
  cfg.max_seq_len = std::max(cfg.max_seq_len, a.seq);
  cfg.fused = false;
  const torch::Device gpu = a.device == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  const double fpt = cfg.flops_per_token(a.seq);
  const double attn_palm = 12.0 * static_cast<double>(cfg.n_layers * a.seq * cfg.dim);
  const double fpt_palm = fpt - 6.0 * static_cast<double>(cfg.n_layers * a.seq * cfg.dim) + attn_palm;
#if TORCH_VERSION_MAJOR >= 2
  const char* attention = "at::scaled_dot_product_attention";
#else
  const char* attention = "matmul + softmax (no SDPA before LibTorch 2)";
#endif
  fmt::print("throughput: preset {} ({:.1f}M parameters, {:.1f}M embedding), seq {}, bf16 autocast, attention {} "
             "(LibTorch {}.{}), AdamW reference ops on fp32 master weights, device {}\n",
             a.preset.empty() ? "134m" : a.preset, cfg.num_params() / 1e6, cfg.num_embedding_params() / 1e6, a.seq,
             attention, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, a.device);
  fmt::print("throughput: FLOPs/token {:.4g} (6 x matmul params + 6*L*T*C causal attention, LlamaConfig::flops_per_token); "
             "{:.4g} with PaLM's 12*L*T*C; peak {:g} TFLOP/s (dense bf16 datasheet), measured GEMM {:g} TFLOP/s\n",
             fpt, fpt_palm, a.peak_tflops, a.gemm_tflops);
  Replica r(cfg, a.seed, gpu, "bf16", false);
  torch::Generator g = at::detail::createCPUGenerator(a.seed);
  int64_t best_b = 0;
  double best_tps = 0;
  for (int64_t B : a.batches) {
    try {
      auto [x, y] = make_batch(B, a.seq, cfg.vocab_size, g);
      x = x.to(gpu);
      y = y.to(gpu);
      double loss = 0;
      for (int w = 0; w < 3; ++w) loss = r.step(x, y, 1e-4);  // warm-up: cuBLAS/SDPA plans, allocator
      std::vector<double> times;
      for (int64_t k = 0; k < a.steps; ++k) {
        sync(gpu);
        const auto t0 = std::chrono::steady_clock::now();
        loss = r.step(x, y, 1e-4);  // item() inside synchronizes
        times.push_back(seconds_since(t0));
      }
      std::sort(times.begin(), times.end());
      const double s = times[times.size() / 2];
      const double tps = static_cast<double>(B * a.seq) / s;
      const double tflops = tps * fpt / 1e12;
      fmt::print("throughput batch {:>4} x {}: {:.3f} s/step (median of {}), {:.0f} tokens/s, {:.1f} TFLOP/s model, "
                 "MFU {:.1f}% of peak, {:.1f}% of measured GEMM (PaLM attention: {:.1f}% / {:.1f}%), loss {:.3f}\n",
                 B, a.seq, s, times.size(), tps, tflops, 100 * tflops / a.peak_tflops,
                 a.gemm_tflops > 0 ? 100 * tflops / a.gemm_tflops : 0.0, 100 * tps * fpt_palm / 1e12 / a.peak_tflops,
                 a.gemm_tflops > 0 ? 100 * tps * fpt_palm / 1e12 / a.gemm_tflops : 0.0, loss);
      std::fflush(stdout);
      if (tps > best_tps) {
        best_tps = tps;
        best_b = B;
      }
    } catch (const c10::Error& e) {
      std::string w = e.what();
      w = w.substr(0, w.find('\n'));
      fmt::print("throughput batch {:>4} x {}: does not run ({})\n", B, a.seq, w.substr(0, 200));
      break;
    }
  }
  if (best_b == 0) return 1;
  const double tflops = best_tps * fpt / 1e12;
  fmt::print("throughput best: batch {} x {}: {:.0f} tokens/s, MFU {:.1f}% of {:g} TFLOP/s peak, {:.1f}% of measured "
             "GEMM {:g} TFLOP/s\n",
             best_b, a.seq, best_tps, 100 * tflops / a.peak_tflops, a.peak_tflops,
             a.gemm_tflops > 0 ? 100 * tflops / a.gemm_tflops : 0.0, a.gemm_tflops);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPU checks: CUDA against the CPU reference, and training throughput (scripts/gpu_check.sh)"};
  Args a;
  auto* par = app.add_subcommand("parity", "the model on CUDA against the CPU fp32 reference");
  par->add_option("--preset", a.preset, "model preset (default tiny)");
  par->add_option("--batch", a.batch, "sequences per step")->capture_default_str();
  par->add_option("--seq", a.seq, "tokens per sequence")->capture_default_str();
  par->add_option("--steps", a.steps, "steps of the loss curve")->capture_default_str();
  par->add_option("--lr", a.lr, "AdamW learning rate")->capture_default_str();
  par->add_option("--seed", a.seed, "initial weights (the batches use seed + 1)")->capture_default_str();
  par->add_option("--device", a.device, "cuda, or cpu for a dry run of this program")->capture_default_str();
  auto* thr = app.add_subcommand("throughput", "bf16 training tokens/s and MFU on CUDA");
  thr->add_option("--preset", a.preset, "model preset (default 134m)");
  thr->add_option("--seq", a.seq, "tokens per sequence")->capture_default_str();
  thr->add_option("--batches", a.batches, "batch sizes, ascending; stops at the first that does not run")
      ->delimiter(',');
  thr->add_option("--steps", a.steps, "timed steps per batch size (median)")->capture_default_str();
  thr->add_option("--peak-tflops", a.peak_tflops, "dense bf16 peak (H100/H200 SXM datasheet: 989.4)")
      ->capture_default_str();
  thr->add_option("--gemm-tflops", a.gemm_tflops, "measured large bf16 GEMM rate (0 = not given)");
  thr->add_option("--device", a.device, "cuda, or cpu for a dry run of this program")->capture_default_str();
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  try {
    if (par->parsed()) return parity(a);
    if (a.seq == 128) a.seq = 1024;
    if (a.steps == 50) a.steps = 10;
    return throughput(a);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_gpu: {}\n", e.what());
    return 1;
  }
}
