// Running a study (study_file.hpp has the file format): `gasloc sweep FILE` runs every run that
// is not finished yet (finished runs are reused, stopped ones resumed from their checkpoint):
// first the tuning runs, then each variant's chosen point on the fresh seeds. Then it writes the
// study's report (section.hpp; consensus_study.hpp for kind = "consensus", which trains nothing)
// into its own output directory, RUNS/NAME/results.md. Only scripts/experiments.sh and the
// scripts/results_*.sh wrappers pass --doc docs/results.md, so a user's sweep never rewrites the
// tracked results.
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gasloc/study/study_file.hpp"

namespace gasloc::study {

struct SweepRun {
  std::string variant;
  Point point;            // [grid] values of this run (train.seed among them for untuned studies)
  Point tune;             // the variant's tuning point (its own hyperparameters); empty if none
  int64_t seed = 0;       // tuned studies: train.seed of this run
  bool tuning = false;    // a tuning run (on the tuning seed), not a final one
  bool provisional = false;  // a final run whose point is not chosen yet (its tuning is unfinished)
  bool awaits_step_time = false;  // its step_time_from run is unfinished: its step time is not known yet
  bool calibrated = false;        // overrides end with the measured network.step_time_s (then train.run_dir)
  std::filesystem::path dir;
  std::vector<std::string> overrides;  // everything given to the trainer, run_dir included
};

// Which tuning point each variant chose, per group: key chosen_key(variant, group).
using Chosen = std::map<std::string, Point>;
std::string chosen_key(const std::string& variant, const Point& group);

// The tuning runs (empty for untuned studies and variants with one point): variants outermost.
std::vector<SweepRun> expand_tuning(const SweepSpec& spec, bool quick, const std::filesystem::path& runs_root);
// The final runs: every variant at its chosen point (from `chosen`; a missing one is the tuning
// grid's first point, marked provisional) on every seed. Untuned studies: every grid point.
std::vector<SweepRun> expand_final(const SweepSpec& spec, bool quick, const std::filesystem::path& runs_root,
                                   const Chosen& chosen);
// Untuned studies' runs (expand_final with nothing to choose).
std::vector<SweepRun> expand_sweep(const SweepSpec& spec, bool quick, const std::filesystem::path& runs_root);
// Sets network.step_time_s of every run whose variant has step_time_from, from that variant's
// finished run of the same group and seed (train_wall_s / last_train_step); a run whose
// calibration is unfinished is marked awaits_step_time instead.
void apply_step_times(const SweepSpec& spec, std::vector<SweepRun>& runs);
// Each tuned variant's point with the lowest final validation loss per group, from the finished
// tuning runs (ties: the first in grid order). A group whose tuning is unfinished is left out.
Chosen choose_points(const SweepSpec& spec, const std::vector<SweepRun>& tuning_runs);

struct SweepOptions {
  bool quick = false;
  bool dry_run = false;                             // list the runs and their state only
  std::filesystem::path runs_root = "runs/experiments";
  std::filesystem::path doc;                        // the section goes here; "": RUNS/NAME[-quick]/results.md
  bool print_only = false;                          // print the section instead of writing a file
  std::filesystem::path plots_dir;                  // "" = a results/ folder beside the doc
  std::string command;                              // how the user invoked it, for the section
  std::filesystem::path gasloc;                     // the program launched variants run (gasloc launch)
};

// The sweep's own output directory: RUNS/NAME, or RUNS/NAME-quick.
std::filesystem::path sweep_dir(const SweepSpec& spec, bool quick, const std::filesystem::path& runs_root);

// Runs what is missing and writes the section. Throws CheckpointError, before running anything,
// if a run directory holds a run of another configuration.
void run_sweep(const SweepSpec& spec, const SweepOptions& opts);

}  // namespace gasloc::study
