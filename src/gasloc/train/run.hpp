// A training run before its ranks start: the job as it runs (resolved from the request, with the
// world it really has), what its checkpoints must agree on, and its run.json.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gasloc/comm/communicator.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/job_config.hpp"
#include "gasloc/train/trainer.hpp"

namespace gasloc::train {

// A setting the run's checkpointed state depends on, changed by a resume (--allow-change KEY).
struct SettingChange {
  std::string key;
  nlohmann::json old_value, new_value;
};

// The job a request describes: its job file with overrides, or (--resume) the run's own run.json
// with overrides on top. Throws ConfigError or CheckpointError. A resume that changes a setting
// the checkpoints' state depends on (state_keys()) is refused naming the key and both values,
// unless req.allow_change names it; the changes allowed are put in `changes`.
JobConfig resolve_job(const TrainRequest& req, std::vector<SettingChange>* changes = nullptr);
// The settings a resume may change only with --allow-change ("section.key").
const std::vector<std::string>& state_keys();

// What a checkpoint must agree on with the job that resumes it.
struct CheckpointMeta {
  nlohmann::json model;
  std::string optim, algo;
  int world = 1;
  bool operator==(const CheckpointMeta&) const = default;
  nlohmann::json to_json() const { return {{"model", model}, {"optim", optim}, {"algo", algo}, {"world", world}}; }
  static CheckpointMeta from_json(const nlohmann::json& m);
};

// Refuses a checkpoint (at `path`) whose meta differs from what the resuming job expects,
// naming every key that differs with both values (CheckpointError).
void check_checkpoint_meta(const std::filesystem::path& path, const CheckpointMeta& got, const CheckpointMeta& expected);

// Cumulative counters of one rank. They live in its checkpoints, so that a resumed run reports
// the traffic, times and idle time of the whole run, not of its last part.
struct Counters {
  int64_t bytes_sent = 0;
  double virtual_time_s = 0, wall_time_s = 0, idle_s = 0;
  double eval_time_s = 0;  // evaluations of the average model, priced on the network beside the virtual clock
  double compute_s = 0;    // computing: virtual in-process, wall (forward, backward, optimizer step) in processes
  nlohmann::json to_json() const;
  static Counters from_json(const nlohmann::json& j);
};

class Run {
 public:
  // `changes`: what this invocation's resume changed (resolve_job), recorded in run.json.
  Run(const JobConfig& job, const model::LlamaConfig& mc, int world, std::vector<SettingChange> changes = {});
  const JobConfig& job() const { return job_; }
  const model::LlamaConfig& model() const { return mc_; }
  int world() const { return world_; }
  const std::filesystem::path& dir() const { return dir_; }
  // The job as it runs: the world it really has (process backends: WORLD_SIZE, not cluster.workers).
  const nlohmann::json& resolved() const { return resolved_; }
  nlohmann::json model_json() const;
  CheckpointMeta meta() const { return {model_json(), job_.optim.name, job_.algo.name, world_}; }

  // Rank's checkpoint of `step`, which must agree with meta() (a CheckpointError names every
  // key that differs). An unreadable one offers the rank's previous step of `committed`.
  Checkpoint load(const RunCheckpoints& ckpts, int64_t step, int rank, const std::vector<int64_t>& committed) const;
  // A new run may not land in a directory that holds another one: its checkpoints would be
  // refused at best, its metrics mixed with the new run's at worst. Throws CheckpointError.
  void check_fresh(const RunCheckpoints& ckpts, const std::vector<int>* ranks = nullptr) const;
  // A resumed run keeps its world: a CheckpointError naming both sizes otherwise (before any
  // rank looks for checkpoints it never had).
  // An elastic run may resume on fewer or more workers than it was saved by: each id left
  // continues from its own checkpoint, and ids beyond the saved ones join at the first round,
  // healed from a donor (not with disjoint data slices, which depend on the number of workers).
  // Returns the number of workers that saved the run; `announce` (one rank of the job) says how
  // the ids are mapped when it differs.
  int check_resume_world(bool announce) const;
  const std::vector<SettingChange>& changes() const { return changes_; }
  // run.json: the resolved job, the model, the dataset and versions, and "changes": each setting a
  // resume changed, with the step it took effect at (for a run resumed at `resumed_at`: the earlier
  // ones up to it, then this resume's; -1: a run that starts, with none).
  void write_info(const data::Dataset& dataset, int64_t resumed_at) const;
  // The resolved configuration, with the preset's value beside each model field left at 0.
  void print() const;
  // Where a run keeps its copy of the dataset's dataset.json and tokenizer (write_info).
  static constexpr const char* kRunDatasetDir = "dataset";
  // One line: model, algorithm, workers, steps, data and run directory (the full configuration
  // is in run.json, and print() with --verbose).
  void print_summary() const;

 private:
  bool world_may_change() const;  // check_resume_world's rule, which load() follows
  const JobConfig& job_;
  model::LlamaConfig mc_;
  int world_;
  std::filesystem::path dir_;
  nlohmann::json resolved_;
  std::vector<SettingChange> changes_;
};

// Refuses, before anything is allocated, `local_workers` workers in this process whose estimated
// memory (host_fit.hpp: parameters, gradients, optimizer and algorithm state, one batch's
// activations) exceeds 90% of what this host has free; not checked on a GPU. Throws ConfigError
// naming cluster.workers with the estimate; returns the line the run prints ("" on a GPU).
std::string check_memory(const model::LlamaConfig& mc, const JobConfig& job, int local_workers);


// The first key ("section.key") at which a resolved job differs from a stored run's (run.json's
// "config"), "" if none, ignoring where the run lives and where it was told to stop. A setting
// the stored run lacks, made before the setting existed, ran at its default: it differs only if
// `expected` holds another value. train.streams is compared as planned (planned_streams on this
// machine; a run without it ran one stream).
std::string config_difference(const nlohmann::json& expected, const nlohmann::json& stored);

// Every rank of a process group must train the same job: ranks with different optim.lr used to
// train together silently. Each rank broadcasts its resolved job in turn (paths and thread counts
// may differ), so that every rank computes the same list of differences and stops with the same
// ConfigError.
// The data is part of it: data.dir may differ between hosts, but the dataset's fingerprint
// (dataset.json and shard sizes) must not.
void agree_on_config(comm::Communicator& processes, const nlohmann::json& resolved, const std::string& data_fingerprint);
// What every rank of a job must share: the resolved settings without the keys that may differ
// between ranks (paths, thread counts, the timeout, the world), and the data's fingerprint.
nlohmann::json shared_config(const nlohmann::json& resolved, const std::string& data_fingerprint);

// Every rank's committed checkpoint steps, wherever its files are: ranks of other processes
// (or hosts) tell theirs through `processes` (null: every rank is in this process).
std::vector<std::vector<int64_t>> committed_by_rank(const RunCheckpoints& ckpts, int world, const std::vector<int>& local,
                                                    comm::Communicator* processes);

}  // namespace gasloc::train
