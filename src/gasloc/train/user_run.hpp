// A run whose model, data, inner optimizer and loop belong to the user (the Python API,
// docs/python.md): the runtime's cluster, synchronizer and metrics around parameters handed in.
// The user's loop calls step() after every optimizer step; the synchronizer acts there exactly as
// after an inner step of the CLI worker (Worker::step): DiLoCo's and GASLoC's rounds on the flat
// buffer that the user's parameters now live in.
#pragma once
#include <torch/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gasloc/algo/synchronizer.hpp"
#include "gasloc/comm/cluster.hpp"
#include "gasloc/comm/network_model.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/train/job_config.hpp"
#include "gasloc/train/metrics.hpp"
#include "gasloc/train/run_lock.hpp"

namespace gasloc::train {

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
std::unique_ptr<comm::Cluster> open_user_cluster(const JobConfig& job);

class UserRun {
 public:
  // Rebinds `params` (the user's, by name; the Parameter objects stay the same) to views of one
  // flat fp32 buffer, checks that every rank holds the same names and shapes and the same job,
  // takes the parameters of rank 0 (as DDP broadcasts rank 0's), builds the synchronizer, and
  // starts run.json and metrics.jsonl in train.run_dir. `rank` is one of `cluster`'s local ranks;
  // `optimizer` names the user's inner optimizer (for metrics). Throws ConfigError for parameters
  // on several devices, of another dtype than fp32, or none at all.
  UserRun(const JobConfig& job, const std::vector<std::pair<std::string, torch::Tensor>>& params, comm::Cluster& cluster,
          int rank, const std::string& optimizer);
  ~UserRun();
  UserRun(const UserRun&) = delete;
  UserRun& operator=(const UserRun&) = delete;

  // After the user's optimizer step: the synchronizer's after_step (a round every H steps). True
  // when a round ended at this step. `loss` (the step's training loss, if given) and `lr` go to
  // metrics.jsonl every train.log_every steps.
  bool step(std::optional<double> loss, double lr);
  // Lands an overlapped round still in flight (collective: every rank closes at the same step),
  // writes the last step's train line, and lets the run directory go. Idempotent.
  void close();

  int rank() const { return rank_; }
  int world() const { return cluster_.world(); }
  int64_t steps_done() const { return step_; }
  const std::filesystem::path& run_dir() const { return dir_; }
  FlatParams& params() { return params_; }
  const algo::Synchronizer& sync() const { return *sync_; }

 private:
  void start_files(const std::string& optimizer);
  void write_train_line(bool round_done);

  JobConfig job_;
  comm::Cluster& cluster_;
  int rank_;
  std::filesystem::path dir_;
  std::optional<RunDirLock> lock_;
  FlatParams params_;
  comm::NetworkModel network_;  // the synchronizer prices rounds with it (make_synchronizer keeps a pointer)
  std::unique_ptr<algo::Synchronizer> sync_;
  std::unique_ptr<MetricsLog> metrics_;
  int64_t step_ = 0, logged_step_ = 0;
  std::optional<double> last_loss_;
  double last_lr_ = 0;
  bool closed_ = false;
  // Wall time: since the start, and inside step() (the runtime's share; the rest is the user's loop).
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  double in_step_s_ = 0;
};

}  // namespace gasloc::train
