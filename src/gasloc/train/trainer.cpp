#include "gasloc/train/trainer.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/blas_threads.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/comm/gloo.hpp"
#include "gasloc/comm/inproc.hpp"
#include "gasloc/comm/rendezvous.hpp"
#include "gasloc/train/meeting.hpp"
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

namespace {
// What the ranks of this process share during a run.
struct RunState {
  const JobConfig& job;
  model::LlamaConfig mc;
  fs::path run_dir;
  int world = 1;
  bool quiet = false;
  int64_t start_step = 0, end_step = 0;
  MetricsLog* metrics = nullptr;
  Progress* progress = nullptr;
  Meeting* meeting = nullptr;
  std::chrono::steady_clock::time_point t0;
  int reporter = 0;      // the rank that fills `summary` (the lowest rank in this process)
  TrainSummary summary;
};

fs::path checkpoint_path(const fs::path& run_dir, int world, int rank) {
  return world == 1 ? run_dir / "checkpoint.pt" : run_dir / fmt::format("checkpoint-rank{}.pt", rank);
}

nlohmann::json checkpoint_meta(const RunState& s, int64_t step) {
  return {{"step", step}, {"model", model_json(s.mc)}, {"optim", s.job.optim.name}, {"algo", s.job.algo.name},
          {"world", s.world}};
}

// The worker loop of one rank: steps, metrics, evaluation, checkpoints, stopping.
void rank_loop(RunState& s, int rank, Worker& worker, comm::Communicator& comm) {
  const auto& job = s.job;
  const double tokens_per_step = static_cast<double>(job.data.batch_size * job.data.seq_len);
  auto say = [&](const std::string& line) {
    if (rank == 0 && !s.quiet) s.progress->println(line);
  };
  auto t_window = std::chrono::steady_clock::now();
  int64_t window_steps = 0, window_computed = 0;
  bool evaluated_last = false;
  int64_t step = s.start_step;
  while (step < s.end_step) {
    const StepResult r = worker.step();
    ++step;
    ++window_steps;
    window_computed += r.computed ? 1 : 0;
    if (rank == s.reporter) s.summary.train_losses.push_back(r.loss);
    if (!std::isfinite(r.loss))  // the parameters are now suspect: keep the last checkpoint
      throw Error(fmt::format("training loss of worker {} is {} at step {}", rank, r.loss, step),
                  "lower optim.lr or raise optim.warmup_steps; the last checkpoint is in " + s.run_dir.string());
    const auto stats = comm.stats();
    if (step % job.train.log_every == 0 || step == s.end_step) {
      const double dt = seconds_since(t_window);
      const double tps = tokens_per_step * static_cast<double>(window_computed) / std::max(dt, 1e-9);
      const double eta = dt / static_cast<double>(window_steps) * static_cast<double>(s.end_step - step);
      s.metrics->write({{"event", "train"}, {"step", step}, {"worker", rank}, {"train_loss", r.loss},
                        {"lr", r.lr}, {"computed", r.computed},
                        // A step skipped by its local-step budget had no gradient: null, not 0.
                        {"grad_norm", r.computed ? nlohmann::json(r.grad_norm) : nlohmann::json(nullptr)},
                        {"round_done", r.round_done}, {"tokens_per_s", tps},
                        {"wall_time_s", seconds_since(s.t0)}, {"virtual_time_s", comm.now()},
                        {"bytes_sent", stats.bytes_sent - s.meeting->own_bytes(rank)}, {"idle_s", stats.idle_s},
                        {"local_steps", worker.local_steps_done()}});
      if (rank == 0 && !s.quiet) s.progress->update(step, r.loss, tps * s.world, r.lr, eta);
      t_window = std::chrono::steady_clock::now();
      window_steps = 0;
      window_computed = 0;
    }
    evaluated_last = false;
    // Evaluation and checkpoint see the model x (GPA); one switch serves both, so that a resumed
    // run, which starts from the checkpoint's x, continues exactly as this one does.
    std::optional<optim::EvalScope> at_x;
    if ((job.train.eval_every > 0 && step % job.train.eval_every == 0) || step == job.train.steps) {
      at_x.emplace(&worker.optimizer());
      const EvalResult e = s.meeting->evaluate(rank, worker, step);
      evaluated_last = true;
      if (rank == s.reporter) s.summary.final_val_loss = e.val_loss;
      if (rank == 0) {
        s.metrics->write({{"event", "eval"}, {"step", step}, {"worker", rank}, {"val_loss", e.val_loss},
                          {"worker_val_loss", e.worker_val_loss}, {"consensus_distance", e.consensus_distance},
                          {"wall_time_s", seconds_since(s.t0)}, {"virtual_time_s", e.virtual_time_s},
                          {"bytes_sent", stats.bytes_sent - s.meeting->own_bytes(rank)}});
        say(s.world == 1 ? fmt::format("step {:>6} | val_loss {:.4f}", step, e.val_loss)
                         : fmt::format("step {:>6} | val_loss {:.4f} (average model) | consensus {:.3e}", step,
                                       e.val_loss, e.consensus_distance));
      }
    }
    const bool interrupted = s.meeting->should_stop(rank, step, g_stop.load()) && step < s.end_step;
    const bool stopping = interrupted || step == s.end_step;
    if ((job.train.checkpoint_every > 0 && step % job.train.checkpoint_every == 0) || stopping) {
      if (!at_x) at_x.emplace(&worker.optimizer());
      Checkpoint c;
      c.meta = checkpoint_meta(s, step);
      c.tensors = worker.state();
      save_checkpoint(checkpoint_path(s.run_dir, s.world, rank), c);
    }
    at_x.reset();
    if (interrupted) {
      say(fmt::format("interrupted: checkpoint written at step {}; continue with `gasloc train --resume {}`", step,
                      s.run_dir.string()));
      if (rank == s.reporter) s.summary.interrupted = true;
      break;
    }
  }
  if (rank == s.reporter) s.summary.steps_done = step;
  if (step == s.end_step && !evaluated_last) {  // stopped by train.stop_at between evaluations
    optim::EvalScope at_x(&worker.optimizer());
    const EvalResult e = s.meeting->evaluate(rank, worker, step);
    if (rank == s.reporter) s.summary.final_val_loss = e.val_loss;
  }
}
}  // namespace

TrainSummary run_training(const TrainRequest& req) {
  const JobConfig job = resolve_job(req);
  const fs::path run_dir = job.train.run_dir;
  if (job.train.threads > 0) torch::set_num_threads(static_cast<int>(job.train.threads));

  const data::Dataset dataset = data::Dataset::open(job.data.dir, job.data.vocab_size);
  const model::LlamaConfig mc = job.model.resolve(dataset.vocab_size);
  if (job.data.seq_len > mc.max_seq_len)
    throw ConfigError(fmt::format("data.seq_len {} exceeds the model's max_seq_len {}", job.data.seq_len, mc.max_seq_len),
                      "raise model.max_seq_len or lower data.seq_len");

  // Which ranks live in this process: all of them in-process, one under gloo.
  std::unique_ptr<comm::GlooCommunicator> gloo;
  if (job.cluster.backend == "gloo") {
    auto o = comm::gloo_options_from_env();
    o.timeout_s = job.cluster.timeout_s;
    if (job.network.throttle_gloo) {  // the scenario's links, for real: a token bucket per rank
      job.network.validate(o.world);
      o.bandwidth_limit_Bps = job.network.model(o.world).bandwidth(o.rank);
    }
    gloo = std::make_unique<comm::GlooCommunicator>(o);
    job.algo.validate(gloo->world());
  }
  const int world = gloo ? gloo->world() : static_cast<int>(job.cluster.workers);
  const comm::NetworkModel network = job.network.model(world);
  std::vector<int> ranks;
  if (gloo) ranks = {gloo->rank()};
  else for (int r = 0; r < world; ++r) ranks.push_back(r);
  const bool leader = ranks.front() == 0;

  // Load checkpoints before touching the run directory, so a bad resume changes nothing.
  std::map<int, Checkpoint> ckpts;
  for (int r : ranks) {
    const fs::path path = checkpoint_path(run_dir, world, r);
    if (!req.resume_dir.empty()) {
      Checkpoint c = load_checkpoint(path);
      if (c.meta.value("model", nlohmann::json{}) != model_json(mc))
        throw CheckpointError("checkpoint model " + c.meta["model"].dump() + " differs from the configured model " +
                                  model_json(mc).dump(),
                              "resume with the [model] settings the run was started with");
      if (c.meta.value("optim", std::string("adamw")) != job.optim.name)
        throw CheckpointError(fmt::format("checkpoint '{}' was written by the '{}' optimizer, not '{}'", path.string(),
                                          c.meta.value("optim", std::string("adamw")), job.optim.name),
                              "resume with the optim.name the run was started with; optimizer state is not converted");
      if (c.meta.value("world", 1) != world || c.meta.value("algo", std::string("none")) != job.algo.name)
        throw CheckpointError(fmt::format("checkpoint '{}' was written by {} worker(s) running '{}'", path.string(),
                                          c.meta.value("world", 1), c.meta.value("algo", std::string("none"))),
                              "resume with the cluster and algorithm the run was started with");
      ckpts.emplace(r, std::move(c));
    } else if (fs::exists(path)) {
      throw CheckpointError("run directory '" + run_dir.string() + "' already holds a checkpoint",
                            "continue it with --resume " + run_dir.string() + ", or choose another train.run_dir");
    }
  }
  const int64_t start_step = ckpts.empty() ? 0 : ckpts.begin()->second.meta.value("step", int64_t{0});
  for (const auto& [r, c] : ckpts)
    if (c.meta.value("step", int64_t{0}) != start_step)
      throw CheckpointError(fmt::format("the checkpoints in '{}' are from different steps", run_dir.string()),
                            "the run was stopped inconsistently; restore a consistent set of checkpoint files");

  if (leader) {
    nlohmann::json run_info = {{"config", job.to_json()},
                               {"model", model_json(mc)},
                               {"world", world},
                               {"seed", job.train.seed},
                               {"dataset", {{"dir", dataset.dir.string()}, {"tokenizer", dataset.tokenizer_kind},
                                            {"train_tokens", dataset.train->size()}, {"val_tokens", dataset.val->size()}}},
                               {"versions", {{"gasloc", "0.1.0"}, {"torch", TORCH_VERSION}}}};
    write_file_atomic(run_dir / "run.json", run_info.dump(2) + "\n");
    if (!req.quiet) print_config(job, mc);
  }
  // Only the leader drops the tail of a crashed run; the others append after it has.
  std::unique_ptr<MetricsLog> metrics;
  if (leader) metrics = std::make_unique<MetricsLog>(run_dir / "metrics.jsonl", ckpts.empty() ? -1 : start_step);
  if (gloo) gloo->barrier();
  if (!leader) metrics = std::make_unique<MetricsLog>(run_dir / "metrics.jsonl");
  const auto val_batches = data::validation_batches(*dataset.val, job.data.batch_size, job.data.seq_len, job.data.val_batches);

  // Communicators and workers.
  std::unique_ptr<comm::SingleRank> single;
  std::unique_ptr<comm::InProcCluster> cluster;
  std::vector<comm::Communicator*> comms;
  if (gloo) {
    comms = {gloo.get()};
  } else if (world == 1) {
    single = std::make_unique<comm::SingleRank>();
    comms = {single.get()};
  } else {
    cluster = std::make_unique<comm::InProcCluster>(world, network, job.cluster.timeout_s);
    for (int r = 0; r < world; ++r) comms.push_back(&cluster->comm(r));
  }
  // Workers that are threads of this process keep the cores busy themselves: by default one BLAS
  // thread each (core/blas_threads.hpp explains the spin this avoids).
  const BlasThreads blas(job.train.blas_threads > 0 ? static_cast<int>(job.train.blas_threads) : ranks.size() > 1 ? 1 : 0);
  if (blas.active() && !req.quiet)
    fmt::print("{} worker thread(s) in this process, {} BLAS thread(s) per product (train.blas_threads)\n", ranks.size(),
               job.train.blas_threads > 0 ? job.train.blas_threads : 1);
  std::vector<std::unique_ptr<Worker>> workers;
  for (size_t i = 0; i < ranks.size(); ++i) {
    workers.push_back(std::make_unique<Worker>(job, mc, dataset, *comms[i],
                                               algo::make_synchronizer(job.algo, world, job.train.seed, &network)));
    if (!ckpts.empty()) workers.back()->load_state(ckpts.at(ranks[i]).tensors);
  }
  if (!ckpts.empty() && leader && !req.quiet) fmt::print("resumed '{}' at step {}\n", run_dir.string(), start_step);
  if (leader) {  // what one worker keeps in memory besides the model, from the tensors it holds
    const Worker& w = *workers.front();
    const int64_t pbytes = w.numel() * 4;
    if (ckpts.empty())  // once per run, not again on resume
      metrics->write({{"event", "memory"}, {"step", start_step}, {"worker", ranks.front()}, {"optim", job.optim.name},
                    {"algo", job.algo.name}, {"params", w.numel()}, {"param_bytes", pbytes},
                    {"optimizer_state_bytes", w.optimizer_state_bytes()}, {"sync_state_bytes", w.sync_state_bytes()}});
    if (!req.quiet)
      fmt::print("state per worker: optimizer {:.1f} B/param, algorithm {:.1f} B/param (parameters {:.1f} MB fp32)\n",
                 static_cast<double>(w.optimizer_state_bytes()) / static_cast<double>(w.numel()),
                 static_cast<double>(w.sync_state_bytes()) / static_cast<double>(w.numel()), static_cast<double>(pbytes) / 1e6);
  }

  std::unique_ptr<Meeting> meeting;
  ThreadMeeting* threads_meeting = nullptr;
  if (gloo) {
    meeting = std::make_unique<CommMeeting>(*gloo, &val_batches, job.train.log_every);
  } else {
    std::vector<Worker*> ptrs;
    for (auto& w : workers) ptrs.push_back(w.get());
    auto tm = std::make_unique<ThreadMeeting>(ptrs, &val_batches, job.cluster.timeout_s);
    threads_meeting = tm.get();
    meeting = std::move(tm);
  }

  Progress progress(job.train.steps);
  RunState state{job, mc, run_dir, world, req.quiet, start_step,
                 job.train.stop_at > 0 ? job.train.stop_at : job.train.steps, metrics.get(), &progress, meeting.get(),
                 std::chrono::steady_clock::now(), 0, {}};
  state.reporter = ranks.front();
  state.summary.run_dir = run_dir.string();
  state.summary.final_val_loss = std::numeric_limits<double>::quiet_NaN();
  SignalScope signals;
  if (cluster) {
    // A failing worker wakes the others; its own error is the one reported.
    std::mutex first_mu;
    std::exception_ptr first;
    try {
      cluster->run([&](int r, comm::Communicator& c) {
        try {
          rank_loop(state, r, *workers[r], c);
        } catch (const std::exception& e) {
          {
            std::lock_guard<std::mutex> lock(first_mu);
            if (!first) first = std::current_exception();
          }
          threads_meeting->fail(fmt::format("worker {} failed: {}", r, e.what()));
          throw;
        }
      });
    } catch (...) {
      if (first) std::rethrow_exception(first);
      throw;
    }
  } else {
    rank_loop(state, ranks.front(), *workers.front(), *comms.front());
  }
  if (leader && !req.quiet) progress.finish();
  return state.summary;
}

}  // namespace gasloc::train
