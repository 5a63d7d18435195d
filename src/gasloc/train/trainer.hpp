// A training run: resolves the job, prepares the run directory, runs the loop of every rank this
// process hosts (all of them in-process, one in a process group) with evaluation, metrics,
// progress, checkpoints and clean Ctrl+C handling.
#pragma once
#include <string>
#include <vector>

#include "gasloc/train/job_config.hpp"

namespace gasloc::train {

struct TrainRequest {
  std::string config_path;             // TOML job file ("" = defaults only)
  std::vector<std::string> overrides;  // section.key=value
  std::string resume_dir;              // continue this run from its checkpoint
  int64_t resume_step = -1;            // with resume_dir: this committed step (-1 = the newest)
  bool repair = false;                 // with resume_dir: drop damaged or missing checkpoints, naming them, then resume
  std::vector<std::string> allow_change;  // with resume_dir: settings the state depends on that this resume may change
  bool quiet = false;                  // no progress lines (tests)
  bool verbose = false;                // the full resolved configuration and thread plan at start
  std::string job_id;                  // process backends: the job token gasloc launch hands its ranks
  int64_t incarnation = -1;            // elastic Gloo: which start of this rank this is (gasloc launch --elastic; -1: ask gasloc store --elastic)
};

struct TrainSummary {
  int64_t steps_done = 0;
  double final_val_loss = 0.0;
  bool interrupted = false;
  bool ended_before_join = false;  // elastic: a restarted rank found the job over before it could rejoin
  std::string run_dir;
  std::vector<double> train_losses;  // one per step run in this invocation
};

TrainSummary run_training(const TrainRequest& req);

}  // namespace gasloc::train
