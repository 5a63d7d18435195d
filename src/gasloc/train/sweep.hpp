// Sweeps: one TOML file describes a study, a grid of training runs that share a base job file,
// and what to conclude from them. `gasloc sweep FILE` runs every run that is not finished yet
// (finished runs are reused, stopped ones resumed from their checkpoint), then writes the study's
// report into its own output directory (RUNS/NAME/results.md, plots beside it): one table per
// grid point (seeds aggregated as mean and range), plots of validation loss against step,
// virtual time and bytes sent, and one line per claim. Only scripts/experiments.sh passes
// --doc docs/results.md, so a user's sweep never rewrites the tracked results.
//
//   [sweep]
//   name = "e2"                                 # section id; runs go to runs/experiments/NAME
//   title = "E2: local steps, 8 workers"
//   job = "configs/demo_cluster.toml"           # the base job file
//   target_from = "diloco"                      # time-to-target: this variant's final loss (or target = 6.5)
//   plot_x = ["step", "time", "bytes"]           # loss against these; "consensus": consensus distance
//   keep_checkpoints = false                    # finished runs' checkpoints are removed (disk)
//   [set]                                       # settings of every run
//   "algo.H" = 30
//   [quick]                                     # on top of them with --quick
//   "train.steps" = 60
//   [grid]                                      # every combination runs, for every variant
//   "cluster.workers" = [8, 16]
//   "train.seed" = [1, 2, 3]                    # train.seed is aggregated: mean and range
//   [quick_grid]                                # axes replaced with --quick
//   "train.seed" = [1]
//   [[variant]]
//   name = "diloco"
//   set = { "algo.name" = "diloco" }
//   [[claim]]
//   text = "GASLoC-2peer is competitive with DiLoCo"
//   kind = "within"                             # lower | within | faster
//   a = "gasloc-2peer"
//   b = "diloco"
//   tolerance = 0.02                            # within: |a - b| <= tolerance * b
//   by = "steps"                                # faster only: steps to the target, not virtual time
//   target_at = 0.75                            # faster only: target_from's loss at 3/4 of the steps
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace gasloc::train {

struct SweepClaim {
  std::string text, kind, a, b;
  double tolerance = 0.0;  // within: relative gap allowed; faster: a's time <= b's / (1 + tolerance)
  std::string by = "time";  // faster: "time" (virtual seconds) or "steps" to the target
  double target_at = 1.0;   // faster: the target is target_from's loss at this fraction of train.steps
};

struct SweepVariant {
  std::string name;
  std::vector<std::string> settings;  // section.key=value
};

struct SweepSpec {
  std::filesystem::path file;
  std::string name, title, job, target_from;
  double target = 0.0;  // 0 = none (or target_from)
  std::vector<std::string> plot_x = {"step"};
  bool keep_checkpoints = false;  // keep finished runs' checkpoints (to train on later); they cost disk
  std::vector<std::string> settings, quick;
  std::vector<std::pair<std::string, std::vector<nlohmann::json>>> grid;        // key -> values
  std::vector<std::pair<std::string, std::vector<nlohmann::json>>> quick_grid;  // axes replaced in --quick
  std::vector<SweepVariant> variants;
  std::vector<SweepClaim> claims;
};

// Reads and checks a sweep file: unknown keys, an empty grid axis, no variants, duplicate names,
// claims naming unknown variants are ConfigErrors that name the key. Every run's job is also
// loaded once, so a bad setting fails before anything runs.
SweepSpec load_sweep(const std::filesystem::path& file);

struct SweepRun {
  std::string variant;
  std::vector<std::pair<std::string, nlohmann::json>> point;  // grid values of this run
  std::filesystem::path dir;
  std::vector<std::string> overrides;  // everything given to the trainer, run_dir included
};

// Every run of the sweep, variants outermost. Quick mode adds [quick] and uses NAME-quick dirs.
std::vector<SweepRun> expand_sweep(const SweepSpec& spec, bool quick, const std::filesystem::path& runs_root);

struct SweepOptions {
  bool quick = false;
  bool dry_run = false;                             // list the runs and their state only
  std::filesystem::path runs_root = "runs/experiments";
  std::filesystem::path doc;                        // the section goes here; "": RUNS/NAME[-quick]/results.md
  bool print_only = false;                          // print the section instead of writing a file
  std::filesystem::path plots_dir;                  // "" = a results/ folder beside the doc
  std::string command;                              // how the user invoked it, for the section
};

// The sweep's own output directory: RUNS/NAME, or RUNS/NAME-quick.
std::filesystem::path sweep_dir(const SweepSpec& spec, bool quick, const std::filesystem::path& runs_root);

// Runs what is missing and writes the section. Throws CheckpointError, before running anything,
// if a run directory holds a run of another configuration.
void run_sweep(const SweepSpec& spec, const SweepOptions& opts);

// The markdown section of a sweep from its (finished) runs. With opts.doc "" its plots go to
// opts.plots_dir (or ./sweep-plots) and are linked by that path.
std::string sweep_section(const SweepSpec& spec, const std::vector<SweepRun>& runs, const SweepOptions& opts);

// Replaces the section between "<!-- name:begin" and "<!-- name:end -->" in `doc` (appends it if
// absent; creates the file with a title if missing), atomically.
void write_doc_section(const std::filesystem::path& doc, const std::string& name, const std::string& section);

}  // namespace gasloc::train
