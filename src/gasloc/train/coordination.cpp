#include "gasloc/train/coordination.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "gasloc/algo/registry.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/run_start.hpp"

namespace gasloc::train {
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Collective

CollectiveCoordination::CollectiveCoordination(comm::Cluster& cluster, int64_t stop_check_every, bool local_eval)
    : cluster_(cluster), processes_(cluster.processes()), stop_check_every_(stop_check_every), local_eval_(local_eval) {}

void CollectiveCoordination::agree_config(const nlohmann::json& resolved, const std::string& data_fingerprint) {
  if (processes_) agree_on_config(*processes_, resolved, data_fingerprint);
}

StartPoint CollectiveCoordination::agree_start(const StartInputs& in, std::map<int, Checkpoint>& loaded) {
  return {prepare_start(in.req, in.run, in.ckpts, in.with_checkpoint, in.committed, processes_, loaded, false)};
}

// Every process writes run.json (the same bytes): under Gloo each host's run directory can then
// be read back and resumed on its own. Only the leader drops the tail of a crashed run (or all of
// a run that never reached a checkpoint); the others append after it has.
std::unique_ptr<MetricsLog> CollectiveCoordination::open_metrics(const Run& run, const data::Dataset& dataset, bool,
                                                                 bool loaded, int64_t start_step) {
  const bool lead = leader();
  if (lead || processes_) run.write_info(dataset, loaded ? start_step : -1);
  const fs::path file = run.dir() / "metrics.jsonl";
  std::unique_ptr<MetricsLog> metrics;
  if (lead) {
    if (!loaded) fs::remove(file);
    metrics = std::make_unique<MetricsLog>(file, loaded ? start_step : -1);
  }
  if (processes_) processes_->barrier();
  if (!lead) metrics = std::make_unique<MetricsLog>(file);
  return metrics;
}

void CollectiveCoordination::open_evaluation(const std::vector<data::Batch>& val) {
  val_ = val;
  meeting_ = std::make_unique<Meeting>(&val_, static_cast<int>(cluster_.local_ranks().size()), cluster_.world(),
                                       stop_check_every_, local_eval_);
}

EvalResult CollectiveCoordination::evaluate(int rank, Worker& worker, int64_t step) {
  return meeting_->evaluate(cluster_.control(rank), worker, step);
}

std::string CollectiveCoordination::eval_line(int, int64_t step, const EvalResult& e) const {
  return cluster_.world() == 1 ? fmt::format("step {:>6} | val_loss {:.4f}", step, e.val_loss)
                               : fmt::format("step {:>6} | val_loss {:.4f} (average model) | consensus {:.3e}", step,
                                             e.val_loss, e.consensus_distance);
}

bool CollectiveCoordination::should_stop(int rank, int64_t step, bool stop_requested) {
  return meeting_->should_stop(cluster_.control(rank), step, stop_requested);
}

// Two-phase (checkpoint.hpp): every rank has written `step` once they meet; then each commits.
void CollectiveCoordination::commit(int rank, int64_t step, const RunCheckpoints& ckpts) {
  cluster_.control(rank).barrier();
  ckpts.commit(step, rank);
}

// ---------------------------------------------------------------------------------------------
// Store

StoreCoordination::StoreCoordination(comm::ElasticRoster& roster, int world, int64_t steps_per_round, double timeout_s)
    : elastic_(roster, world, steps_per_round, timeout_s) {}

void StoreCoordination::agree_config(const nlohmann::json& resolved, const std::string& data_fingerprint) {
  elastic_.agree(shared_config(resolved, data_fingerprint));
}

StartPoint StoreCoordination::agree_start(const StartInputs& in, std::map<int, Checkpoint>& loaded) {
  if (!in.arriving.empty())
    throw ConfigError(fmt::format("rank {} has no checkpoint: run '{}' was saved by {} workers", in.arriving.front(),
                                  in.run.dir().string(), in.saved),
                      fmt::format("ranks beyond those that saved a run join it: resume it under gasloc launch --elastic, "
                                  "which starts them as joiners, or, by hand, at a gasloc store --elastic -n {} "
                                  "--founders {}",
                                  in.run.world(), in.saved));
  if (!in.req.resume_dir.empty()) return joiner() ? StartPoint{elastic_.agreed_resume_step()} : resume(in, loaded);
  // An elastic rank looks at its own files only: peers that started before it may train already.
  if (!joiner()) return {prepare_start(in.req, in.run, in.ckpts, in.with_checkpoint, in.committed, nullptr, loaded, true)};
  return {};
}

// An elastic rank's resume: the step agreed in the store (ElasticProcess::agree_resume), loaded
// when this rank holds it, else `heals` (a donor's state at the first round). A rank whose newest
// commit is past the agreed step says what it drops, and forgets that branch on disk, so that a
// later resume cannot pick it up.
StartPoint StoreCoordination::resume(const StartInputs& in, std::map<int, Checkpoint>& loaded) {
  const int rank = in.with_checkpoint.front();
  const std::vector<int64_t>& mine = in.committed[rank];
  std::vector<int64_t> loadable;
  for (int64_t step : mine)
    if (fs::exists(in.ckpts.file(step, rank))) loadable.push_back(step);
  const auto r = elastic_.agree_resume(loadable, in.req.resume_step >= 0 ? std::optional(in.req.resume_step) : std::nullopt);
  // Said once, by the lowest rank that loads it (rank 0 may be a restart that joins).
  if (rank == r.loaders.front() && !in.req.quiet && (!r.healers.empty() || r.newer_dropped))
    fmt::print("elastic resume at step {}{}: rank(s) {} load it{}\n", r.step,
               in.req.resume_step >= 0 ? " (--resume-step)" : ", the step the most ranks hold",
               fmt::join(r.loaders, ", "),
               r.healers.empty() ? "" : fmt::format("; rank(s) {} hold no checkpoint of it and take a donor's state at the "
                                                    "first round", fmt::join(r.healers, ", ")));
  if (r.heal) {
    fmt::print("worker {}: holds no committed checkpoint of step {} (it holds {}): it takes a donor's state at the first "
               "round\n",
               rank, r.step, loadable.empty() ? std::string("none") : fmt::format("step(s) {}", fmt::join(loadable, ", ")));
    return {r.step, true};
  }
  loaded.emplace(rank, in.run.load(in.ckpts, r.step, rank, mine));
  if (!mine.empty() && mine.front() > r.step) {
    fmt::print("worker {}: resumes at step {} with the others; its committed step {} is dropped (steps {}..{} are trained "
               "again)\n",
               rank, r.step, mine.front(), r.step + 1, mine.front());
    in.ckpts.rewind(rank, r.step);
  }
  return {r.step, false};
}

// The run files of an elastic Gloo rank: the first rank to claim them (any id: rank 0 may have died
// starting) writes run.json and starts metrics.jsonl (for a fresh run, dropping an old one; for a
// resumed one, the tail after the agreed step); every other rank, and every rank restarted later,
// appends once it has.
std::unique_ptr<MetricsLog> StoreCoordination::open_metrics(const Run& run, const data::Dataset& dataset, bool resumed,
                                                            bool, int64_t start_step) {
  const fs::path file = run.dir() / "metrics.jsonl";
  const int64_t resumed_at = resumed ? start_step : -1;
  if (!elastic_.claim_files()) {
    run.write_info(dataset, resumed_at);  // every host's run directory can be read back and resumed on its own
    return std::make_unique<MetricsLog>(file);
  }
  run.write_info(dataset, resumed_at);
  if (!resumed) fs::remove(file);
  auto metrics = std::make_unique<MetricsLog>(file, resumed ? start_step : -1);
  elastic_.files_ready();
  return metrics;
}

int64_t StoreCoordination::join(Worker& first, const StartPoint& start) {
  return joiner() || start.heals ? elastic_.join(first) : start.step;
}

// An elastic Gloo rank: its own model, no collective.
EvalResult StoreCoordination::evaluate(int, Worker& worker, int64_t) { return elastic_.evaluate(worker, val_); }

std::string StoreCoordination::eval_line(int rank, int64_t step, const EvalResult& e) const {
  return fmt::format("step {:>6} | val_loss {:.4f} (worker {}'s own model)", step, e.val_loss, rank);
}

bool StoreCoordination::should_stop(int, int64_t step, bool stop_requested) {
  return elastic_.should_stop(step, stop_requested);
}

// Each rank commits its own: no rank waits for another.
void StoreCoordination::commit(int rank, int64_t step, const RunCheckpoints& ckpts) { ckpts.commit(step, rank); }

// ---------------------------------------------------------------------------------------------

std::unique_ptr<Coordination> make_coordination(comm::Cluster& cluster, const JobConfig& job) {
  if (comm::ElasticRoster* roster = cluster.elastic_roster()) {
    const int64_t steps_per_round = algo::algorithm(job.algo.name).has_rounds ? job.algo.H : 1;
    return std::make_unique<StoreCoordination>(*roster, cluster.world(), steps_per_round, job.cluster.timeout_s);
  }
  return std::make_unique<CollectiveCoordination>(cluster, job.train.log_every, job.train.eval_model == "local");
}

}  // namespace gasloc::train
