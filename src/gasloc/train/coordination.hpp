// How the ranks of a run agree outside their algorithm: on the job's settings, on the step they
// start or resume from, on the run's files, on evaluations, on where to stop after Ctrl+C, and on
// committing a checkpoint. The trainer asks these questions the same way on every kind of
// cluster; one of two implementations, chosen once at the run's start (make_coordination),
// answers them:
//
//   CollectiveCoordination: every rank can meet every other (the in-process cluster, a Gloo or
//     NCCL process group): collectives over the ranks' control channels and the Meeting.
//   StoreCoordination: an elastic Gloo rank, which has no collective over all ranks: the
//     rendezvous store, through ElasticProcess (its own model evaluated, a stop proposed in the
//     store, each rank committing on its own, a restarted rank joining a running job).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gasloc/algo/membership.hpp"
#include "gasloc/comm/cluster.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/elastic_process.hpp"
#include "gasloc/train/meeting.hpp"
#include "gasloc/train/metrics.hpp"
#include "gasloc/train/run.hpp"
#include "gasloc/train/trainer.hpp"
#include "gasloc/train/worker.hpp"

namespace gasloc::train {

// What the run directory holds when this invocation decides where it starts.
struct StartInputs {
  const TrainRequest& req;
  const Run& run;
  const RunCheckpoints& ckpts;
  const std::vector<int>& with_checkpoint;  // this process's ranks among the workers that saved the run
  const std::vector<int>& arriving;         // and those beyond them (none for a new run)
  int saved = 0;                            // the workers that saved the run (the world for a new run)
  const std::vector<std::vector<int64_t>>& committed;  // every rank's committed steps, newest first
};

// Where this invocation starts.
struct StartPoint {
  int64_t step = 0;
  bool heals = false;  // a rank that resumes without the agreed step's state: a donor's at the first round
};

class Coordination {
 public:
  virtual ~Coordination() = default;

  // --- The run's start ---
  // The rank that starts the run's files and prints the run: rank 0 of the job's first members.
  virtual bool leader() const = 0;
  // A rank that joins a running job (a restarted elastic rank): it loads no checkpoint of its own.
  virtual bool joiner() const = 0;
  // Every rank of the job lives in this process (a resume needs no launcher).
  virtual bool one_process() const = 0;
  // Refuses a rank whose settings or data differ from the others', naming the keys that differ.
  virtual void agree_config(const nlohmann::json& resolved, const std::string& data_fingerprint) = 0;
  // The step this invocation starts from (0, or the resumed step), with what each local rank
  // loads put in `loaded` (nothing for a new run or a joiner). Throws CheckpointError or
  // ConfigError when the run cannot start or resume as asked.
  virtual StartPoint agree_start(const StartInputs& in, std::map<int, Checkpoint>& loaded) = 0;
  // run.json and metrics.jsonl of this invocation: a new run drops an old metrics file, a
  // resumed one the lines after `start_step`. `loaded`: some local rank loaded a checkpoint.
  virtual std::unique_ptr<MetricsLog> open_metrics(const Run& run, const data::Dataset& dataset, bool resumed,
                                                   bool loaded, int64_t start_step) = 0;
  // The views the synchronizers follow when the store decides them; nullptr: the job's own
  // membership (JobConfig::membership).
  virtual const algo::Membership* store_views() = 0;
  // The step the local ranks continue from: `start.step`, or, for a joiner or a rank that heals,
  // the step at which it joined the running job with `first`'s state replaced by its donor's
  // (-1 when the job ended first).
  virtual int64_t join(Worker& first, const StartPoint& start) = 0;

  // --- The ranks' loops (called from every local rank's thread) ---
  // The validation batches the evaluations use; before the loops start.
  virtual void open_evaluation(const std::vector<data::Batch>& val) = 0;
  // Every rank at the same step (collective), or this rank's own model (store).
  virtual EvalResult evaluate(int rank, Worker& worker, int64_t step) = 0;
  // The terminal's line for an evaluation.
  virtual std::string eval_line(int rank, int64_t step, const EvalResult& e) const = 0;
  // Called by every rank after every step: true when it stops after `step` (every rank at the
  // same step). `stop_requested`: Ctrl+C here.
  virtual bool should_stop(int rank, int64_t step, bool stop_requested) = 0;
  // Commits rank's checkpoint of `step`, written by every rank (collective: once all have written it).
  virtual void commit(int rank, int64_t step, const RunCheckpoints& ckpts) = 0;
  // This process reached the job's last step: a rank still waiting to join learns the job finished.
  virtual void finished(int64_t step) = 0;
};

// The in-process cluster or a process group: collectives over the control channels.
class CollectiveCoordination final : public Coordination {
 public:
  // `stop_check_every`: processes agree on a stop every so many steps (train.log_every);
  // `local_eval`: train.eval_model = "local".
  CollectiveCoordination(comm::Cluster& cluster, int64_t stop_check_every, bool local_eval);
  bool leader() const override { return cluster_.local_ranks().front() == 0; }
  bool joiner() const override { return false; }
  bool one_process() const override { return processes_ == nullptr; }
  void agree_config(const nlohmann::json& resolved, const std::string& data_fingerprint) override;
  StartPoint agree_start(const StartInputs& in, std::map<int, Checkpoint>& loaded) override;
  std::unique_ptr<MetricsLog> open_metrics(const Run& run, const data::Dataset& dataset, bool resumed, bool loaded,
                                           int64_t start_step) override;
  const algo::Membership* store_views() override { return nullptr; }
  int64_t join(Worker&, const StartPoint& start) override { return start.step; }
  void open_evaluation(const std::vector<data::Batch>& val) override;
  EvalResult evaluate(int rank, Worker& worker, int64_t step) override;
  std::string eval_line(int rank, int64_t step, const EvalResult& e) const override;
  bool should_stop(int rank, int64_t step, bool stop_requested) override;
  void commit(int rank, int64_t step, const RunCheckpoints& ckpts) override;
  void finished(int64_t) override {}

 private:
  comm::Cluster& cluster_;
  comm::Communicator* processes_;  // nullptr when every rank lives in this process
  const int64_t stop_check_every_;
  const bool local_eval_;
  std::vector<data::Batch> val_;
  std::unique_ptr<Meeting> meeting_;
};

// An elastic Gloo rank: the rendezvous store, through ElasticProcess.
class StoreCoordination final : public Coordination {
 public:
  // `steps_per_round`: steps of one communication round (H, or 1 for per-step algorithms).
  StoreCoordination(comm::ElasticRoster& roster, int world, int64_t steps_per_round, double timeout_s);
  bool leader() const override { return elastic_.leader(); }
  bool joiner() const override { return elastic_.joiner(); }
  bool one_process() const override { return false; }
  void agree_config(const nlohmann::json& resolved, const std::string& data_fingerprint) override;
  StartPoint agree_start(const StartInputs& in, std::map<int, Checkpoint>& loaded) override;
  std::unique_ptr<MetricsLog> open_metrics(const Run& run, const data::Dataset& dataset, bool resumed, bool loaded,
                                           int64_t start_step) override;
  const algo::Membership* store_views() override { return &elastic_.views(); }
  int64_t join(Worker& first, const StartPoint& start) override;
  void open_evaluation(const std::vector<data::Batch>& val) override { val_ = val; }
  EvalResult evaluate(int rank, Worker& worker, int64_t step) override;
  std::string eval_line(int rank, int64_t step, const EvalResult& e) const override;
  bool should_stop(int rank, int64_t step, bool stop_requested) override;
  void commit(int rank, int64_t step, const RunCheckpoints& ckpts) override;
  void finished(int64_t step) override { elastic_.finished(step); }

 private:
  StartPoint resume(const StartInputs& in, std::map<int, Checkpoint>& loaded);
  ElasticProcess elastic_;
  std::vector<data::Batch> val_;
};

// The coordination of the ranks `cluster` hosts: the store's for an elastic Gloo rank, the
// collective one otherwise.
std::unique_ptr<Coordination> make_coordination(comm::Cluster& cluster, const JobConfig& job);

}  // namespace gasloc::train
