// Reading finished (or partial) runs back from their directories: what `gasloc report` tables,
// plots and writes as CSV, and what `gasloc sweep` aggregates. run.json and metrics.jsonl are
// read, and the dataset's dataset.json for its unigram baseline.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gasloc::study {

struct EvalPoint {
  int64_t step = 0;
  double val_loss = 0, virtual_s = 0, mb_sent = 0;  // average model; clock; MB sent by worker 0
  double consensus = 0;                              // mean squared distance of workers to their average
};

// A round whose membership changed (an elastic run's "view" line).
struct ViewMark {
  int64_t step = 0;
  double virtual_s = 0;
  int64_t died = 0, joined = 0;  // workers that left the view, and that rejoined healed
};

struct RunSummary {
  std::string dir, label, optim, algo;  // label: algorithm (with its topology for gossip)
  int64_t workers = 1, last_step = 0, planned_steps = 0;
  double val_loss = 0, consensus = 0, mb_per_worker = 0, virtual_s = 0;
  bool has_val_loss = false;
  bool own_models = false;  // its val_loss points are the mean of each worker's own model (train.eval_model = local, elastic Gloo), not the average model's
  double state_per_param = -1;   // optimizer + algorithm bytes per parameter; < 0 if not logged
  double optimizer_state_per_param = -1, sync_state_per_param = -1;  // its two parts
  int64_t params = 0;            // parameters of the model, from the memory line; 0 if not logged
  int64_t H = 0;                 // algo.H
  std::string compression = "none";  // algo.compression
  int64_t priced_params = 0;     // the parameters messages are priced as: network.simulated_model's, else 0 (this model's)
  double bits_per_param_round = -1;  // bits sent per (priced) parameter per communication round by the average worker; < 0: unknown
  int64_t resends = -1;          // modulo gossip: chunks resent in fp32 after a wrap, summed over workers; < 0: not logged
  double idle_fraction = 0;      // mean over workers of idle / virtual time at their last line
  double utilization = -1;       // mean over workers of their compute utilization at their last line; < 0: not logged (metrics before version 4)
  int64_t min_local_steps = -1;  // fewest steps any worker computed (time_budget skips some)
  double eval_s = 0;             // evaluations priced on the virtual clock by the line of virtual_s (not in it; 0 on a real clock, whose time holds them)
  double wall_s = 0;             // training time on the wall clock, summed over resumed segments
  double train_wall_s = 0;       // the latest training line's wall time (of its segment), before the final evaluation
  int64_t last_train_step = 0;   // ... and its step: train_wall_s / last_train_step is a measured step time
  double unigram = -1;           // the data's unigram baseline (data/dataset.hpp); < 0: unknown
  int64_t deaths = 0, rejoins = 0;  // elastic runs: workers that died, and that rejoined healed (view lines)
  int64_t restarts = 0;             // elastic runs: new incarnations among the healed (in-process: every heal)
  // algo.clip_peers: messages clipped, by sender id, summed over the workers that clipped them
  // (their last train lines; in an all-reduce every worker clips every message); empty: not clipping.
  std::vector<int64_t> clipped_from;
  std::vector<int64_t> dropped_from;  // ... and the non-finite messages dropped, by sender id, likewise
  std::vector<EvalPoint> curve;
  std::vector<ViewMark> views;  // elastic runs, in the file's order
  // Evaluated at train.steps: the run is complete.
  bool finished() const { return has_val_loss && last_step >= planned_steps && planned_steps > 0; }
};

// The val_loss column's header for these runs: the average model's, and where some runs
// evaluated each worker's own model instead (RunSummary::own_models), what their "own" cells mean.
std::string val_loss_header(bool any_own_models);

// Throws DataError if dir holds no readable run.json or metrics.jsonl. Malformed metric lines
// (a crash mid-write) are skipped.
RunSummary read_run_summary(const std::filesystem::path& dir);

// Where the curve first reaches `target`, interpolated linearly between the two evaluations
// around the crossing: (step, virtual seconds), or nothing if it never does.
std::optional<std::pair<double, double>> reach_target(const std::vector<EvalPoint>& curve, double target);

// The unigram baseline of the dataset in `data_dir`: dataset.json's unigram_val_loss, or for a
// dataset prepared before it was recorded (or llm.c shards) computed from its shards once per
// process. < 0 when the dataset is not there (moved, or another machine's path).
double unigram_baseline(const std::filesystem::path& data_dir);

// Names for runs in tables, legends and CSV: each directory's base name, or parent/name where
// base names collide (a/run and b/run), or the whole path where even those do.
std::vector<std::string> run_labels(const std::vector<std::string>& dirs);

}  // namespace gasloc::study
