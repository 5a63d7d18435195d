#include "gasloc/train/rank_loop.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>

#include "gasloc/core/error.hpp"
#include "gasloc/train/compute_gate.hpp"
#include "gasloc/train/signals.hpp"

namespace gasloc::train {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Counters RunState::counters(int rank, const comm::Communicator& comm, double compute_wall_s) const {
  const auto st = comm.stats();
  const Counters& b = base.at(rank);
  return {b.bytes_sent + st.bytes_sent - stats0.at(rank).bytes_sent,
          b.virtual_time_s + comm.now() - clock0.at(rank),
          b.wall_time_s + seconds_since(t0),
          b.idle_s + st.idle_s - stats0.at(rank).idle_s,
          b.eval_time_s + eval_time.at(rank),
          b.compute_s + (comm.virtual_clock() ? st.compute_s - stats0.at(rank).compute_s : compute_wall_s)};
}

std::string RunState::last_checkpoint(int rank) const {
  const int64_t s = committed.at(rank);
  return s < 0 ? std::string("no checkpoint was committed yet")
               : fmt::format("the last committed checkpoint is step {} (resume with `gasloc train --resume {}`)", s,
                             run.dir().string());
}

void RunState::say(int rank, const std::string& line) const {
  if (rank == 0 && !quiet) progress->println(line);
}

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

namespace {

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
                                 .utilization = clock > 0 ? c.compute_s / clock : 0.0,
                                 .codec_resends = w_.sync().codec_resends(),
                                 .clipped_from = w_.sync().clipped_from(),
                                 .dropped_from = w_.sync().dropped_from()});
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
    s_.say(rank_, s_.coord->eval_line(rank_, step, e));
  }
  EvalResult evaluate(int64_t step) {
    const EvalResult e = s_.coord->evaluate(rank_, w_, step);
    s_.eval_time.at(rank_) += s_.eval_price_s;  // 0 where the clock is real
    // The average reaches every rank; a local mean only the rank that reports it (an elastic Gloo
    // rank, which evaluates its own model, is the one rank of its process and reports it).
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
// Two-phase (checkpoint.hpp): every rank writes, then commits (Coordination::commit).
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
    {
      // Written in a compute slot: the serialized bytes of the state are then held by as many
      // workers at once as there are slots, not by every in-process worker (train/host_fit.cpp).
      const ComputeGate::Slot slot(w_.shared_cores(), c_.now(), rank_);
      s_.checkpoints.write(step, rank_, c);
      c.tensors.clear();
    }
    s_.coord->commit(rank_, step, s_.checkpoints);
    s_.committed[rank_] = step;
  }

 private:
  RunState& s_;
  const int rank_;
  Worker& w_;
  comm::Communicator& c_;
};

}  // namespace

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
    const bool interrupted = s.coord->should_stop(rank, step, stop_requested()) && step < s.end_step;
    checkpointer.maybe_save(step, interrupted || step == s.end_step, at_x);
    if (interrupted) {
      s.say(rank, fmt::format("interrupted: checkpoint written at step {}; continue with `gasloc train --resume {}`{}",
                              step, s.run.dir().string(), s.coord->one_process() ? "" : " under the same launcher"));
      if (rank == s.reporter) s.summary.interrupted = true;
      break;
    }
  }
  if (rank == s.reporter) s.summary.steps_done = step;
  if (step == s.end_step && !evaluated_last) evaluator.finish(step);  // stopped by train.stop_at between evaluations
}

}  // namespace gasloc::train
