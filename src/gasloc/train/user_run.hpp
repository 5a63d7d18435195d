// A run whose model, data, inner optimizer and loop belong to the user (the Python API,
// docs/python.md): the runtime's cluster, synchronizer and metrics around parameters handed in.
// The user's loop calls step() after every optimizer step; the synchronizer acts there exactly as
// after an inner step of the CLI worker (Worker::step): DiLoCo's and GASLoC's rounds on the flat
// buffer that the user's parameters now live in.
#pragma once
#include <torch/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gasloc/algo/membership.hpp"
#include "gasloc/algo/synchronizer.hpp"
#include "gasloc/comm/cluster.hpp"
#include "gasloc/comm/network_model.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/job_config.hpp"
#include "gasloc/train/metrics.hpp"
#include "gasloc/train/run.hpp"
#include "gasloc/train/run_lock.hpp"
#include "gasloc/train/signals.hpp"

namespace gasloc::train {

class ElasticProcess;  // train/elastic_process.hpp

// Why `key` ("section.key") cannot be set for a user-owned run: the user owns what it sets (the
// model, the data, the inner optimizer, the loop's length, device and threads) or this API does not
// carry it out yet; "" when it can be set.
std::string user_key_refusal(const std::string& key);

// The job of a user-owned run: a TOML job file ("" = defaults) and "section.key=value" overrides,
// parsed and validated as `gasloc train --config --set` does (job_from_json), with every key the
// file or the overrides set that user_key_refusal refuses, and the settings this API cannot run
// yet, refused by name (ConfigError). `launched` (WORLD_SIZE is set: a launcher started this
// process): the backend is gloo unless the settings name nccl, since a Python process is then one
// rank of the job (cluster.backend = inproc is refused).
JobConfig user_job(const std::string& config_path, const std::vector<std::string>& overrides, bool launched = false);

// The ranks this process hosts for `job` (train/run_start.hpp's open_cluster): one rank alone
// (cluster.backend = inproc), or one rank of a process group formed from the launcher's variables.
// `job_id`: the job token gasloc launch hands a sealed job's ranks (GASLOC_JOB_ID): the rank then
// meets at gasloc's store, authenticated with cluster.secret_file, and sends heartbeats, as a
// `gasloc train` rank does; "" meets at the launcher's c10d store (or hosts gasloc's as rank 0 by hand).
// `incarnation` (GASLOC_INCARNATION under gasloc launch --elastic): 0 for a founding rank, more for
// a restarted one, which joins the running job; -1 asks a `gasloc store --elastic` (ranks by hand).
std::unique_ptr<comm::Cluster> open_user_cluster(const JobConfig& job, const std::string& job_id = "", int64_t incarnation = -1);

// The user's share of a checkpoint, which the Python package packs (nothing pickled): the tensors
// of the optimizer's state_dict() and of `state=`'s value by name, and the rest as JSON.
struct UserState {
  std::map<std::string, torch::Tensor> tensors;
  nlohmann::json json;
};

class UserRun {
 public:
  // Rebinds `params` (the user's, by name; the Parameter objects stay the same) to views of one
  // flat fp32 buffer, checks that every rank holds the same names and shapes and the same job,
  // takes the parameters of rank 0 (as DDP broadcasts rank 0's), builds the synchronizer, and
  // starts run.json and metrics.jsonl in train.run_dir. `rank` is one of `cluster`'s local ranks;
  // `optimizer` names the user's inner optimizer (for metrics and checkpoints). Throws ConfigError
  // for parameters on several devices, of another dtype than fp32, or none at all; CheckpointError
  // for a new run in a directory that holds checkpoints.
  // `resume`: every rank continues from its file of the newest step any rank committed in
  // train.run_dir (kResumeNewest), or of the committed step given (a damaged newest one's
  // fallback; later steps are forgotten), with the parameters, the synchronizer's state, the step
  // and the counters; resumed() then holds the user's share for the caller to restore. A run of
  // another world, or a checkpoint of another model, optimizer or algorithm, is a CheckpointError
  // naming what differs; a damaged file names the step to resume instead.
  // Elastic (`cluster` has an elastic roster: gasloc launch --elastic, docs/python.md "Elastic
  // runs"): the ranks agree in the store, with no collective over all of them; the founding ranks
  // must start from the same parameters (there is no broadcast: a rank whose parameters differ
  // is refused, naming the fix), and a restarted incarnation joins instead: it waits for a round
  // whose view lists it, takes its donor's parameters, synchronizer state, step and user's share
  // (resumed() then holds the share), and returns at the donor's step.
  UserRun(const JobConfig& job, const std::vector<std::pair<std::string, torch::Tensor>>& params, comm::Cluster& cluster,
          int rank, const std::string& optimizer, std::optional<int64_t> resume = std::nullopt);
  static constexpr int64_t kResumeNewest = -1;
  ~UserRun();
  UserRun(const UserRun&) = delete;
  UserRun& operator=(const UserRun&) = delete;

  // After the user's optimizer step: the synchronizer's after_step (a round every H steps). True
  // when a round ended at this step. `loss` (the step's training loss, if given) and `lr` go to
  // metrics.jsonl every train.log_every steps.
  bool step(std::optional<double> loss, double lr);
  // Before the next step's computation: false when the algorithm skips it (algo.h_policy =
  // "time_budget": a worker with H_i < H skips the last H - H_i steps of a round); the loop then
  // computes nothing and still calls step(). The same answer until step() is called.
  bool should_compute();
  // Between backward() and the optimizer step of the gradient-level algorithms (allreduce,
  // dadam): their exchange (the gradients' mean; DAdam's mix of the parameters). Gradients that
  // backward() wrote outside the flat buffer (zero_grad(set_to_none=True) drops its views) are
  // copied in and rebound first. False for the algorithms that mix in step(), which do nothing here.
  bool sync_gradients();
  // evaluate=: an evaluation is due after this step (train.eval_every; 0: only at the end).
  bool eval_due() const;
  int64_t evaluated_step() const { return evaluated_; }
  // Collective, between the caller's evaluation of this worker's own model and, when this returns
  // true, of the average model: the workers' mean and consensus distance (mean_i ||phi_i - mean||^2)
  // are computed, and with train.eval_model = "average" and several workers the mean takes the
  // parameters' place until end_evaluation.
  bool begin_evaluation();
  // Collective: puts this worker's own parameters back, gathers every worker's own loss, and the
  // leader writes the eval line (val_loss: the average model's, or the mean of the workers' own).
  void end_evaluation(double own_loss, std::optional<double> average_loss);
  // A checkpoint is due after this step (train.checkpoint_every; 0: only at the end).
  bool checkpoint_due() const;
  // The step of the last checkpoint this run wrote or resumed from (-1: none).
  int64_t checkpointed_step() const { return checkpointed_; }
  // Writes and commits this rank's checkpoint of the current step with the user's share
  // (collective: every rank at the same step; RunCheckpoints' two phases). An overlapped round in
  // flight is settled first and lands at its usual step after a resume, as in the CLI trainer.
  void checkpoint(const UserState& user);
  // Ctrl+C or SIGTERM (train/signals.hpp, installed for the run's life): the ranks agree every
  // train.log_every steps whether any was asked to stop, so that all stop after the same step.
  // True once they agreed: the caller checkpoints, closes and leaves.
  bool stop_agreed() const { return stop_agreed_; }
  // What a resumed run loaded, or an elastic joiner received from its donor, of the user's share
  // (nullopt for a new run).
  const std::optional<UserState>& resumed() const { return resumed_; }

  // --- Elastic runs ---
  bool elastic() const { return elastic_ != nullptr; }
  // A round that ended at this step admitted joiners whose donor this rank is: the caller hands
  // heal() the user's share (the optimizer's state, state=), at once, before the next step.
  bool heal_due() const { return pending_heal_.has_value(); }
  // Sends this rank's whole state (parameters, the synchronizer's state as the joiner keeps it,
  // the step, `user`) to the joiners of heal_due(). A joiner that died at it only costs its edge.
  void heal(const UserState& user);
  // Leaves the job on purpose (Ctrl+C, an exception in the with block): writes and commits this
  // rank's checkpoint with `user` (each elastic rank commits its own), announces the leave in the
  // store (the launcher does not count the exit as a death nor restart it; the others' view
  // events list it as left) and closes without landing a round in flight. Elastic runs only.
  void leave(const UserState& user);
  // Lands an overlapped round still in flight (collective: every rank lands at the same step).
  // True when one landed. close() does it too; call it first to checkpoint the landed state.
  bool land();
  // Lands what is in flight, writes the last step's train line, and lets the run directory go.
  // Idempotent.
  void close();

  int rank() const { return rank_; }
  int world() const { return cluster_.world(); }
  int64_t steps_done() const { return step_; }
  const std::filesystem::path& run_dir() const { return dir_; }
  FlatParams& params() { return params_; }
  // gasloc's own inner optimizer stepping params() (gasloc.optim): the synchronizer reads and
  // replaces the model at its evaluation point, as the CLI worker's does (null: none).
  void attach_optimizer(optim::Optimizer* opt) { sync_->attach(opt); }
  const algo::Synchronizer& sync() const { return *sync_; }

 private:
  void start_files(const std::string& optimizer, bool resumed);
  int64_t agreed_resume_step(int64_t asked);
  void resume_from(int64_t step, const std::vector<int64_t>& committed);
  void write_train_line(bool round_done);
  void gather_grads();
  CheckpointMeta meta() const;
  Counters counters() const;
  bool agree_stop();
  // Elastic: the founding ranks' parameters agree (no broadcast); a joiner's heal; a view change.
  void agree_initial_params();
  void join_running_job();
  bool receive_heal(const algo::HealPlan& plan);
  void after_round_elastic();
  void report_view(const algo::View& v);
  void write_run_json(const std::string& optimizer);

  JobConfig job_;
  comm::Cluster& cluster_;
  int rank_;
  std::filesystem::path dir_;
  std::optional<RunDirLock> lock_;
  FlatParams params_;
  comm::NetworkModel network_;  // the synchronizer prices rounds with it (make_synchronizer keeps a pointer)
  std::unique_ptr<ElasticProcess> elastic_;  // before sync_: its views outlive the synchronizer's use of them
  std::unique_ptr<algo::Synchronizer> sync_;
  std::optional<algo::HealPlan> pending_heal_;
  std::unique_ptr<MetricsLog> metrics_;
  RunCheckpoints checkpoints_;
  std::string optimizer_;
  std::optional<UserState> resumed_;
  Counters base_;  // what the run's earlier invocations counted (a resume), added to this one's
  int64_t step_ = 0, logged_step_ = 0, checkpointed_ = -1;
  bool landed_ = false, stop_agreed_ = false;
  // This step's answers: should_compute() (asked, and what), sync_gradients() (called).
  std::optional<bool> computes_;
  bool grads_synced_ = false;
  int64_t evaluated_ = -1;          // the step of the last evaluation
  torch::Tensor own_params_;        // the worker's own parameters while the average is in their place
  double consensus_ = 0;
  const bool grads_mixed_;  // a gradient-level algorithm: step() needs sync_gradients() first
  std::map<std::string, torch::Tensor> by_name_;  // the user's parameters, whose .grad the flat buffer holds
  std::optional<SignalScope> signals_;
  std::optional<double> last_loss_;
  double last_lr_ = 0;
  bool closed_ = false;
  // Wall time: since the start, and inside step() (the runtime's share; the rest is the user's loop).
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  double in_step_s_ = 0;
};

}  // namespace gasloc::train
