#include "gasloc/train/trainer.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <filesystem>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/metrics.hpp"
#include "gasloc/train/worker.hpp"

namespace gasloc::train {
namespace fs = std::filesystem;

namespace {
std::atomic<bool> g_stop{false};

extern "C" void on_signal(int) {
  g_stop.store(true);
  // A second Ctrl+C kills the process the ordinary way.
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

// Installs the stop handler for the duration of a run and restores the previous one.
struct SignalScope {
  void (*prev_int)(int);
  void (*prev_term)(int);
  SignalScope() {
    g_stop.store(false);
    prev_int = std::signal(SIGINT, on_signal);
    prev_term = std::signal(SIGTERM, on_signal);
  }
  ~SignalScope() {
    std::signal(SIGINT, prev_int);
    std::signal(SIGTERM, prev_term);
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

JobConfig resolve_job(const TrainRequest& req) {
  if (req.resume_dir.empty()) return load_job(req.config_path, req.overrides);
  if (!req.config_path.empty())
    throw ConfigError("--resume takes the configuration from RUN/run.json; do not pass --config too",
                      "use --resume RUN [--set key=value ...] to change settings such as train.steps");
  const fs::path run_json = fs::path(req.resume_dir) / "run.json";
  if (!fs::exists(run_json))
    throw CheckpointError("'" + req.resume_dir + "' is not a gasloc run directory (no run.json)",
                          "pass the run_dir of an earlier `gasloc train`");
  auto doc = nlohmann::json::parse(read_file(run_json), nullptr, false);
  if (doc.is_discarded() || !doc.contains("config")) throw CheckpointError("corrupt '" + run_json.string() + "'");
  // A resumed run goes on to train.steps unless told again; the user's --set come last and win.
  std::vector<std::string> overrides = {"train.run_dir=" + req.resume_dir, "train.stop_at=0"};
  overrides.insert(overrides.end(), req.overrides.begin(), req.overrides.end());
  return job_from_json(doc["config"], overrides);
}

void print_config(const JobConfig& job, const model::LlamaConfig& mc) {
  fmt::print("gasloc train: resolved configuration\n");
  const nlohmann::json resolved = job.to_json();
  for (auto& [section, values] : resolved.items()) {
    fmt::print("  [{}]\n", section);
    for (auto& [k, v] : values.items()) fmt::print("    {} = {}\n", k, v.dump());
  }
  fmt::print("  model: dim {} layers {} heads {}/{} ffn {} vocab {} -> {:.2f}M parameters\n", mc.dim, mc.n_layers,
             mc.n_heads, mc.n_kv_heads, mc.ffn_hidden(), mc.vocab_size, static_cast<double>(mc.num_params()) / 1e6);
  std::fflush(stdout);
}

nlohmann::json model_json(const model::LlamaConfig& c) {
  return {{"dim", c.dim},           {"n_layers", c.n_layers},       {"n_heads", c.n_heads},
          {"n_kv_heads", c.n_kv_heads}, {"vocab_size", c.vocab_size}, {"ffn_hidden", c.ffn_hidden()},
          {"rope_theta", c.rope_theta}, {"max_seq_len", c.max_seq_len}, {"tie_embeddings", c.tie_embeddings},
          {"norm_eps", c.norm_eps},   {"num_params", c.num_params()}};
}
}  // namespace

void request_stop() { g_stop.store(true); }

TrainSummary run_training(const TrainRequest& req) {
  const JobConfig job = resolve_job(req);
  const fs::path run_dir = job.train.run_dir;
  const fs::path ckpt_path = run_dir / "checkpoint.pt";
  if (job.train.threads > 0) torch::set_num_threads(static_cast<int>(job.train.threads));

  const data::Dataset dataset = data::Dataset::open(job.data.dir, job.data.vocab_size);
  const model::LlamaConfig mc = job.model.resolve(dataset.vocab_size);
  if (job.data.seq_len > mc.max_seq_len)
    throw ConfigError(fmt::format("data.seq_len {} exceeds the model's max_seq_len {}", job.data.seq_len, mc.max_seq_len),
                      "raise model.max_seq_len or lower data.seq_len");

  // Load the checkpoint before touching the run directory, so a bad resume changes nothing.
  std::optional<Checkpoint> ckpt;
  if (!req.resume_dir.empty()) {
    ckpt = load_checkpoint(ckpt_path);
    if (ckpt->meta.value("model", nlohmann::json{}) != model_json(mc))
      throw CheckpointError("checkpoint model " + ckpt->meta["model"].dump() + " differs from the configured model " +
                                model_json(mc).dump(),
                            "resume with the [model] settings the run was started with");
  } else if (fs::exists(ckpt_path)) {
    throw CheckpointError("run directory '" + run_dir.string() + "' already holds a checkpoint",
                          "continue it with --resume " + run_dir.string() + ", or choose another train.run_dir");
  }

  nlohmann::json run_info = {{"config", job.to_json()},
                             {"model", model_json(mc)},
                             {"seed", job.train.seed},
                             {"dataset", {{"dir", dataset.dir.string()}, {"tokenizer", dataset.tokenizer_kind},
                                          {"train_tokens", dataset.train->size()}, {"val_tokens", dataset.val->size()}}},
                             {"versions", {{"gasloc", "0.1.0"}, {"torch", TORCH_VERSION}}}};
  write_file_atomic(run_dir / "run.json", run_info.dump(2) + "\n");
  if (!req.quiet) print_config(job, mc);

  comm::SingleRank comm;
  Worker worker(job, mc, dataset, comm, algo::make_synchronizer(job.algo, comm.world(), job.train.seed));
  const int64_t start_step = ckpt ? ckpt->meta.value("step", int64_t{0}) : 0;
  if (ckpt) {
    worker.load_state(ckpt->tensors);
    if (!req.quiet) fmt::print("resumed '{}' at step {}\n", run_dir.string(), start_step);
  }
  MetricsLog metrics(run_dir / "metrics.jsonl", ckpt ? start_step : -1);
  const auto val_batches = data::validation_batches(*dataset.val, job.data.batch_size, job.data.seq_len, job.data.val_batches);

  const int64_t end_step = job.train.stop_at > 0 ? job.train.stop_at : job.train.steps;
  const double tokens_per_step = static_cast<double>(job.data.batch_size * job.data.seq_len);
  auto save = [&](int64_t step) {
    Checkpoint c;
    c.meta = {{"step", step}, {"model", model_json(mc)}, {"optim", job.optim.name}, {"algo", job.algo.name}};
    c.tensors = worker.state();
    save_checkpoint(ckpt_path, c);
  };
  Progress progress(job.train.steps);
  auto say = [&](const std::string& line) {
    if (!req.quiet) progress.println(line);
  };

  SignalScope signals;
  TrainSummary summary;
  summary.run_dir = run_dir.string();
  const auto t0 = std::chrono::steady_clock::now();
  auto t_window = t0;
  int64_t window_steps = 0;
  double last_val = std::numeric_limits<double>::quiet_NaN();
  int64_t step = start_step;
  while (step < end_step) {
    const StepResult r = worker.step();
    ++step;
    ++window_steps;
    summary.train_losses.push_back(r.loss);
    if (!std::isfinite(r.loss)) {  // the parameters are now suspect: keep the last checkpoint
      throw Error(fmt::format("training loss is {} at step {}", r.loss, step),
                  "lower optim.lr or raise optim.warmup_steps; the last checkpoint is in " + run_dir.string());
    }
    if (step % job.train.log_every == 0 || step == end_step) {
      const double dt = seconds_since(t_window);
      const double tps = tokens_per_step * static_cast<double>(window_steps) / std::max(dt, 1e-9);
      const double eta = dt / static_cast<double>(window_steps) * static_cast<double>(end_step - step);
      metrics.write({{"event", "train"}, {"step", step}, {"worker", comm.rank()}, {"train_loss", r.loss},
                     {"lr", r.lr}, {"grad_norm", r.grad_norm}, {"tokens_per_s", tps},
                     {"wall_time_s", seconds_since(t0)}, {"virtual_time_s", comm.now()},
                     {"bytes_sent", comm.stats().bytes_sent}, {"idle_s", comm.stats().idle_s}});
      if (!req.quiet) progress.update(step, r.loss, tps, r.lr, eta);
      t_window = std::chrono::steady_clock::now();
      window_steps = 0;
    }
    const bool last = step == job.train.steps;
    if ((job.train.eval_every > 0 && step % job.train.eval_every == 0) || last) {
      last_val = worker.evaluate(val_batches);
      metrics.write({{"event", "eval"}, {"step", step}, {"worker", comm.rank()}, {"val_loss", last_val},
                     {"wall_time_s", seconds_since(t0)}, {"virtual_time_s", comm.now()}});
      say(fmt::format("step {:>6} | val_loss {:.4f}", step, last_val));
    }
    const bool stopping = g_stop.load() || step == end_step;
    if ((job.train.checkpoint_every > 0 && step % job.train.checkpoint_every == 0) || stopping) {
      save(step);
      if (g_stop.load()) {
        say(fmt::format("interrupted: checkpoint written at step {}; continue with `gasloc train --resume {}`", step,
                        run_dir.string()));
        summary.interrupted = true;
        break;
      }
    }
  }
  if (!req.quiet) progress.finish();
  summary.steps_done = step;
  summary.final_val_loss = last_val;
  if (!summary.interrupted && std::isnan(last_val)) summary.final_val_loss = worker.evaluate(val_batches);
  return summary;
}

}  // namespace gasloc::train
