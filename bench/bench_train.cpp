// Training throughput on CPU: tokens/s and achieved GFLOP/s of full inner steps (forward,
// backward, clip, AdamW) for presets and dtypes, measured side by side in one run, plus an
// optional loss comparison of bf16 against fp32 on real data.
//
//   build/bench_train [--presets tiny,small] [--batch 8] [--seq 128] [--steps 6]
//                     [--loss-steps 300 --data data/default]
#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <sstream>

#include "gasloc/core/flat_params.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/optim/adamw.hpp"
#include "gasloc/train/trainer.hpp"
#include "gasloc/train/worker.hpp"

using namespace gasloc;

namespace {
struct Args {
  std::vector<std::string> presets = {"tiny", "small"};
  int64_t batch = 8, seq = 128, steps = 6, loss_steps = 0;
  std::string data = "data/default";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--presets") {
      a.presets.clear();
      std::stringstream ss(v);
      for (std::string p; std::getline(ss, p, ',');) a.presets.push_back(p);
    } else if (k == "--batch") a.batch = std::stoll(v);
    else if (k == "--seq") a.seq = std::stoll(v);
    else if (k == "--steps") a.steps = std::stoll(v);
    else if (k == "--loss-steps") a.loss_steps = std::stoll(v);
    else if (k == "--data") a.data = v;
    else throw std::runtime_error("unknown option " + k);
  }
  return a;
}

// Seconds per inner step, median of `steps` timed steps after one warm-up step.
double time_steps(const std::string& preset, const std::string& dtype, const Args& a) {
  auto cfg = model::LlamaConfig::preset(preset);
  cfg.vocab_size = 8192;
  model::Llama m(cfg);
  FlatParams flat(m->hf_parameters());
  optim::AdamW opt(flat, {});
  auto x = torch::randint(0, cfg.vocab_size, {a.batch, a.seq}, torch::kInt64);
  std::vector<double> times;
  for (int64_t i = 0; i <= a.steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    flat.zero_grad();
    {
      train::AutocastGuard ac(torch::kCPU, dtype);
      m->loss(x, x.roll(1, 1)).backward();
    }
    optim::clip_grad_norm(flat.grad(), 1.0);
    opt.step(1e-3);
    if (i > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  fmt::print("bench_train: B={} T={} threads={} torch {}\n", a.batch, a.seq, torch::get_num_threads(), TORCH_VERSION);
  fmt::print("{:<8} {:<6} {:>12} {:>12} {:>10} {:>12}\n", "preset", "dtype", "params", "tokens/s", "GFLOP/s", "vs fp32");
  for (const auto& preset : a.presets) {
    auto cfg = model::LlamaConfig::preset(preset);
    cfg.vocab_size = 8192;
    double fp32_tps = 0;
    for (const char* dtype : {"fp32", "bf16"}) {
      const double s = time_steps(preset, dtype, a);
      const double tps = static_cast<double>(a.batch * a.seq) / s;
      if (std::string(dtype) == "fp32") fp32_tps = tps;
      fmt::print("{:<8} {:<6} {:>11.2f}M {:>12.0f} {:>10.1f} {:>11.2f}x\n", preset, dtype, cfg.num_params() / 1e6, tps,
                 tps * cfg.flops_per_token(a.seq) / 1e9, tps / fp32_tps);
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
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (std::string(dtype) == "fp32") fp32_loss = s.final_val_loss;
      fmt::print("loss after {} steps, tiny, {}: val_loss {:.4f} ({:+.2f}% vs fp32) in {:.0f} s\n", a.loss_steps, dtype,
                 s.final_val_loss, 100.0 * (s.final_val_loss - fp32_loss) / fp32_loss, secs);
    }
  }
  return 0;
}
