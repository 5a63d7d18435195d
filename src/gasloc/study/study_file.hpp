// A study file (experiments/NAME.toml): a grid of training runs that share a base job file, each
// method's own tuning grid, the seeds, and the claims to judge. Its tables are typed sections read
// by the job files' machinery (core/config.hpp), so unknown keys and mistyped values are refused
// the same way, naming the key.
//
//   [sweep]
//   name = "e2"                                 # section id; runs go to runs/experiments/NAME
//   title = "E2: local steps, 8 workers"
//   version = 2                                 # bumped when the grid or claims change; the section prints it, and
//                                               # --doc keeps the superseded version's verdicts (section.hpp)
//   job = "configs/research.toml"               # the base job file
//   target_from = "diloco"                      # time-to-target: this variant's highest final loss (or target = 6.5)
//   plot_x = ["step", "time", "bytes"]          # loss against these; "consensus": consensus distance
//   keep_checkpoints = false                    # finished runs' checkpoints are removed (disk)
//   learned_by = 1.0                            # a verdict needs its reference's (b) runs this many nats below the unigram baseline
//   project = ["134m:bf16", "551m:bf16"]        # a table of each method's communication at these scales
//   equal_time = 0.05                           # faster by time: every variant ends within 5% below target_from's virtual time
//   memory = true                               # a table of the state each variant holds per parameter
//   notes = "How to read it ..."                # markdown under the heading: fixed text, no numbers from the runs
//   kind = "train"                              # or "consensus": gossip without training (below)
//   [set]                                       # settings of every run
//   "algo.H" = 30
//   [quick]                                     # on top of them with --quick
//   "train.steps" = 60
//   [grid]                                      # every combination runs, for every variant
//   "cluster.workers" = [8, 16]
//   [quick_grid]                                # axes replaced with --quick
//   "cluster.workers" = [8]
//   [tuning]                                    # fair tuning: see below
//   seed = 100                                  # train.seed of every tuning run
//   seeds = [1, 2, 3]                           # the chosen points rerun on these fresh seeds
//   quick_seeds = [1]                           # ... with --quick
//   [[scenario]]                                # optional: named sets of settings, each a group of its own
//   name = "bw10"
//   set = { "network.preset" = "straggler_bw10" }
//   variants = ["diloco", "gasloc-1peer-tb"]    # the variants that run in it (default: all)
//   [[variant]]
//   name = "diloco"
//   set = { "algo.name" = "diloco" }
//   tune = { "algo.outer_lr" = [0.7, 1.0], "algo.outer_momentum" = [0.0, 0.5] }
//   quick_tune = { "algo.outer_lr" = [1.0], "algo.outer_momentum" = [0.0] }
//   quick_set = { "train.steps" = 570 }         # --quick: on top of [quick]
//   [[claim]]
//   text = "GASLoC-2peer is competitive with DiLoCo"
//   kind = "no_worse"                           # lower | within | no_worse | faster
//   a = "gasloc-2peer"
//   b = "diloco"
//   tolerance = 0.02                            # within: |a - b| <= tolerance * b; no_worse: a - b <= tolerance * b
//   by = "steps"                                # faster: steps to the target, not virtual time; the others:
//                                               # by = "time" compares each run's final time, not its loss
//   target_at = 0.75                            # faster only: target_from's loss at 3/4 of the steps
//   scenarios = ["bw10"]                        # judged in these scenarios only (default: every group)
//
// Real processes: a variant with `launch = { ranks = 4 }` runs each of its runs as
// `gasloc launch -n 4 [--netns] -- gasloc train ...` (its settings must include
// cluster.backend = "gloo"); its times are then the wall clock. To compare them with the virtual
// clock, an in-process variant sets `step_time_from = "calibration"`: its network.step_time_s is
// the seconds per step (the last training line's wall time over its step) that the named variant's
// run of the same group and seed took, so that variant runs first (it must be declared earlier).
//
// Tuning: with a [tuning] table, every point of a variant's `tune` grid runs once on the tuning
// seed (for every point of [grid]); the point with the lowest final validation loss is chosen,
// then runs on each of `seeds`. A variant whose grid has one point (or none) runs on the seeds
// directly. --quick uses `quick_tune` where given. Without [tuning], seeds are a [grid] axis.
//
// Equal budgets: a "sooner on the virtual clock" claim is fair only if both methods had the same
// virtual time to get there. A method whose rounds are shorter then takes more of them: its
// variant sets its own train.steps (and quick_set its --quick ones), so that each method's LR
// schedule spans its budget. `equal_time` states the budget in the file and checks it: each run
// of every variant must end at or below target_from's virtual time and at most that fraction
// below it, or the faster-by-time verdicts say nothing.
//
// Scenarios: a study whose groups differ in several settings at once (a straggler preset here, a
// list of stragglers there), or whose groups run different variants, lists them as [[scenario]]
// tables. Each scenario is a group, crossed with [grid]; its settings come after [set] and before
// the variant's. Runs live in RUNS/NAME/VARIANT/SCENARIO[,GRID-POINT].
//
// kind = "consensus": no training. Each variant's settings pick a gossip graph and a GASLoC form
// (cluster.workers, algo.topology, algo.form, algo.outer_lr, algo.outer_momentum,
// algo.gossip_step, train.seed: the job file's own keys, checked by its loader), and the section
// shows the consensus distance of random vectors gossiped for `rounds` rounds against the
// (1 - gap)^t of plain averaging, and the per-round contraction over `rate_rounds` rounds
// (algo/consensus.hpp). Its claims are "gap_rate" (a's mean per-round ratio is within tolerance
// of 1 - gap) and "lower" (a's long-run contraction is lower than b's: it reaches consensus faster).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace gasloc::study {

// Grid axes in file order: "section.key" -> the values to try.
using Axes = std::vector<std::pair<std::string, std::vector<nlohmann::json>>>;
// One point of a grid: "section.key" -> value.
using Point = std::vector<std::pair<std::string, nlohmann::json>>;

struct StudySection {
  std::string name;
  std::string title;
  int64_t version = 1;
  std::string job;
  std::string target_from;
  double target = 0.0;
  std::vector<std::string> plot_x = {"step"};
  bool keep_checkpoints = false;
  double learned_by = 1.0;
  std::vector<std::string> project;
  double equal_time = 0.0;
  bool memory = false;
  std::string notes;
  std::string kind = "train";
  int64_t rounds = 20, rate_rounds = 2000, dim = 4096;

  template <class V>
  void visit(V&& v) {
    v("name", name, "section id and directory name: lower-case letters, digits, - and _");
    v("title", title, "the section's heading (default: name)");
    v("version", version,
      "the study's version: raise it when its grid, variants or claims change (declared before the new runs); --doc then "
      "keeps the verdicts of the version it replaces");
    v("job", job, "the base job file, relative to where gasloc runs");
    v("target_from", target_from, "time to target: the highest final loss of this variant's runs is the target");
    v("target", target, "time to target: this loss (0 = none, or target_from's)");
    v("plot_x", plot_x, "validation loss against step, time, bytes; consensus: consensus distance against step");
    v("keep_checkpoints", keep_checkpoints, "keep finished runs' checkpoints (they cost disk)");
    v("learned_by", learned_by, "nats below the unigram baseline every run of a claim's reference (b) must end for a verdict (a subject that does not is not reproduced)");
    v("project", project, "paper-scale projection: price each method's rounds as these PRESET:DTYPE models");
    v("equal_time", equal_time,
      "faster by time: every variant's runs end within this fraction below target_from's virtual time, never above (0 = "
      "not checked)");
    v("memory", memory, "a table of the optimizer and algorithm state each variant holds, in bytes per parameter");
    v("notes", notes, "markdown printed under the section's heading: how to read it (fixed text, no numbers from the runs)");
    v("kind", kind, "train (training runs) or consensus (gossip of random vectors, no training)");
    v("rounds", rounds, "consensus: gossip rounds in the table and plot");
    v("rate_rounds", rate_rounds, "consensus: rounds over which the per-round contraction is measured");
    v("dim", dim, "consensus: entries of each worker's random vector");
  }
};

struct ScenarioSection {
  std::string name;
  nlohmann::json set = nlohmann::json::object();
  std::vector<std::string> variants;

  template <class V>
  void visit(V&& v) {
    v("name", name, "the scenario's name in headings, plots and directories");
    v("set", set, "its settings: { \"section.key\" = value }");
    v("variants", variants, "the variants that run in it (default: every variant)");
  }
};

struct TuningSection {
  int64_t seed = 0;
  std::vector<int64_t> seeds;
  std::vector<int64_t> quick_seeds;

  template <class V>
  void visit(V&& v) {
    v("seed", seed, "train.seed of every tuning run (keep it apart from seeds)");
    v("seeds", seeds, "fresh seeds the chosen points (and untuned variants) run on");
    v("quick_seeds", quick_seeds, "--quick: these seeds instead (default: the first of seeds)");
  }
};

struct ClaimSection {
  std::string text, kind, a, b;
  double tolerance = 0.0;
  std::string by;  // "": time for faster, loss for the others; time_and_eval: final time + priced evaluations
  double target_at = 1.0;
  std::vector<std::string> scenarios;

  template <class V>
  void visit(V&& v) {
    v("text", text, "the claim, as the verdict line states it");
    v("kind", kind,
      "lower (a ends lower), within (|a - b| <= tolerance * b), no_worse (a - b <= tolerance * b), faster (a reaches the "
      "target sooner)");
    v("a", a, "variant the claim is about");
    v("b", b, "variant it is compared with");
    v("tolerance", tolerance, "within, no_worse: relative gap allowed; faster: a's time <= b's / (1 + tolerance)");
    v("by", by,
      "faster: time (virtual seconds, the default) or steps to the target; lower, within, no_worse: loss (the default) or "
      "time (each run's final time on its own clock: the wall clock for launched variants)");
    v("target_at", target_at, "faster: the target is target_from's loss at this fraction of train.steps");
    v("scenarios", scenarios, "judged in these scenarios only (default: every group)");
  }
};

struct LaunchSection {
  int64_t ranks = 0;
  bool netns = false;

  template <class V>
  void visit(V&& v) {
    v("ranks", ranks, "processes to start (gasloc launch -n), at least 2");
    v("netns", netns, "each rank in its own network namespace with shaped links (gasloc launch --netns; root)");
  }
};

struct VariantSection {
  std::string name;
  nlohmann::json set = nlohmann::json::object();
  nlohmann::json tune = nlohmann::json::object();
  nlohmann::json quick_tune = nlohmann::json::object();
  nlohmann::json quick_set = nlohmann::json::object();
  nlohmann::json launch = nlohmann::json::object();
  std::string step_time_from;

  template <class V>
  void visit(V&& v) {
    v("name", name, "the variant's name in tables, plots and directories");
    v("set", set, "its settings: { \"section.key\" = value }");
    v("tune", tune, "its own tuning grid: { \"section.key\" = [values] } (needs [tuning])");
    v("quick_tune", quick_tune, "--quick: this grid instead");
    v("quick_set", quick_set, "--quick: these settings on top of [quick]'s");
    v("launch", launch, "run as real processes: { ranks = 4, netns = false } (gasloc launch; needs cluster.backend = \"gloo\")");
    v("step_time_from", step_time_from,
      "network.step_time_s := the seconds per step this earlier variant's run of the same group and seed measured");
  }
};

using SweepClaim = ClaimSection;

struct SweepScenario {
  std::string name;
  std::vector<std::string> settings;  // section.key=value
  std::vector<std::string> variants;  // empty: every variant
};

// A group's point holds its scenario under this key (a job key always has a dot, so it never
// collides): point_name writes just the scenario's name, and make_run turns it into its settings.
inline constexpr const char* kScenarioKey = "scenario";

struct SweepVariant {
  std::string name;
  std::vector<std::string> settings;  // section.key=value
  Axes tune, quick_tune;              // empty: nothing to tune
  std::vector<std::string> quick_settings;  // --quick: on top of the study's [quick]
  int64_t ranks = 0;           // > 0: its runs start as this many processes under gasloc launch
  bool netns = false;          // ... each in its own network namespace
  std::string step_time_from;  // a variant whose measured seconds per step become network.step_time_s
};

struct SweepSpec {
  std::filesystem::path file;
  std::string name, title, job, target_from;
  int64_t version = 1;  // sweep.version: printed by the section from 2 on
  double target = 0.0;  // 0 = none (or target_from)
  std::vector<std::string> plot_x = {"step"};
  bool keep_checkpoints = false;  // keep finished runs' checkpoints (to train on later); they cost disk
  double learned_by = 1.0;        // nats below the unigram baseline a claim's reference runs must end
  std::vector<std::string> project;  // PRESET:DTYPE models whose communication the section projects
  double equal_time = 0.0;  // faster by time: how far below target_from's virtual time a run may end (0 = unchecked)
  std::vector<std::string> settings, quick;
  std::vector<std::string> tried;  // gasloc sweep --set/--steps: applied last to every run (a try, not the study)
  Axes grid, quick_grid;
  bool tuned = false;  // a [tuning] table: seeds below, not a grid axis
  TuningSection tuning;
  std::vector<SweepVariant> variants;
  std::vector<SweepClaim> claims;
  std::vector<SweepScenario> scenarios;
  bool memory = false;                // a state-per-parameter table (sweep.memory)
  std::string notes;                  // markdown under the heading
  bool consensus = false;             // kind = "consensus": no training runs
  int64_t rounds = 20, rate_rounds = 2000, dim = 4096;  // consensus only

  // The seeds final runs use in this mode (tuned studies only).
  std::vector<int64_t> seeds(bool quick) const;
  // A variant's tuning grid in this mode (empty: nothing to tune).
  const Axes& tune_of(const SweepVariant& v, bool quick) const;
  // The scenario a group's point names, or nullptr.
  const SweepScenario* scenario_of(const Point& group) const;
  // Whether a variant runs in a group (every variant does, unless its scenario lists others).
  bool runs_in(const std::string& variant, const Point& group) const;
  // Whether a claim is judged in a group (claim.scenarios).
  bool judged_in(const SweepClaim& claim, const Point& group) const;
};

// Reads and checks a study file: unknown keys, an empty grid axis, no variants, duplicate names,
// claims naming unknown variants are ConfigErrors that name the key. Every run's job is also
// loaded once, so a bad setting fails before anything runs.
SweepSpec load_sweep(const std::filesystem::path& file);

// "cluster.workers" = 8 -> "workers=8" (characters a path should not hold become _); a scenario
// entry is its name alone.
std::string point_name(const Point& point);
// Every combination of the axes, the first axis outermost; one empty point for no axes.
std::vector<Point> grid_points(const Axes& axes);
// A value as the text of --set section.key=TEXT: strings verbatim, the rest as TOML.
std::string toml_text(const nlohmann::json& v, bool top = true);
// The --set text of every entry but a scenario's (make_run adds its settings).
std::vector<std::string> as_overrides(const Point& kv);

}  // namespace gasloc::study
