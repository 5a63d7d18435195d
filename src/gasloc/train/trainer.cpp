#include "gasloc/train/trainer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>
#include <unistd.h>

#include "gasloc/algo/registry.hpp"
#include "gasloc/comm/cluster.hpp"
#include "gasloc/core/blas_threads.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/interrupt.hpp"
#include "gasloc/train/elastic_process.hpp"
#include "gasloc/train/meeting.hpp"
#include "gasloc/train/metrics.hpp"
#include "gasloc/train/run.hpp"
#include "gasloc/train/run_lock.hpp"
#include "gasloc/train/worker.hpp"

namespace gasloc::train {
namespace fs = std::filesystem;

namespace {
std::atomic<bool> g_stop{false};

extern "C" void on_signal(int) {
  request_interrupt();  // a rendezvous or store call blocked on others gives way too
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
    clear_interrupt();
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
  ElasticProcess* elastic = nullptr;             // an elastic Gloo rank: no collective over all ranks
  const std::vector<data::Batch>* val = nullptr;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  int reporter = 0;                       // the rank that fills `summary` (the lowest rank in this process)
  std::map<int, Counters> base;           // each local rank's counters at the start of this invocation
  std::map<int, comm::CommStats> stats0;  // and its communicator's stats then
  std::map<int, double> clock0;
  double eval_price_s = 0;                // what one evaluation of the average model costs on the virtual clock
  std::map<int, double> eval_time;        // each local rank's evaluations so far in this invocation, priced
  std::map<int, int64_t> committed;       // each local rank's last committed step (-1: none)
  TrainSummary summary;

  // `compute_wall_s`: the rank's wall seconds of computing in this invocation, its compute time
  // where the clock is real.
  Counters counters(int rank, const comm::Communicator& comm, double compute_wall_s) const {
    const auto st = comm.stats();
    const Counters& b = base.at(rank);
    return {b.bytes_sent + st.bytes_sent - stats0.at(rank).bytes_sent,
            b.virtual_time_s + comm.now() - clock0.at(rank),
            b.wall_time_s + seconds_since(t0),
            b.idle_s + st.idle_s - stats0.at(rank).idle_s,
            b.eval_time_s + eval_time.at(rank),
            b.compute_s + (comm.virtual_clock() ? st.compute_s - stats0.at(rank).compute_s : compute_wall_s)};
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
    const Counters c = s_.counters(rank_, c_, w_.compute_wall_s());
    const double clock = c_.virtual_clock() ? c.virtual_time_s : c.wall_time_s;
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
                                 .local_steps = w_.local_steps_done(),
                                 .eval_time_s = c.eval_time_s,
                                 .compute_s = c.compute_s,
                                 .utilization = clock > 0 ? c.compute_s / clock : 0.0});
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
    write(step, evaluate(step));
  }
  // A run stopped by train.stop_at between evaluations still evaluates and reports its model at
  // that step (in metrics.jsonl too: a resumed run keeps the line, as history).
  void finish(int64_t step) {
    optim::EvalScope at_x(&w_.optimizer());
    write(step, evaluate(step));
  }

 private:
  void write(int64_t step, const EvalResult& e) {
    if (!e.reports) return;
    const Counters c = s_.counters(rank_, c_, w_.compute_wall_s());
    // The average model exists at the latest worker clock.
    const double vt = e.virtual_time_s - c_.now() + c.virtual_time_s;
    s_.metrics->write(EvalEvent{.step = step,
                                .worker = rank_,
                                .val_loss = e.val_loss,
                                .worker_val_loss = e.worker_val_loss,
                                .consensus_distance = e.consensus_distance,
                                .wall_time_s = c.wall_time_s,
                                .virtual_time_s = vt,
                                .bytes_sent = c.bytes_sent,
                                .members = {e.members.begin(), e.members.end()},
                                .eval_time_s = c.eval_time_s});
    if (s_.elastic) s_.say(rank_, fmt::format("step {:>6} | val_loss {:.4f} (worker {}'s own model)", step, e.val_loss, rank_));
    else
      s_.say(rank_, s_.run.world() == 1 ? fmt::format("step {:>6} | val_loss {:.4f}", step, e.val_loss)
                                        : fmt::format("step {:>6} | val_loss {:.4f} (average model) | consensus {:.3e}",
                                                      step, e.val_loss, e.consensus_distance));
  }
  EvalResult evaluate(int64_t step) {
    if (s_.elastic) {  // an elastic Gloo rank: its own model, no collective
      const EvalResult e = s_.elastic->evaluate(w_, *s_.val);
      s_.summary.final_val_loss = e.val_loss;
      return e;
    }
    const EvalResult e = s_.meeting->evaluate(s_.cluster->control(rank_), w_, step);
    s_.eval_time.at(rank_) += s_.eval_price_s;
    // The average reaches every rank; a local mean only the rank that reports it.
    if (s_.job.train.eval_model == "local" ? e.reports : rank_ == s_.reporter) s_.summary.final_val_loss = e.val_loss;
    return e;
  }
  RunState& s_;
  const int rank_;
  Worker& w_;
  comm::Communicator& c_;
};

// Elastic runs: a round whose membership changed (a death at its merge, a joiner healed) goes to
// metrics and the terminal, from the lowest survivor.
void report_view(RunState& s, int rank, const std::optional<algo::View>& v, comm::Communicator& c, int64_t step) {
  if (!v) return;
  const auto survivors = v->survivors();
  if (survivors.empty() || survivors.front() != rank) return;
  auto ids = [](const std::vector<int>& x) { return std::vector<int64_t>(x.begin(), x.end()); };
  std::vector<int> died = v->dying;  // at this round's merge (in-process), or since the last round (processes)
  died.insert(died.end(), v->left.begin(), v->left.end());
  std::vector<int64_t> joined_incarnations;
  if (!v->incarnation.empty())
    for (int j : v->joining) joined_incarnations.push_back(v->incarnation.at(j));
  s.metrics->write(ViewEvent{.step = step,
                             .worker = rank,
                             .round = v->round,
                             .members = ids(v->members),
                             .died = ids(died),
                             .joined = ids(v->joining),
                             .virtual_time_s = c.now() - s.clock0.at(rank) + s.base.at(rank).virtual_time_s,
                             .joined_incarnations = joined_incarnations});
  if (s.quiet) return;
  std::string line = fmt::format("step {:>6} | round {}: {} workers in the view", step, v->round, v->members.size());
  if (!v->dying.empty()) line += fmt::format(", worker(s) {} died (their partners mixed without them)", fmt::join(v->dying, ", "));
  if (!v->left.empty()) line += fmt::format(", worker(s) {} left (died since the round before)", fmt::join(v->left, ", "));
  for (int j : v->joining) line += fmt::format(", worker {} joined (state from worker {})", j, v->donor(j));
  s.progress->println(line);
}

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
    c.meta["counters"] = s_.counters(rank_, c_, w_.compute_wall_s()).to_json();
    c.tensors = w_.state();
    s_.checkpoints.write(step, rank_, c);
    // Every rank has written `step`; an elastic rank commits its own (no rank waits for another).
    if (!s_.elastic) s_.cluster->control(rank_).barrier();
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
    report_view(s, rank, r.view_change, comm, step);
    EvalPoint at_x(worker);
    evaluated_last = evaluator.due(step);
    if (evaluated_last) evaluator.run(step, at_x);
    const bool interrupted = (s.elastic ? s.elastic->should_stop(step, g_stop.load())
                                        : s.meeting->should_stop(s.cluster->control(rank), step, g_stop.load())) &&
                             step < s.end_step;
    checkpointer.maybe_save(step, interrupted || step == s.end_step, at_x);
    if (interrupted) {
      s.say(rank, fmt::format("interrupted: checkpoint written at step {}; continue with `gasloc train --resume {}`{}",
                              step, s.run.dir().string(), s.job.cluster.backend == "inproc" ? "" : " under the same launcher"));
      if (rank == s.reporter) s.summary.interrupted = true;
      break;
    }
  }
  if (rank == s.reporter) s.summary.steps_done = step;
  if (step == s.end_step && !evaluated_last) evaluator.finish(step);  // stopped by train.stop_at between evaluations
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

namespace {

// The job this process presents to the rendezvous store: --job-id (gasloc launch's token, or a
// `gasloc store`'s job), or, for ranks started by hand, one derived from train.run_dir as given
// (the one thing every rank of a job shares that two jobs on one host cannot). Not from every
// setting: ranks of one job whose settings differ must meet, so that agree_on_config names the
// key that differs.
comm::JobIdentity job_identity(const TrainRequest& req, const JobConfig& job) {
  if (!req.job_id.empty()) return {req.job_id, "--job-id " + req.job_id};
  return {comm::derive_job_token("gasloc train run_dir=" + job.train.run_dir), "gasloc train run_dir=" + job.train.run_dir};
}

std::unique_ptr<comm::Cluster> open_cluster(const TrainRequest& req, const JobConfig& job) {
  // cluster.timeout_s governs the rendezvous and every operation (gasloc launch --timeout sets
  // it); with network.throttle_gloo a process rank's real link is held to the scenario's.
  comm::ClusterOptions o{job.cluster.backend, static_cast<int>(job.cluster.workers), job.cluster.timeout_s,
                         [&job](int w) { return job.network.model(w); }, job.network.throttle_gloo};
  o.job = job_identity(req, job);
  o.handed_in = !req.job_id.empty();
  o.store_all_interfaces = job.cluster.store_all_interfaces;
  o.elastic = job.cluster.elastic;
  o.heartbeat_timeout_s = job.cluster.heartbeat_timeout_s;
  o.incarnation = req.incarnation;
  o.join = job.cluster.join;
  return comm::make_cluster(o);
}

// Every rank's committed steps as one list for a message: "rank 0: 40, 30; rank 1: 30".
std::string committed_text(const std::vector<std::vector<int64_t>>& committed) {
  std::string out;
  for (size_t r = 0; r < committed.size(); ++r)
    out += fmt::format("{}rank {}: {}", r ? "; " : "", r,
                       committed[r].empty() ? std::string("none") : fmt::format("{}", fmt::join(committed[r], ", ")));
  return out;
}

// --resume-step: a step some rank committed (its commit proves that every rank wrote it).
int64_t checked_resume_step(int64_t step, const std::vector<std::vector<int64_t>>& committed) {
  for (const auto& c : committed)
    if (std::find(c.begin(), c.end(), step) != c.end()) return step;
  throw CheckpointError(fmt::format("--resume-step {} is not a committed checkpoint of this run (committed: {})", step,
                                    committed_text(committed)),
                        "give one of the committed steps");
}

// --repair: the newest step every rank still holds once the damaged ones are dropped.
int64_t common_step(const std::vector<std::vector<int64_t>>& committed, const Run& run) {
  for (int64_t s : committed.front())
    if (std::all_of(committed.begin(), committed.end(), [s](const auto& c) { return std::find(c.begin(), c.end(), s) != c.end(); }))
      return s;
  throw CheckpointError(fmt::format("no step of '{}' is held by every rank after the repair (committed: {})",
                                    run.dir().string(), committed_text(committed)),
                        "the run cannot continue as it was; start it again in a new train.run_dir");
}

// Where a new run starts, or a resumed one continues, and what it loads. A directory whose run
// died during its first checkpoint (files written, nothing committed) starts over.
int64_t prepare_start(const TrainRequest& req, const Run& run, const RunCheckpoints& ckpts, const std::vector<int>& ranks,
                      const std::vector<std::vector<int64_t>>& committed, comm::Communicator* processes,
                      std::map<int, Checkpoint>& loaded, bool elastic) {
  if (!req.resume_dir.empty()) {
    const int64_t step = req.resume_step >= 0 ? checked_resume_step(req.resume_step, committed)
                         : req.repair         ? common_step(committed, run)
                                              : ckpts.resume_step(committed, ranks);
    for (int r : ranks) loaded.emplace(r, run.load(ckpts, step, r, committed[r]));
    int64_t newest = -1;
    for (const auto& c : committed)
      if (!c.empty()) newest = std::max(newest, c.front());
    if (newest > step && ranks.front() == 0 && !req.quiet)
      fmt::print("resuming '{}' at step {}: its committed step {} is dropped at this run's first checkpoint (steps {}..{} "
                 "are trained again)\n",
                 run.dir().string(), step, newest, step + 1, newest);
    return step;
  }
  const bool nothing_committed = std::all_of(committed.begin(), committed.end(), [](const auto& c) { return c.empty(); });
  // An elastic rank looks at its own files only: peers that started before it may train already.
  const std::vector<int>* own = elastic ? &ranks : nullptr;
  if (nothing_committed && ckpts.any(own)) {
    for (int r : ranks) ckpts.discard_uncommitted(r);
    if (processes) processes->barrier();  // every rank's files are gone before anyone looks
    if (ranks.front() == 0 && !req.quiet)
      fmt::print("'{}' holds no committed checkpoint (its run stopped during its first one): starting over\n",
                 run.dir().string());
  }
  run.check_fresh(ckpts, own);
  return 0;
}

// The BLAS threads of one product (train.blas_threads when set). Workers that are threads of
// this process keep the cores busy themselves: one each (core/blas_threads.hpp explains the spin
// this avoids); batch streams are such threads too. Processes of one job on one host share its
// cores: each takes its share, instead of OpenBLAS's default of every core (4 Gloo ranks on 2
// cores ran 1.16x slower so, docs/performance.md). 0: OpenBLAS's own count.
int planned_blas_threads(const JobConfig& job, int local_workers, int host_processes) {
  if (job.train.blas_threads > 0) return static_cast<int>(job.train.blas_threads);
  if (local_workers > 1 || job.train.streams > 1) return 1;
  if (host_processes > 1) return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / host_processes);
  return 0;
}

void print_thread_plan(const JobConfig& job, int local_workers, int host_processes, bool auto_streams) {
  const std::string blas = job.train.blas_threads > 0 ? fmt::format("{} BLAS thread(s) per product (train.blas_threads)",
                                                                    job.train.blas_threads)
                                                      : fmt::format("{} BLAS thread(s) per product",
                                                                    planned_blas_threads(job, local_workers, host_processes));
  if (host_processes > 1 && local_workers == 1 && job.train.streams == 1) {
    fmt::print("{} processes of this job on this host (LOCAL_WORLD_SIZE) share its {} cores: {} each{}\n", host_processes,
               std::thread::hardware_concurrency(), blas, job.train.blas_threads > 0 ? "" : " (train.blas_threads overrides)");
    return;
  }
  fmt::print("{} worker thread(s) in this process{}, {}\n", local_workers,
             job.train.streams > 1 ? fmt::format(" with {} batch streams each (train.streams{})", job.train.streams,
                                                 auto_streams ? " = 0: one per core for a worker alone" : "")
                                   : "",
             blas);
}

// LibTorch's OpenMP threads spin between operations on the cores OpenBLAS's own threads need.
void warn_two_pools(const JobConfig& job) {
  fmt::print("warning: train.threads = {} beside OpenBLAS's own threads: the two pools compete for the cores (3x to 5x "
             "fewer tokens/s measured at the tiny and micro presets on 2 cores, docs/performance.md); leave "
             "train.threads at 0, or set train.blas_threads = 1\n",
             job.train.threads);
}

// What one worker keeps in memory besides the model, from the tensors it holds: in metrics once
// per run (not again on resume), and on the terminal.
void report_worker_memory(const Worker& w, const JobConfig& job, MetricsLog& metrics, int rank, int64_t step, bool resumed,
                          bool quiet) {
  const int64_t pbytes = w.numel() * 4;
  if (!resumed)
    metrics.write(MemoryEvent{.step = step,
                              .worker = rank,
                              .optim = job.optim.name,
                              .algo = job.algo.name,
                              .params = w.numel(),
                              .param_bytes = pbytes,
                              .optimizer_state_bytes = w.optimizer_state_bytes(),
                              .sync_state_bytes = w.sync_state_bytes()});
  if (!quiet)
    fmt::print("state per worker: optimizer {:.1f} B/param, algorithm {:.1f} B/param (parameters {:.1f} MB fp32)\n",
               static_cast<double>(w.optimizer_state_bytes()) / static_cast<double>(w.numel()),
               static_cast<double>(w.sync_state_bytes()) / static_cast<double>(w.numel()), static_cast<double>(pbytes) / 1e6);
}

}  // namespace

namespace {

// An elastic Gloo rank's helper, when this process is one (nullptr otherwise).
std::unique_ptr<ElasticProcess> elastic_process(comm::Cluster& cluster, const JobConfig& job) {
  comm::ElasticRoster* roster = cluster.elastic_roster();
  if (!roster) return nullptr;
  const int64_t steps_per_round = algo::algorithm(job.algo.name).has_rounds ? job.algo.H : 1;
  return std::make_unique<ElasticProcess>(*roster, cluster.world(), steps_per_round, job.cluster.timeout_s);
}

// The run files of an elastic Gloo rank: the first rank to claim them (any id: rank 0 may have died
// starting) writes run.json and starts metrics.jsonl (for a fresh run, dropping an old one; for a
// resumed one, the tail after the agreed step); every other rank, and every rank restarted later,
// appends once it has.
std::unique_ptr<MetricsLog> open_elastic_files(const Run& run, const data::Dataset& dataset, ElasticProcess& e,
                                               bool resumed, int64_t start_step) {
  const fs::path file = run.dir() / "metrics.jsonl";
  if (!e.claim_files()) {
    run.write_info(dataset);  // every host's run directory can be read back and resumed on its own
    return std::make_unique<MetricsLog>(file);
  }
  run.write_info(dataset);
  if (!resumed) fs::remove(file);
  auto metrics = std::make_unique<MetricsLog>(file, resumed ? start_step : -1);
  e.files_ready();
  return metrics;
}

// Each local rank's counters where its checkpoint left them (zero for a new run). A resumed
// in-process cluster continues its virtual clocks and counters itself: later prices depend on
// the clocks, so only the wall time is left to add on top of them.
void restore_counters(RunState& state, comm::Cluster& cluster, const std::map<int, Checkpoint>& loaded,
                      const std::map<int, int64_t>& committed) {
  auto counters = [](const Checkpoint& c) { return Counters::from_json(c.meta.value("counters", nlohmann::json::object())); };
  // A worker beyond those that saved the run arrives at the latest clock among them, with no history.
  Counters arriving;
  for (const auto& [r, c] : loaded) {
    const Counters k = counters(c);
    arriving.virtual_time_s = std::max(arriving.virtual_time_s, k.virtual_time_s);
    arriving.wall_time_s = std::max(arriving.wall_time_s, k.wall_time_s);
  }
  for (int r : cluster.local_ranks()) {
    Counters k = loaded.contains(r) ? counters(loaded.at(r)) : arriving;
    const bool kept = cluster.restore(r, k.virtual_time_s, {k.bytes_sent, 0, k.idle_s, k.compute_s});
    if (kept) k = {0, 0, k.wall_time_s, 0, k.eval_time_s, 0};
    state.base[r] = k;
    // The cluster's restored counters are the run's own; otherwise they start from here.
    state.stats0[r] = kept ? comm::CommStats{} : cluster.comm(r).stats();
    state.clock0[r] = kept ? 0.0 : cluster.comm(r).now();
    state.eval_time[r] = 0;
    state.committed[r] = committed.at(r);
  }
}

// What this process settled about the job before the run directory is touched, read by the steps after.
struct JobSetup {
  const TrainRequest& req;
  const JobConfig& job;
  const data::Dataset& dataset;
  const model::LlamaConfig& mc;
  comm::Cluster& cluster;
  const Run& run;
  comm::Communicator* processes;  // nullptr when every rank lives in this process
  ElasticProcess* elastic;        // an elastic Gloo rank's helper, or nullptr
  const comm::NetworkModel& network;
  const std::vector<int>& ranks;  // the ranks in this process
  int world;
  bool leader, joiner, auto_streams;
};

// Where the run directory leaves this invocation: its checkpoints, what each local rank loads
// (nothing for a new run or a joiner), and what the ranks write and evaluate on.
struct RunStart {
  const RunCheckpoints& ckpts;
  const std::map<int, Checkpoint>& loaded;
  const algo::Arrivals& arrivals;  // in-process ranks beyond the workers that saved the run: they join
  const std::vector<std::vector<int64_t>>& committed;
  int64_t step;
  MetricsLog* metrics;
  const std::vector<data::Batch>& val_batches;
  bool resumed = false;  // a resumed run (a rank that heals holds no checkpoint of its own, though)
  bool heals = false;    // an elastic rank that resumes without the agreed step: healed by a donor
};

// The ranks' loops, from the step this invocation starts at (a joiner's: where it joined) to the end.
TrainSummary run_rank_loops(const JobSetup& s, const RunStart& start,
                            const std::vector<std::unique_ptr<Worker>>& workers, int64_t joined_at) {
  const JobConfig& job = s.job;
  const std::vector<int>& ranks = s.ranks;
  Meeting meeting(&start.val_batches, static_cast<int>(ranks.size()), s.world, job.train.log_every,
                  job.train.eval_model == "local");
  Progress progress(job.train.steps);
  const int64_t end_step = job.train.stop_at > 0 ? job.train.stop_at : job.train.steps;
  RunState state{s.run, job, start.ckpts, s.req.quiet, joined_at, end_step,
                 start.metrics, &progress, &meeting, &s.cluster, s.elastic, &start.val_batches};
  state.reporter = ranks.front();
  // A process's real clock already holds its evaluations; the virtual clock leaves them out (the
  // algorithm's clock stays the algorithm's), so they are counted beside it.
  if (job.cluster.backend == "inproc" && job.train.eval_model == "average")
    state.eval_price_s = eval_seconds(s.network, workers.front()->numel(), s.world);
  state.summary.run_dir = s.run.dir().string();
  state.summary.final_val_loss = std::numeric_limits<double>::quiet_NaN();
  if (joined_at < 0) {
    fmt::print("worker {}: the job finished before it could rejoin\n", ranks.front());
    state.summary.ended_before_join = true;
    return state.summary;
  }
  std::map<int, int64_t> last_committed;
  for (int r : ranks)
    last_committed[r] = start.committed[r].empty() || s.joiner || start.heals ? -1 : start.committed[r].front();
  restore_counters(state, s.cluster, start.loaded, last_committed);
  std::map<int, Worker*> by_rank;
  for (size_t i = 0; i < ranks.size(); ++i) by_rank[ranks[i]] = workers[i].get();
  s.cluster.run([&](int r, comm::Communicator& c) { rank_loop(state, r, *by_rank.at(r), c); });
  // A rank still waiting to join learns that the job finished (not that it lost every member).
  if (s.elastic && state.summary.steps_done == end_step && !state.summary.interrupted) s.elastic->finished(end_step);
  if (s.leader && !s.req.quiet) progress.finish();
  return state.summary;
}

// The round time of an unimpeded worker on the virtual clock, H s + C: what turns faults given
// in seconds into rounds.
double unimpeded_round_seconds(const JobConfig& job, const model::LlamaConfig& mc, const comm::NetworkModel& network,
                               int world) {
  const auto& entry = algo::algorithm(job.algo.name.str());
  const algo::SyncContext c{job.algo, entry, world, static_cast<uint64_t>(job.train.seed), &network, nullptr};
  const torch::ScalarType wire = entry.sends_gradients ? torch::kFloat32 : c.wire();
  return c.round_seconds(mc.num_params() * static_cast<int64_t>(c10::elementSize(wire)));
}

// The membership of an elastic in-process run, saying how faults given in seconds landed.
std::optional<algo::Membership> fault_membership(const JobSetup& s, const algo::Arrivals& arrivals) {
  if (!s.job.faults.by_time() || s.elastic) return s.job.membership(s.world, 0, arrivals);
  const double round_s = unimpeded_round_seconds(s.job, s.mc, s.network, s.world);
  auto m = s.job.membership(s.world, round_s, arrivals);
  if (s.leader && !s.req.quiet && m) {
    std::string where;
    const auto& events = m->events();
    for (size_t i = 0; i < std::min<size_t>(events.size(), 8); ++i)
      where += fmt::format("{}worker {} at round {}", i ? ", " : "", events[i].id, events[i].round);
    if (events.size() > 8) where += fmt::format(", ... ({} in all)", events.size());
    fmt::print("faults in seconds: a round takes {:.2f} s on an unimpeded worker's clock; deaths: {}\n", round_s,
               where.empty() ? "none" : where);
  }
  return m;
}

// An id beyond the workers that saved a resumed run holds, until it is healed at its arrival
// round's merge, its donor's checkpoint under its own random generator: its round and step are
// then the job's, and what it holds is the state it will receive.
void stand_in_for_arrival(Worker& w, int id, const RunStart& start, const algo::Membership& membership) {
  const int donor = membership.view(start.arrivals.at(id)).donor(id);
  StateDict state = start.loaded.at(donor).tensors;
  state["rng.cpu"] = w.state().at("rng.cpu");
  w.load_state(state);
}

// This process's BLAS threads and workers (on a resume, from their checkpoints), then their loops.
TrainSummary train_workers(const JobSetup& s, const RunStart& start) {
  const JobConfig& job = s.job;
  const std::vector<int>& ranks = s.ranks;
  const BlasThreads blas(planned_blas_threads(job, static_cast<int>(ranks.size()), s.cluster.host_processes()));
  if (blas.active() && s.req.verbose)
    print_thread_plan(job, static_cast<int>(ranks.size()), s.cluster.host_processes(), s.auto_streams);
  if (s.leader && !s.req.quiet && job.train.device == "cpu" && job.train.threads > 1 && !blas.active())
    warn_two_pools(job);
  const std::optional<algo::Membership> membership = fault_membership(s, start.arrivals);
  const algo::Membership* views = s.elastic ? &s.elastic->views() : membership ? &*membership : nullptr;
  std::vector<std::unique_ptr<Worker>> workers;
  for (size_t i = 0; i < ranks.size(); ++i) {
    workers.push_back(
        std::make_unique<Worker>(job, s.mc, s.dataset, s.cluster.comm(ranks[i]),
                                 algo::make_synchronizer(job.algo, s.world, job.train.seed, &s.network, views)));
    if (start.loaded.contains(ranks[i])) workers.back()->load_state(start.loaded.at(ranks[i]).tensors);
    else if (start.arrivals.contains(ranks[i])) stand_in_for_arrival(*workers.back(), ranks[i], start, *membership);
  }
  if (start.resumed && s.leader && !s.req.quiet) fmt::print("resumed '{}' at step {}\n", s.run.dir().string(), start.step);
  if (s.leader)
    report_worker_memory(*workers.front(), job, *start.metrics, ranks.front(), start.step, start.resumed, s.req.quiet);
  const int64_t joined_at = s.joiner || start.heals ? s.elastic->join(*workers.front()) : start.step;
  return run_rank_loops(s, start, workers, joined_at);
}

// --repair: each local rank's checkpoints checked (files present, checksums right), and every
// thing dropped named.
void repair_checkpoints(const JobSetup& s, const RunCheckpoints& ckpts) {
  for (int r : s.ranks) {
    const auto dropped = ckpts.repair(r);
    for (const auto& line : dropped) fmt::print("repair: {}\n", line);
    if (dropped.empty() && !s.req.quiet) fmt::print("repair: rank {}: its committed checkpoints load; nothing dropped\n", r);
  }
}

// An elastic rank's resume: the step agreed in the store (ElasticProcess::agree_resume), loaded
// when this rank holds it, else `heals` (a donor's state at the first round). A rank whose newest
// commit is past the agreed step says what it drops, and forgets that branch on disk, so that a
// later resume cannot pick it up.
int64_t elastic_resume(const JobSetup& s, const RunCheckpoints& ckpts, const std::vector<int64_t>& mine,
                       std::map<int, Checkpoint>& loaded, bool& heals) {
  const int rank = s.ranks.front();
  std::vector<int64_t> loadable;
  for (int64_t step : mine)
    if (fs::exists(ckpts.file(step, rank))) loadable.push_back(step);
  const auto r = s.elastic->agree_resume(loadable, s.req.resume_step >= 0 ? std::optional(s.req.resume_step) : std::nullopt);
  // Said once, by the lowest rank that loads it (rank 0 may be a restart that joins).
  if (rank == r.loaders.front() && !s.req.quiet && (!r.healers.empty() || r.newer_dropped))
    fmt::print("elastic resume at step {}{}: rank(s) {} load it{}\n", r.step,
               s.req.resume_step >= 0 ? " (--resume-step)" : ", the step the most ranks hold",
               fmt::join(r.loaders, ", "),
               r.healers.empty() ? "" : fmt::format("; rank(s) {} hold no checkpoint of it and take a donor's state at the "
                                                    "first round", fmt::join(r.healers, ", ")));
  heals = r.heal;
  if (heals) {
    fmt::print("worker {}: holds no committed checkpoint of step {} (it holds {}): it takes a donor's state at the first "
               "round\n",
               rank, r.step, loadable.empty() ? std::string("none") : fmt::format("step(s) {}", fmt::join(loadable, ", ")));
    return r.step;
  }
  loaded.emplace(rank, s.run.load(ckpts, r.step, rank, mine));
  if (!mine.empty() && mine.front() > r.step) {
    fmt::print("worker {}: resumes at step {} with the others; its committed step {} is dropped (steps {}..{} are trained "
               "again)\n",
               rank, r.step, mine.front(), r.step + 1, mine.front());
    ckpts.rewind(rank, r.step);
  }
  return r.step;
}

// One job per run directory, for the run's whole life; then the checkpoints, before anything in
// the directory changes, so that a bad resume changes nothing. A joiner loads none: it takes a
// running worker's state.
TrainSummary train_in_run_dir(const JobSetup& s) {
  const JobConfig& job = s.job;
  const RunDirLock lock(s.run.dir(), s.ranks);
  const int saved = !s.req.resume_dir.empty() && !s.joiner ? s.run.check_resume_world(s.ranks.front() == 0) : s.world;
  RunCheckpoints ckpts(s.run.dir(), s.world);
  std::map<int, Checkpoint> loaded;
  if (s.req.repair && !s.joiner) repair_checkpoints(s, ckpts);
  const auto committed = committed_by_rank(ckpts, s.world, s.ranks, s.processes);
  std::vector<int> with_checkpoint, arriving;
  for (int r : s.ranks) (r < saved ? with_checkpoint : arriving).push_back(r);
  if (s.elastic && !arriving.empty())
    throw ConfigError(fmt::format("rank {} has no checkpoint: run '{}' was saved by {} workers", arriving.front(),
                                  s.run.dir().string(), saved),
                      fmt::format("ranks beyond those that saved a run join it: resume it under gasloc launch --elastic, "
                                  "which starts them as joiners, or, by hand, at a gasloc store --elastic -n {} "
                                  "--founders {}",
                                  s.world, saved));
  const bool resumed = !s.req.resume_dir.empty();
  bool heals = false;
  int64_t start_step = 0;
  if (s.elastic && resumed)
    start_step = s.joiner ? s.elastic->agreed_resume_step()
                          : elastic_resume(s, ckpts, committed[s.ranks.front()], loaded, heals);
  else if (!s.joiner)
    start_step = prepare_start(s.req, s.run, ckpts, with_checkpoint, committed, s.processes, loaded, s.elastic != nullptr);
  algo::Arrivals arrivals;
  for (int r : arriving) arrivals[r] = algo::algorithm(job.algo.name).rounds_in(start_step, job.algo.H);
  // Every process writes run.json (the same bytes): under Gloo each host's run directory can then
  // be read back and resumed on its own.
  if (!s.elastic && (s.leader || s.processes)) s.run.write_info(s.dataset);
  if (s.leader) {
    if (s.req.verbose) s.run.print();
    else if (!s.req.quiet) s.run.print_summary();
  }
  const auto metrics = s.elastic ? open_elastic_files(s.run, s.dataset, *s.elastic, resumed, start_step)
                                 : open_metrics(s.run, s.leader, !loaded.empty(), start_step, s.processes);
  const auto val_batches =
      data::validation_batches(*s.dataset.val, job.data.batch_size, job.data.seq_len, job.data.val_batches);
  RunStart start{ckpts, loaded, arrivals, committed, start_step, metrics.get(), val_batches};
  start.resumed = resumed && !s.joiner;
  start.heals = heals;
  return train_workers(s, start);
}

}  // namespace

TrainSummary run_training(const TrainRequest& req) {
  // From the start: a Ctrl+C during set-up must stop the run cleanly too, not kill it.
  SignalScope signals;
  JobConfig job = resolve_job(req);
  if (job.train.threads > 0) torch::set_num_threads(static_cast<int>(job.train.threads));

  const data::Dataset dataset = data::Dataset::open(job.data.dir, job.data.vocab_size, job.data.verify_shards);
  const model::LlamaConfig mc = job.model.resolve(dataset.vocab_size);  // data.seq_len fits: JobConfig::validate
  check_memory(mc, job.cluster.backend == "inproc" ? static_cast<int>(job.cluster.workers) : 1, job.train.device);
  // A compressed round's messages are priced by their size against the simulated model's.
  if (job.algo.compression != "none") job.network.parameter_message_bytes = mc.num_params() * job.network.simulated_element_bytes;

  // Which ranks live in this process: all of them in-process, one per process otherwise.
  const auto cluster = open_cluster(req, job);
  const int world = cluster->world();
  job.algo.validate(world);
  // The thread plan: run.json records the stream count the run used (a resume keeps it).
  const bool auto_streams = job.train.streams == 0;
  job.train.streams = planned_streams(job.train.streams, job.train.device, job.data.batch_size, world,
                                      std::thread::hardware_concurrency());
  const Run run(job, mc, world);
  comm::Communicator* processes = cluster->processes();
  const auto elastic = elastic_process(*cluster, job);
  if (processes) agree_on_config(*processes, run.resolved(), dataset.fingerprint);
  if (elastic) elastic->agree(shared_config(run.resolved(), dataset.fingerprint));
  const comm::NetworkModel network = job.network.model(world);
  const std::vector<int>& ranks = cluster->local_ranks();
  const bool leader = elastic ? elastic->leader() : ranks.front() == 0;
  const bool joiner = elastic && elastic->joiner();
  // Each step calls the next, so that what a step holds (the set-up here, the run directory's
  // lock, the BLAS threads, the workers) outlives the steps after it and is let go in reverse.
  return train_in_run_dir({req, job, dataset, mc, *cluster, run, processes, elastic.get(), network, ranks, world, leader,
                           joiner, auto_streams});
}

}  // namespace gasloc::train
