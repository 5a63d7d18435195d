// The markdown section of a study: per group of the grid, the unigram baseline, a table of each
// variant's final runs (seeds as mean and range), its tuning grid with the chosen point, loss
// plots with the baseline drawn, the paper-scale projection of its communication, and one verdict
// line per claim (verdict.hpp).
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "gasloc/study/sweep.hpp"

namespace gasloc::study {

// The section from the study's (finished) runs, tuning and final. With opts.doc "" its plots go
// to opts.plots_dir (or ./sweep-plots) and are linked by that path.
std::string sweep_section(const SweepSpec& spec, const std::vector<SweepRun>& runs, const SweepOptions& opts);

// "`--set a=1 --set b=2`", or "none".
std::string settings_list(const std::vector<std::string>& settings);
// Where a section's plots go (opts.plots_dir, else results/ beside opts.doc, else ./sweep-plots),
// and how the section links a plot there (relative to the doc's directory).
std::filesystem::path plot_dir(const SweepOptions& opts);
std::string plot_link(const SweepOptions& opts, const std::filesystem::path& png);

// What one run's communication would cost with messages priced as `model` (PRESET:DTYPE) on the
// virtual clock's cost model (comm/network_model.hpp), its own network, topology and rounds.
struct Projection {
  int64_t rounds = 0;
  double mb_per_round = 0;        // MB each worker sends per round
  double seconds_per_round = 0;   // mean over workers and rounds of a round's communication time
  double slowest_per_round = 0;   // the same for the slowest worker of each round
  double compute_s = 0;           // train.steps x network.step_time_s (the unimpeded worker's compute)
};
// Throws ConfigError if the run's configuration cannot be read.
Projection project_run(const std::filesystem::path& run_dir, const std::string& model);

// Replaces the section between "<!-- name:begin" and "<!-- name:end -->" in `doc` (appends it if
// absent; creates the file with a title if missing), atomically.
void write_doc_section(const std::filesystem::path& doc, const std::string& name, const std::string& section);

}  // namespace gasloc::study
