// Training throughput on CPU: tokens/s and achieved GFLOP/s of full inner steps (forward,
// backward, clip, AdamW) for presets, dtypes and code paths (fused kernels or the reference
// ops), measured side by side in one run, next to the GEMM roof: the GFLOP/s that OpenBLAS
// reaches on this step's own matrix products, timed alone in the same run. An optional loss
// comparison of bf16 against fp32 runs on real data.
//
//   build/bench_train [--presets tiny,small] [--dtypes fp32,bf16] [--paths fused,reference]
//                     [--streams 1,2] [--batch 8] [--seq 128] [--steps 6] [--loss-steps 300 --data data/default]
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <optional>

#include "gasloc/core/blas_threads.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/optim/adamw.hpp"
#include "gasloc/train/batch_streams.hpp"
#include "gasloc/train/trainer.hpp"
#include "gasloc/train/worker.hpp"

using namespace gasloc;

namespace {
struct Args {
  std::vector<std::string> presets = {"tiny", "small"};
  std::vector<std::string> dtypes = {"fp32"};
  std::vector<std::string> paths = {"fused"};
  std::vector<int> streams = {1};
  int64_t batch = 8, seq = 128, steps = 6, loss_steps = 0, vocab = 0, threads = 0;
  std::string data = "data/default";
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

model::LlamaConfig config_for(const std::string& preset, const Args& a) {
  auto cfg = model::LlamaConfig::preset(preset);
  if (a.vocab > 0) cfg.vocab_size = a.vocab;
  cfg.max_seq_len = std::max(cfg.max_seq_len, a.seq);
  return cfg;
}

// Seconds per inner step, median of `steps` timed steps after one warm-up step. With streams > 1
// the batch's row groups run on threads of their own with one BLAS thread each, as train.streams
// runs them.
double time_steps(const model::LlamaConfig& base, const std::string& dtype, bool fused, int streams, const Args& a) {
  auto cfg = base;
  cfg.fused = fused;
  model::Llama m(cfg);
  FlatParams flat(m->hf_parameters());
  optim::AdamWOptions o;
  o.fused = fused;
  optim::AdamW opt(flat, o);
  auto x = torch::randint(0, cfg.vocab_size, {a.batch, a.seq}, torch::kInt64);
  auto y = x.roll(1, 1);
  std::optional<BlasThreads> blas;
  std::optional<train::BatchStreams> split;
  if (streams > 1) {
    blas.emplace(1);
    split.emplace(streams);
  }
  std::vector<double> times;
  for (int64_t i = 0; i <= a.steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    flat.zero_grad();
    if (split) {
      split->loss_backward(m, x, y, torch::kCPU, dtype);
    } else {
      train::AutocastGuard ac(torch::kCPU, dtype);
      m->loss(x, y).backward();
    }
    optim::clip_grad_norm(flat.grad(), 1.0);
    opt.step(1e-3);
    if (i > 0) times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// GFLOP/s of the step's linear-layer products alone (forward, input gradient and weight gradient
// of every projection and the LM head, N = B*T rows), best of 3: what the BLAS allows this step.
double gemm_roof_gflops(const model::LlamaConfig& cfg, const Args& a) {
  const int64_t N = a.batch * a.seq, C = cfg.dim, D = cfg.head_dim(), F = cfg.ffn_hidden();
  const std::vector<std::pair<int64_t, int64_t>> layer = {{C, cfg.n_heads * D}, {C, cfg.n_kv_heads * D},
                                                          {C, cfg.n_kv_heads * D}, {cfg.n_heads * D, C},
                                                          {C, F}, {C, F}, {F, C}};
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int64_t l = 0; l < cfg.n_layers; ++l) shapes.insert(shapes.end(), layer.begin(), layer.end());
  shapes.emplace_back(C, cfg.vocab_size);
  struct Bufs {
    torch::Tensor x, w, y, dx, dw;
  };
  std::vector<Bufs> bufs;
  double flops = 0;
  for (auto [in, out] : shapes) {
    bufs.push_back({torch::randn({N, in}), torch::randn({out, in}), torch::empty({N, out}), torch::empty({N, in}),
                    torch::empty({out, in})});
    flops += 6.0 * static_cast<double>(N * in * out);
  }
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& b : bufs) {
      at::mm_out(b.y, b.x, b.w.t());
      at::mm_out(b.dx, b.y, b.w);
      at::mm_out(b.dw, b.y.t(), b.x);
    }
    if (rep > 0) best = std::min(best, seconds_since(t0));  // the first one warms up
  }
  return flops / best / 1e9;
}
}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"Training-step throughput of presets, dtypes and code paths, with the GEMM roof, in one run"};
  app.add_option("--presets", a.presets, "model presets, comma-separated")->delimiter(',')->capture_default_str();
  app.add_option("--dtypes", a.dtypes, "fp32 and/or bf16 (bf16 is slow on CPUs without native bf16)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app.add_option("--paths", a.paths, "fused (model.fused, fused AdamW) and/or reference (today's ops)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fused", "reference"}))
      ->capture_default_str();
  app.add_option("--streams", a.streams, "train.streams values: the batch split over this many threads (1 = inline)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch", a.batch, "sequences per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--seq", a.seq, "tokens per sequence")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--steps", a.steps, "timed steps (median reported) after one warm-up")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--vocab", a.vocab, "vocabulary size (0 = the preset's)")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--threads", a.threads, "LibTorch intra-op threads (0 = its default)")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--loss-steps", a.loss_steps, "also train tiny this many steps at fp32 and bf16 on --data and compare losses")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--data", a.data, "prepared dataset for --loss-steps")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (a.threads > 0) torch::set_num_threads(static_cast<int>(a.threads));

  fmt::print("bench_train: B={} T={} threads={} torch {}\n", a.batch, a.seq, torch::get_num_threads(), TORCH_VERSION);
  fmt::print("{:<8} {:<6} {:<10} {:>10} {:>10} {:>9} {:>10} {:>9} {:>9}\n", "preset", "dtype", "path", "params", "tokens/s",
             "GFLOP/s", "GEMM roof", "of roof", "vs first");
  try {
    for (const auto& preset : a.presets) {
      const auto cfg = config_for(preset, a);
      const double roof = gemm_roof_gflops(cfg, a);
      double first = 0;
      for (const auto& dtype : a.dtypes) {
        for (const auto& path : a.paths)
          for (int streams : a.streams) {
            if (a.batch % streams != 0) throw std::runtime_error("--streams values must divide --batch");
            const double tps = static_cast<double>(a.batch * a.seq) / time_steps(cfg, dtype, path == "fused", streams, a);
            if (first == 0) first = tps;
            const double gflops = tps * cfg.flops_per_token(a.seq) / 1e9;
            const std::string label = streams > 1 ? fmt::format("{}/s{}", path, streams) : path;
            fmt::print("{:<8} {:<6} {:<10} {:>9.2f}M {:>10.0f} {:>9.1f} {:>10.1f} {:>8.0f}% {:>8.2f}x\n", preset, dtype, label,
                       cfg.num_params() / 1e6, tps, gflops, roof, 100.0 * gflops / roof, tps / first);
          }
      }
    }
    if (a.loss_steps > 0) {
      // Same job at both dtypes on real data; validation is always evaluated in fp32.
      double fp32_loss = 0;
      for (const char* dtype : {"fp32", "bf16"}) {
        train::TrainRequest r;
        r.quiet = true;
        r.overrides = {"model.preset=tiny", "data.dir=" + a.data, "data.batch_size=" + std::to_string(a.batch),
                       "data.seq_len=" + std::to_string(a.seq), "train.steps=" + std::to_string(a.loss_steps),
                       "train.eval_every=0", "train.checkpoint_every=0", std::string("train.dtype=") + dtype,
                       "train.run_dir=build/bench_runs/loss_" + std::string(dtype) + "_" + std::to_string(std::time(nullptr))};
        const auto t0 = std::chrono::steady_clock::now();
        const auto s = train::run_training(r);
        const double secs = seconds_since(t0);
        if (std::string(dtype) == "fp32") fp32_loss = s.final_val_loss;
        fmt::print("loss after {} steps, tiny, {}: val_loss {:.4f} ({:+.2f}% vs fp32) in {:.0f} s\n", a.loss_steps, dtype,
                   s.final_val_loss, 100.0 * (s.final_val_loss - fp32_loss) / fp32_loss, secs);
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_train: {}\n", e.what());
    return 1;
  }
  return 0;
}
