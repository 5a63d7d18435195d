// A study's verdicts from its per-run table (docs/experiments.md, "Raw results"): each run's
// outcome (final loss, times to the group's targets, bytes, consensus, utilization) by group,
// judged against the claims of its study file with verdict.hpp's rules, the unigram gate and the
// equal-time budget. The section (section.hpp) builds the table from the runs and writes it beside
// its plots as <study>-runs.csv; `gasloc sweep --reverdict` reads it back and judges again,
// without the runs, the same lines bit for bit.
#pragma once
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "gasloc/study/study_file.hpp"

namespace gasloc::study {

// How a run reached a target: steps and virtual seconds (+inf: never).
struct Crossing {
  double steps = std::numeric_limits<double>::infinity();
  double seconds = std::numeric_limits<double>::infinity();
};

// One run of a study, as its verdicts read it: a row of the runs table.
struct RunOutcome {
  std::string run;      // its directory, relative to the study's (RUNS/NAME)
  std::string variant;
  std::string group;    // its grid point and scenario without the seed (point_name)
  std::string tune;     // its tuning point (point_name); "" when the variant is not tuned
  bool tuning = false;  // a tuning run, not a final one
  int64_t seed = 0;     // its train.seed (0: the job's own, not set by the study)
  bool finished = false;
  double val_loss = std::numeric_limits<double>::quiet_NaN();  // NaN: never evaluated
  double unigram = -1;                                        // the data's baseline; < 0 unknown
  double virtual_s = 0, eval_s = 0;                           // its final time and priced evaluations
  double mb_per_worker = 0, consensus = 0, utilization = -1;  // utilization < 0: not logged
  Crossing target;                     // to the group's target (never when it has none)
  std::map<double, double> loss_at;    // a claim's target_at fraction -> its loss there (NaN: its curve does not span it)
  std::map<double, Crossing> early;    // a claim's target_at fraction -> to that claim's target
};

// A group's runs: its point (scenario and grid values, no seed) and its runs by variant.
struct GroupOutcomes {
  Point point;
  std::map<std::string, std::vector<RunOutcome>> finals;  // variant -> its started final runs
  std::vector<RunOutcome> tuning;                         // its started tuning runs
};

// A run's group: its point without train.seed.
Point group_point(const Point& run_point);

// The target_at fractions below 1 that the study's claims name (their own earlier targets).
std::vector<double> early_fractions(const SweepSpec& spec);
// The data's unigram baseline when every run of the group shares it, else -1.
double shared_unigram(const GroupOutcomes& grp);
// The group's target loss: the study's, or the highest final loss of its target_from runs (0: none).
double group_target(const SweepSpec& spec, const GroupOutcomes& grp);
// A claim's earlier target: the highest of target_from's losses at `fraction` of its steps (0: none).
double early_target(const SweepSpec& spec, const GroupOutcomes& grp, double fraction);
// The group's virtual-time budget (sweep.equal_time): target_from's longest run, 0 when none.
double time_budget(const SweepSpec& spec, const GroupOutcomes& grp);
// Why a variant's runs did not get the budget ("" when they did).
std::string over_budget(const SweepSpec& spec, const std::string& name, const std::vector<RunOutcome>& runs, double budget);

// Each claim judged in this group (` [GROUP]` after its text when `label` is not ""), as markdown
// list items.
std::vector<std::string> judge_claims(const SweepSpec& spec, const GroupOutcomes& grp, const std::string& label);
// "\nClaims:\n\n" and the lines, or "" without any.
std::string claims_md(const std::vector<std::string>& lines);

// The runs table: one row per run of every group, finals then tuning runs.
std::string runs_table_csv(const SweepSpec& spec, const std::vector<GroupOutcomes>& groups);
// The groups of the study (in this mode) in the order its section lists them, with their rows
// from a runs table. Throws DataError naming `where` for a missing column or a bad cell.
std::vector<GroupOutcomes> read_runs_table(const SweepSpec& spec, bool quick, const std::string& csv, const std::string& where);
// The claim lines of the study's section, from its runs table.
std::string verdicts_from_table(const SweepSpec& spec, bool quick, const std::string& csv, const std::string& where);

// Where a doc's study keeps its runs table: RESULTS/<study>[-quick]-runs.csv, RESULTS the
// folder of its plots.
std::filesystem::path runs_table_path(const std::filesystem::path& plots_dir, const SweepSpec& spec, bool quick);

// gasloc sweep --reverdict: the claim lines of the study's section in `doc`, judged again from its
// runs table, replace the ones there; the rest of the section stays as generated. Returns a line
// for the user: what it rewrote, or why it left the section as it is (the doc has no section of
// the study, the section has no runs table yet, a consensus study simulates rather than runs).
// Throws ConfigError if `doc` does not exist, DataError for a table it cannot read.
std::string reverdict(const std::filesystem::path& doc, const SweepSpec& spec, bool quick);

}  // namespace gasloc::study
