#include "gasloc/train/trainer.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>
#include <unistd.h>

#include "gasloc/comm/cluster.hpp"
#include "gasloc/core/blas_threads.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/meeting.hpp"
#include "gasloc/train/metrics.hpp"
#include "gasloc/train/run.hpp"
#include "gasloc/train/worker.hpp"

namespace gasloc::train {
namespace fs = std::filesystem;

namespace {
std::atomic<bool> g_stop{false};

extern "C" void on_signal(int) {
  if (g_stop.exchange(true)) {
    // A second Ctrl+C: say why the process ends without its checkpoint, then end it.
    static const char msg[] = "\ngasloc train: second interrupt: exiting now without a checkpoint\n";
    [[maybe_unused]] auto n = ::write(2, msg, sizeof msg - 1);
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    std::raise(SIGINT);
  }
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

// What the ranks of this process share during a run.
struct RunState {
  const Run& run;
  const JobConfig& job;
  RunCheckpoints checkpoints;
  bool quiet = false;
  int64_t start_step = 0, end_step = 0;
  MetricsLog* metrics = nullptr;
  Progress* progress = nullptr;
  Meeting* meeting = nullptr;
  comm::Cluster* cluster = nullptr;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  int reporter = 0;                       // the rank that fills `summary` (the lowest rank in this process)
  std::map<int, Counters> base;           // each local rank's counters at the start of this invocation
  std::map<int, comm::CommStats> stats0;  // and its communicator's stats then
  std::map<int, double> clock0;
  std::map<int, int64_t> committed;       // each local rank's last committed step (-1: none)
  TrainSummary summary;

  Counters counters(int rank, const comm::Communicator& comm) const {
    const auto st = comm.stats();
    const Counters& b = base.at(rank);
    return {b.bytes_sent + st.bytes_sent - stats0.at(rank).bytes_sent,
            b.virtual_time_s + comm.now() - clock0.at(rank), b.wall_time_s + seconds_since(t0),
            b.idle_s + st.idle_s - stats0.at(rank).idle_s};
  }
  std::string last_checkpoint(int rank) const {
    const int64_t s = committed.at(rank);
    return s < 0 ? std::string("no checkpoint was committed yet")
                 : fmt::format("the last committed checkpoint is step {} (resume with `gasloc train --resume {}`)", s,
                               run.dir().string());
  }
  void say(int rank, const std::string& line) const {
    if (rank == 0 && !quiet) progress->println(line);
  }
};

// The point a step's evaluation and checkpoint see (GPA: the model x), entered at most once per
// step for both, so that a resumed run, which starts from the checkpoint's x, continues exactly
// as this one does.
class EvalPoint {
 public:
  explicit EvalPoint(Worker& w) : w_(w) {}
  void enter() {
    if (!scope_) scope_.emplace(&w_.optimizer());
  }

 private:
  Worker& w_;
  std::optional<optim::EvalScope> scope_;
};

// Train lines and the progress line: every train.log_every steps and at the last step.
class Logger {
 public:
  Logger(RunState& s, int rank, Worker& w, comm::Communicator& c) : s_(s), rank_(rank), w_(w), c_(c) {}
  bool due(int64_t step) const { return step % s_.job.train.log_every == 0 || step == s_.end_step; }
  void count(const StepResult& r) {
    ++steps_;
    computed_ += r.computed ? 1 : 0;
  }
  void write(int64_t step, const StepResult& r) {
    const double tokens_per_step = static_cast<double>(s_.job.data.batch_size * s_.job.data.seq_len);
    const double dt = seconds_since(window_);
    const double tps = tokens_per_step * static_cast<double>(computed_) / std::max(dt, 1e-9);
    const double eta = dt / static_cast<double>(steps_) * static_cast<double>(s_.end_step - step);
    const Counters c = s_.counters(rank_, c_);
    s_.metrics->write(TrainEvent{.step = step,
                                 .worker = rank_,
                                 .train_loss = r.loss,
                                 .lr = r.lr,
                                 .computed = r.computed,
                                 .grad_norm = r.computed ? std::optional(r.grad_norm) : std::nullopt,
                                 .round_done = r.round_done,
                                 .tokens_per_s = tps,
                                 .wall_time_s = c.wall_time_s,
                                 .virtual_time_s = c.virtual_time_s,
                                 .bytes_sent = c.bytes_sent,
                                 .idle_s = c.idle_s,
                                 .local_steps = w_.local_steps_done()});
    if (rank_ == 0 && !s_.quiet) s_.progress->update(step, r.loss, tps * s_.run.world(), r.lr, eta);
    window_ = std::chrono::steady_clock::now();
    steps_ = computed_ = 0;
  }

 private:
  RunState& s_;
  const int rank_;
  Worker& w_;
  comm::Communicator& c_;
  std::chrono::steady_clock::time_point window_ = std::chrono::steady_clock::now();
  int64_t steps_ = 0, computed_ = 0;  // in this window
};

// Evaluations of the average model: every train.eval_every steps and at train.steps.
class Evaluator {
 public:
  Evaluator(RunState& s, int rank, Worker& w, comm::Communicator& c) : s_(s), rank_(rank), w_(w), c_(c) {}
  bool due(int64_t step) const {
    return (s_.job.train.eval_every > 0 && step % s_.job.train.eval_every == 0) || step == s_.job.train.steps;
  }
  void run(int64_t step, EvalPoint& at) {
    at.enter();
    const EvalResult e = evaluate();
    if (rank_ != 0) return;
    const Counters c = s_.counters(rank_, c_);
    // The average model exists at the latest worker clock.
    const double vt = e.virtual_time_s - c_.now() + c.virtual_time_s;
    s_.metrics->write(EvalEvent{.step = step,
                                .worker = rank_,
                                .val_loss = e.val_loss,
                                .worker_val_loss = e.worker_val_loss,
                                .consensus_distance = e.consensus_distance,
                                .wall_time_s = c.wall_time_s,
                                .virtual_time_s = vt,
                                .bytes_sent = c.bytes_sent});
    s_.say(rank_, s_.run.world() == 1 ? fmt::format("step {:>6} | val_loss {:.4f}", step, e.val_loss)
                                      : fmt::format("step {:>6} | val_loss {:.4f} (average model) | consensus {:.3e}",
                                                    step, e.val_loss, e.consensus_distance));
  }
  // A run stopped by train.stop_at between evaluations still reports its model's val_loss.
  void finish() {
    optim::EvalScope at_x(&w_.optimizer());
    evaluate();
  }

 private:
  EvalResult evaluate() {
    const EvalResult e = s_.meeting->evaluate(s_.cluster->control(rank_), w_);
    if (rank_ == s_.reporter) s_.summary.final_val_loss = e.val_loss;
    return e;
  }
  RunState& s_;
  const int rank_;
  Worker& w_;
  comm::Communicator& c_;
};

// Checkpoints: every train.checkpoint_every steps and after the last step this invocation runs.
// Two-phase (checkpoint.hpp): every rank writes, they meet, each commits.
class Checkpointer {
 public:
  Checkpointer(RunState& s, int rank, Worker& w, comm::Communicator& c) : s_(s), rank_(rank), w_(w), c_(c) {}
  void maybe_save(int64_t step, bool last, EvalPoint& at) {
    if (!last && !(s_.job.train.checkpoint_every > 0 && step % s_.job.train.checkpoint_every == 0)) return;
    at.enter();
    Checkpoint c;
    c.meta = s_.run.meta().to_json();
    c.meta["step"] = step;
    c.meta["counters"] = s_.counters(rank_, c_).to_json();
    c.tensors = w_.state();
    s_.checkpoints.write(step, rank_, c);
    s_.cluster->control(rank_).barrier();  // every rank has written `step`
    s_.checkpoints.commit(step, rank_);
    s_.committed[rank_] = step;
  }

 private:
  RunState& s_;
  const int rank_;
  Worker& w_;
  comm::Communicator& c_;
};

// The worker loop of one rank.
void rank_loop(RunState& s, int rank, Worker& worker, comm::Communicator& comm) {
  Logger logger(s, rank, worker, comm);
  Evaluator evaluator(s, rank, worker, comm);
  Checkpointer checkpointer(s, rank, worker, comm);
  bool evaluated_last = false;
  int64_t step = s.start_step;
  while (step < s.end_step) {
    StepResult r;
    try {
      r = worker.step();
    } catch (const TrainingDiverged& e) {
      throw TrainingDiverged(e.what(), e.hint() + "; " + s.last_checkpoint(rank));
    }
    ++step;
    if (rank == s.reporter) s.summary.train_losses.push_back(r.loss);
    logger.count(r);
    if (logger.due(step)) logger.write(step, r);
    EvalPoint at_x(worker);
    evaluated_last = evaluator.due(step);
    if (evaluated_last) evaluator.run(step, at_x);
    const bool interrupted = s.meeting->should_stop(s.cluster->control(rank), step, g_stop.load()) && step < s.end_step;
    checkpointer.maybe_save(step, interrupted || step == s.end_step, at_x);
    if (interrupted) {
      s.say(rank, fmt::format("interrupted: checkpoint written at step {}; continue with `gasloc train --resume {}`{}",
                              step, s.run.dir().string(), s.job.cluster.backend == "inproc" ? "" : " under the same launcher"));
      if (rank == s.reporter) s.summary.interrupted = true;
      break;
    }
  }
  if (rank == s.reporter) s.summary.steps_done = step;
  if (step == s.end_step && !evaluated_last) evaluator.finish();  // stopped by train.stop_at between evaluations
}

// The metrics file of this invocation. Only the leader drops the tail of a crashed run (or all of
// a run that never reached a checkpoint); the others append after it has.
std::unique_ptr<MetricsLog> open_metrics(const Run& run, bool leader, bool resumed, int64_t start_step,
                                         comm::Communicator* processes) {
  const fs::path file = run.dir() / "metrics.jsonl";
  std::unique_ptr<MetricsLog> metrics;
  if (leader) {
    if (!resumed) fs::remove(file);
    metrics = std::make_unique<MetricsLog>(file, resumed ? start_step : -1);
  }
  if (processes) processes->barrier();
  if (!leader) metrics = std::make_unique<MetricsLog>(file);
  return metrics;
}

}  // namespace

TrainSummary run_training(const TrainRequest& req) {
  // From the start: a Ctrl+C during set-up must stop the run cleanly too, not kill it.
  SignalScope signals;
  JobConfig job = resolve_job(req);
  if (job.train.threads > 0) torch::set_num_threads(static_cast<int>(job.train.threads));

  const data::Dataset dataset = data::Dataset::open(job.data.dir, job.data.vocab_size, job.data.verify_shards);
  const model::LlamaConfig mc = job.model.resolve(dataset.vocab_size);  // data.seq_len fits: JobConfig::validate

  // Which ranks live in this process: all of them in-process, one per process otherwise.
  // cluster.timeout_s governs the rendezvous and every operation (gasloc launch --timeout sets
  // it); with network.throttle_gloo a process rank's real link is held to the scenario's.
  const auto cluster = comm::make_cluster({job.cluster.backend, static_cast<int>(job.cluster.workers),
                                           job.cluster.timeout_s, [&](int w) { return job.network.model(w); },
                                           job.network.throttle_gloo});
  const int world = cluster->world();
  job.algo.validate(world);
  // The thread plan: run.json records the stream count the run used (a resume keeps it).
  const bool auto_streams = job.train.streams == 0;
  job.train.streams = planned_streams(job.train.streams, job.train.device, job.data.batch_size, world,
                                      std::thread::hardware_concurrency());
  const Run run(job, mc, world);
  comm::Communicator* processes = cluster->processes();
  if (processes) agree_on_config(*processes, run.resolved());
  const comm::NetworkModel network = job.network.model(world);
  const std::vector<int>& ranks = cluster->local_ranks();
  const bool leader = ranks.front() == 0;

  // Load checkpoints before touching the run directory, so a bad resume changes nothing.
  RunCheckpoints ckpts(run.dir(), world);
  std::map<int, Checkpoint> loaded;
  int64_t start_step = 0;
  const auto committed = committed_by_rank(ckpts, world, ranks, processes);
  if (!req.resume_dir.empty()) {
    start_step = req.resume_step >= 0 ? req.resume_step : ckpts.resume_step(committed, ranks);
    for (int r : ranks) loaded.emplace(r, run.load(ckpts, start_step, r, committed[r]));
  } else {
    run.check_fresh(ckpts);
  }
  if (leader) {
    run.write_info(dataset);
    if (!req.quiet) run.print();
  }
  // Every rank's host needs the directory (under Gloo over several hosts each writes its own).
  fs::create_directories(run.dir());
  const auto metrics = open_metrics(run, leader, !loaded.empty(), start_step, processes);
  const auto val_batches = data::validation_batches(*dataset.val, job.data.batch_size, job.data.seq_len, job.data.val_batches);

  // Each local rank's counters where its checkpoint left them (zero for a new run). A resumed
  // in-process cluster continues its virtual clocks and counters itself: later prices depend on
  // the clocks, so only the wall time is left to add on top of them.
  std::map<int, Counters> base;
  std::map<int, bool> kept;  // the cluster keeps rank's counters itself
  for (int r : ranks) {
    Counters k = loaded.empty() ? Counters{} : Counters::from_json(loaded.at(r).meta.value("counters", nlohmann::json::object()));
    kept[r] = cluster->restore(r, k.virtual_time_s, {k.bytes_sent, 0, k.idle_s});
    if (kept[r]) k = {0, 0, k.wall_time_s, 0};
    base[r] = k;
  }
  // Workers that are threads of this process keep the cores busy themselves: by default one BLAS
  // thread each (core/blas_threads.hpp explains the spin this avoids).
  // Batch streams (train.streams) are such threads too.
  const bool threaded = ranks.size() > 1 || job.train.streams > 1;
  const BlasThreads blas(job.train.blas_threads > 0 ? static_cast<int>(job.train.blas_threads) : threaded ? 1 : 0);
  if (blas.active() && !req.quiet)
    fmt::print("{} worker thread(s) in this process{}, {} BLAS thread(s) per product (train.blas_threads)\n", ranks.size(),
               job.train.streams > 1 ? fmt::format(" with {} batch streams each (train.streams{})", job.train.streams,
                                                   auto_streams ? " = 0: one per core for a worker alone" : "")
                                     : "",
               job.train.blas_threads > 0 ? job.train.blas_threads : 1);
  // LibTorch's OpenMP threads spin between operations on the cores OpenBLAS's own threads need.
  if (leader && !req.quiet && job.train.device == "cpu" && job.train.threads > 1 && !blas.active())
    fmt::print("warning: train.threads = {} beside OpenBLAS's own threads: the two pools compete for the cores (3x to 5x "
               "fewer tokens/s measured at the tiny and micro presets on 2 cores, docs/performance.md); leave "
               "train.threads at 0, or set train.blas_threads = 1\n",
               job.train.threads);
  std::vector<std::unique_ptr<Worker>> workers;
  for (size_t i = 0; i < ranks.size(); ++i) {
    workers.push_back(std::make_unique<Worker>(job, mc, dataset, cluster->comm(ranks[i]),
                                               algo::make_synchronizer(job.algo, world, job.train.seed, &network)));
    if (!loaded.empty()) workers.back()->load_state(loaded.at(ranks[i]).tensors);
  }
  if (!loaded.empty() && leader && !req.quiet) fmt::print("resumed '{}' at step {}\n", run.dir().string(), start_step);
  if (leader) {  // what one worker keeps in memory besides the model, from the tensors it holds
    const Worker& w = *workers.front();
    const int64_t pbytes = w.numel() * 4;
    if (loaded.empty())  // once per run, not again on resume
      metrics->write(MemoryEvent{.step = start_step,
                                 .worker = ranks.front(),
                                 .optim = job.optim.name,
                                 .algo = job.algo.name,
                                 .params = w.numel(),
                                 .param_bytes = pbytes,
                                 .optimizer_state_bytes = w.optimizer_state_bytes(),
                                 .sync_state_bytes = w.sync_state_bytes()});
    if (!req.quiet)
      fmt::print("state per worker: optimizer {:.1f} B/param, algorithm {:.1f} B/param (parameters {:.1f} MB fp32)\n",
                 static_cast<double>(w.optimizer_state_bytes()) / static_cast<double>(w.numel()),
                 static_cast<double>(w.sync_state_bytes()) / static_cast<double>(w.numel()), static_cast<double>(pbytes) / 1e6);
  }

  Meeting meeting(&val_batches, static_cast<int>(ranks.size()), world, job.train.log_every);
  Progress progress(job.train.steps);
  RunState state{run, job, ckpts, req.quiet, start_step, job.train.stop_at > 0 ? job.train.stop_at : job.train.steps,
                 metrics.get(), &progress, &meeting, cluster.get()};
  state.reporter = ranks.front();
  state.summary.run_dir = run.dir().string();
  state.summary.final_val_loss = std::numeric_limits<double>::quiet_NaN();
  for (int r : ranks) {
    state.base[r] = base.at(r);
    // The cluster's restored counters are the run's own; otherwise they start from here.
    state.stats0[r] = kept[r] ? comm::CommStats{} : cluster->comm(r).stats();
    state.clock0[r] = kept[r] ? 0.0 : cluster->comm(r).now();
    state.committed[r] = committed[r].empty() ? -1 : committed[r].front();
  }
  std::map<int, Worker*> by_rank;
  for (size_t i = 0; i < ranks.size(); ++i) by_rank[ranks[i]] = workers[i].get();
  cluster->run([&](int r, comm::Communicator& c) { rank_loop(state, r, *by_rank.at(r), c); });
  if (leader && !req.quiet) progress.finish();
  return state.summary;
}

}  // namespace gasloc::train
