// gasloc sweep: the sweep file is checked strictly, runs are reused or resumed, a directory from
// another configuration is refused, a full disk mid-sweep loses nothing, and the results section
// holds the tables and the claims' verdicts.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <thread>
#include <algorithm>
#include <array>
#include <limits>
#include <fstream>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/study/claims.hpp"
#include "gasloc/study/run_summary.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/study/consensus_study.hpp"
#include "gasloc/study/glance.hpp"
#include "gasloc/study/plot.hpp"
#include "gasloc/study/section.hpp"
#include "gasloc/study/study_file.hpp"
#include "gasloc/study/sweep.hpp"
#include "gasloc/study/verdict.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/algo/consensus.hpp"
#include "gasloc/topology/topology.hpp"
#include "test_util.hpp"
#include "test_paths.hpp"

using namespace gasloc;
namespace fs = std::filesystem;

namespace {
const fs::path kRoot = test_util::temp_root("test_sweep");

class Sweep : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    test_util::make_byte_dataset(kRoot);
    std::ofstream(kRoot / "base.toml") << "[model]\npreset = \"nano\"\n[data]\ndir = \"" << (kRoot / "data").string()
                                       << "\"\nseq_len = 16\nbatch_size = 2\nval_batches = 1\n[train]\nsteps = 4\n"
                                          "eval_every = 2\ncheckpoint_every = 0\nlog_every = 2\nthreads = 1\n";
  }
  static void TearDownTestSuite() { fs::remove_all(kRoot); }

  // Writes a sweep file around `body` (the [sweep] table is added) and returns its path.
  static fs::path sweep_file(const std::string& name, const std::string& body, const std::string& sweep_extra = "") {
    const fs::path p = kRoot / (name + ".toml");
    std::ofstream(p) << "[sweep]\nname = \"" << name << "\"\njob = \"" << (kRoot / "base.toml").string() << "\"\n"
                     << sweep_extra << body;
    return p;
  }

  static study::SweepOptions options(const std::string& doc = "results.md") {
    study::SweepOptions o;
    o.runs_root = kRoot / "runs";
    o.doc = kRoot / doc;
    o.plots_dir = kRoot / "plots";
    o.command = "gasloc sweep (test)";
    return o;
  }

  static void expect_config_error(const std::string& body, const std::string& needle, const std::string& sweep_extra = "") {
    static int k = 0;
    try {
      study::load_sweep(sweep_file("bad" + std::to_string(k++), body, sweep_extra));
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
};

const char* kTwoVariants = R"(
[set]
"optim.lr" = 0.003
[quick]
"train.steps" = 2
[grid]
"train.seed" = [1, 2]
[quick_grid]
"train.seed" = [1]
[[variant]]
name = "small_lr"
set = { "optim.lr" = 0.001 }
[[variant]]
name = "big_lr"
[[claim]]
text = "the larger learning rate ends lower"
kind = "lower"
a = "big_lr"
b = "small_lr"
[[claim]]
text = "they are within 50%"
kind = "within"
a = "big_lr"
b = "small_lr"
tolerance = 0.5
)";
// A finished 120-step run of `variant` in dir whose evaluations are (step, val_loss, virtual s).
study::SweepRun write_eval_run(const fs::path& dir, const std::string& variant, int64_t seed,
                               const std::vector<std::array<double, 3>>& evals) {
  fs::create_directories(dir);
  std::ofstream(dir / "run.json") << R"({"world": 2, "config": {"algo": {"name": "diloco"}, "train": {"steps": 120}, "optim": {"name": "adamw"}}})";
  std::ofstream m(dir / "metrics.jsonl");
  for (const auto& [step, loss, t] : evals)
    m << "{\"event\":\"eval\",\"step\":" << step << ",\"val_loss\":" << loss << ",\"virtual_time_s\":" << t << "}\n";
  study::SweepRun r;
  r.variant = variant;
  r.seed = seed;
  r.dir = dir;
  return r;
}

// A dataset folder under `root` whose dataset.json records this unigram baseline.
fs::path unigram_data(const fs::path& root, double unigram) {
  fs::create_directories(root / "data");
  std::ofstream(root / "data" / "dataset.json") << "{\"unigram_val_loss\": " << unigram << "}";
  return root / "data";
}

// write_eval_run's run, on that data (its run.json names the dataset, whose baseline it reads).
study::SweepRun write_run_on(const fs::path& data, const fs::path& dir, const std::string& variant, int64_t seed,
                             const std::vector<std::array<double, 3>>& evals) {
  study::SweepRun r = write_eval_run(dir, variant, seed, evals);
  std::ofstream(dir / "run.json") << R"({"world": 2, "dataset": {"dir": ")" << data.string()
                                  << R"("}, "config": {"algo": {"name": "diloco"}, "train": {"steps": 120}, "optim": {"name": "adamw"}}})";
  return r;
}

}  // namespace

TEST_F(Sweep, BadSweepFilesNameTheKey) {
  expect_config_error("[[variant]]\nname = \"a\"\n[grid]\n\"train.seed\" = []\n", "grid.train.seed");
  expect_config_error("[[variant]]\nname = \"a\"\n[extra]\nx = 1\n", "sweep file.extra");
  try {
    study::load_sweep(sweep_file("badkeep", "[[variant]]\nname = \"a\"\n", "keep_checkpoints = 1\n"));
    ADD_FAILURE() << "keep_checkpoints = 1 must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sweep.keep_checkpoints"), std::string::npos) << e.what();
  }
  expect_config_error("[[variant]]\nname = \"a\"\nspeed = 2\n", "variant.speed");
  expect_config_error("", "variant");  // no variants
  expect_config_error("[[variant]]\nname = \"a\"\n[[variant]]\nname = \"a\"\n", "appears twice");
  expect_config_error("[[variant]]\nname = \"a\"\nset = { \"optim.lr\" = -1 }\n", "optim.lr");
  expect_config_error("[[variant]]\nname = \"a\"\nset = { \"optim.learning_rate\" = 1 }\n", "optim.learning_rate");
  expect_config_error("[[variant]]\nname = \"a\"\n[[claim]]\ntext = \"t\"\nkind = \"lower\"\na = \"a\"\nb = \"zz\"\n", "zz");
  expect_config_error("[[variant]]\nname = \"a\"\n[[claim]]\ntext = \"t\"\nkind = \"faster\"\na = \"a\"\nb = \"a\"\n", "target");
  expect_config_error("[[variant]]\nname = \"a\"\n[[claim]]\ntext = \"t\"\nkind = \"lower\"\na = \"a\"\nb = \"a\"\nby = \"steps\"\n",
                      "claim.by");
  // Four runs: two variants x two seeds, variants outermost, each in its own directory.
  const auto spec = study::load_sweep(sweep_file("ok", kTwoVariants));
  const auto runs = study::expand_sweep(spec, false, kRoot / "runs");
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].variant, "small_lr");
  EXPECT_EQ(runs[0].dir, kRoot / "runs" / "ok" / "small_lr" / "seed=1");
  const auto quick = study::expand_sweep(spec, true, kRoot / "runs");
  ASSERT_EQ(quick.size(), 2u);  // [quick_grid] keeps one seed
  EXPECT_EQ(quick[1].dir, kRoot / "runs" / "ok-quick" / "big_lr" / "seed=1");
  EXPECT_EQ(quick[1].overrides[quick[1].overrides.size() - 2], "train.steps=2");  // [quick] comes last but the run dir
  expect_config_error("[[variant]]\nname = \"a\"\n[quick_grid]\n\"train.seed\" = [1]\n", "quick_grid.train.seed");
  // A variant's quick_set comes after [quick], so it can replace [quick]'s train.steps.
  const auto own = study::load_sweep(
      sweep_file("ownquick", "[quick]\n\"train.steps\" = 2\n[[variant]]\nname = \"a\"\nquick_set = { \"train.steps\" = 3 }\n"));
  const auto own_quick = study::expand_sweep(own, true, kRoot / "runs");
  ASSERT_EQ(own_quick.size(), 1u);
  EXPECT_EQ(own_quick[0].overrides[own_quick[0].overrides.size() - 3], "train.steps=2");
  EXPECT_EQ(own_quick[0].overrides[own_quick[0].overrides.size() - 2], "train.steps=3");
  EXPECT_EQ(train::load_job((kRoot / "base.toml").string(), own_quick[0].overrides).train.steps, 3);
  EXPECT_EQ(train::load_job((kRoot / "base.toml").string(), study::expand_sweep(own, false, kRoot / "runs")[0].overrides).train.steps, 4);
  expect_config_error("[[variant]]\nname = \"a\"\nquick_set = { \"train.stepz\" = 3 }\n", "train.stepz");
  for (const char* bad_budget : {"equal_time = 0.05\n", "equal_time = 1.5\ntarget_from = \"a\"\n"}) {
    try {
      study::load_sweep(sweep_file("badbudget", "[[variant]]\nname = \"a\"\n", bad_budget));
      ADD_FAILURE() << bad_budget << " must be refused";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("sweep.equal_time"), std::string::npos) << e.what();
    }
  }
  try {
    study::load_sweep(sweep_file("badplot", "[[variant]]\nname = \"a\"\n", "plot_x = [\"loss\"]\n"));
    ADD_FAILURE() << "plot_x = [\"loss\"] must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sweep.plot_x"), std::string::npos) << e.what();
  }
}

TEST_F(Sweep, RunsReusesAndWritesTheSection) {
  const std::string faster_by_steps =
      "[[claim]]\ntext = \"the larger rate gets there first\"\nkind = \"faster\"\na = \"big_lr\"\nb = \"small_lr\"\n"
      "by = \"steps\"\n";
  const auto spec = study::load_sweep(sweep_file("study", kTwoVariants + faster_by_steps, "target_from = \"small_lr\"\nlearned_by = 0.0\n"));
  study::run_sweep(spec, options());
  const auto runs = study::expand_sweep(spec, false, kRoot / "runs");
  std::vector<std::string> metrics;
  for (const auto& r : runs) metrics.push_back(read_file(r.dir / "metrics.jsonl"));
  // Again: nothing reruns, nothing is rewritten.
  study::run_sweep(spec, options());
  for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(read_file(runs[i].dir / "metrics.jsonl"), metrics[i]) << runs[i].dir;
  const std::string doc = read_file(kRoot / "results.md");
  EXPECT_NE(doc.find("<!-- study:begin"), std::string::npos);
  EXPECT_NE(doc.find("| small_lr | - | 2 | 2 |"), std::string::npos) << doc;
  EXPECT_NE(doc.find("| idle | compute utilization |"), std::string::npos) << doc;
  EXPECT_NE(doc.find("the larger learning rate ends lower"), std::string::npos) << doc;
  EXPECT_NE(doc.find("they are within 50%: **"), std::string::npos) << doc;
  EXPECT_NE(doc.find("the larger rate gets there first: **"), std::string::npos) << doc;
  EXPECT_NE(doc.find("steps to target: a "), std::string::npos) << doc;
  EXPECT_NE(doc.find("a - b per seed: seed 1: "), std::string::npos) << doc;
  // Its runs table is beside the plots, and judges these real runs' claims again bit for bit.
  const fs::path table = study::runs_table_path(kRoot / "plots", spec, false);
  ASSERT_TRUE(fs::exists(table));
  const std::string section = study::find_doc_section(doc, "study");
  const auto claims_at = section.find("\nClaims:\n\n");
  ASSERT_NE(claims_at, std::string::npos) << section;
  EXPECT_EQ(study::verdicts_from_table(spec, false, read_file(table), table.string()),
            section.substr(claims_at, section.rfind("<!-- study:end -->") - claims_at));
  // These 4-step nano models learn nothing: with the protocol's 1 nat below the unigram baseline
  // required, no claim gets a verdict.
  auto strict = spec;
  strict.learned_by = 1.0;
  std::vector<study::SweepRun> finals = runs;
  auto o = options();
  o.doc = "";
  const std::string md = study::sweep_section(strict, finals, o);
  EXPECT_NE(md.find("the larger learning rate ends lower: **says nothing: "), std::string::npos) << md;
  EXPECT_NE(md.find("nats below the unigram baseline"), std::string::npos) << md;
  EXPECT_TRUE(fs::exists(kRoot / "plots" / "study-step.png"));
  // A second sweep's section goes beside the first, which stays.
  study::run_sweep(study::load_sweep(sweep_file("other", "[[variant]]\nname = \"only\"\n", "plot_x = [\"step\", \"consensus\"]\n")),
                   options());
  EXPECT_TRUE(fs::exists(kRoot / "plots" / "other-consensus.png"));
  const std::string both = read_file(kRoot / "results.md");
  EXPECT_NE(both.find("![consensus distance versus step]"), std::string::npos) << both;
  EXPECT_NE(both.find("Training time of these 1 runs:"), std::string::npos) << both;
  EXPECT_NE(both.find("<!-- study:begin"), std::string::npos);
  EXPECT_NE(both.find("<!-- other:begin"), std::string::npos);
}

// A study without [tuning] (its seeds, if any, a grid axis) writes its quick section too: it
// crashed there once, reading the first of no tuning seeds.
TEST_F(Sweep, AnUntunedStudyWritesItsQuickSection) {
  auto o = options("untuned.md");
  o.quick = true;
  study::run_sweep(study::load_sweep(sweep_file("untuned", "[[variant]]\nname = \"v\"\n")), o);
  const std::string md = read_file(kRoot / "untuned.md");
  EXPECT_NE(md.find("<!-- untuned-quick:begin"), std::string::npos) << md;
  EXPECT_TRUE(study::load_sweep(sweep_file("untuned", "[[variant]]\nname = \"v\"\n")).seeds(true).empty());
}

TEST_F(Sweep, ARunDirectoryOfAnotherConfigurationIsRefused) {
  study::run_sweep(study::load_sweep(sweep_file("mix", "[[variant]]\nname = \"v\"\n")), options("mix.md"));
  const auto before = read_file(kRoot / "runs" / "mix" / "v" / "metrics.jsonl");
  const auto changed = study::load_sweep(sweep_file("mix", "[set]\n\"optim.lr\" = 0.01\n[[variant]]\nname = \"v\"\n"));
  try {
    study::run_sweep(changed, options("mix.md"));
    ADD_FAILURE() << "a run of another configuration must be refused";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("optim.lr"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(kRoot / "runs" / "mix" / "v" / "metrics.jsonl"), before);
  // A run records the streams it planned (train.streams = 0, auto), and a run made before the
  // setting existed (its run.json lacks it) ran one stream: it is reused at 1 and refused at 2.
  const fs::path info = kRoot / "runs" / "mix" / "v" / "run.json";
  auto doc = nlohmann::json::parse(read_file(info));
  ASSERT_EQ(doc["config"]["train"]["streams"], train::planned_streams(0, "cpu", 2, 1, std::thread::hardware_concurrency()));
  doc["config"]["train"].erase("streams");
  write_file_atomic(info, doc.dump());
  const auto one = study::load_sweep(sweep_file("mix", "[set]\n\"train.streams\" = 1\n[[variant]]\nname = \"v\"\n"));
  EXPECT_NO_THROW(study::run_sweep(one, options("mix.md")));
  EXPECT_EQ(read_file(kRoot / "runs" / "mix" / "v" / "metrics.jsonl"), before);  // reused, not rerun
  const auto streams = study::load_sweep(sweep_file("mix", "[set]\n\"train.streams\" = 2\n[[variant]]\nname = \"v\"\n"));
  try {
    study::run_sweep(streams, options("mix.md"));
    ADD_FAILURE() << "a run of one stream must not be reused for train.streams = 2";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("train.streams"), std::string::npos) << e.what();
  }
}

TEST_F(Sweep, AFullDiskStopsTheSweepAndItResumes) {
  // Every run evaluates at its last step, then writes its checkpoint. The second variant's
  // checkpoint is larger than the file-size limit (as a full disk would refuse it); the first
  // variant's fits. The third variant never starts.
  const auto spec = study::load_sweep(sweep_file(
      "disk", "[[variant]]\nname = \"small\"\nset = { \"model.n_layers\" = 1 }\n[[variant]]\nname = \"large\"\n"
              "set = { \"model.n_layers\" = 8 }\n[[variant]]\nname = \"after\"\nset = { \"model.n_layers\" = 2 }\n"));
  auto prev = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  rlimit low = old;
  low.rlim_cur = 2'500'000;  // nano with 1 layer: ~1.5 MB checkpoint; with 8 layers: ~5 MB
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &low), 0);
  bool threw = false;
  try {
    study::run_sweep(spec, options("disk.md"));
  } catch (const Error& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find("checkpoint"), std::string::npos) << e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, prev);
  ASSERT_TRUE(threw);
  const fs::path root = kRoot / "runs" / "disk";
  // The finished run gave up its checkpoint (sweep.keep_checkpoints is false) and kept its results.
  EXPECT_FALSE(fs::exists(root / "small" / "checkpoints"));
  EXPECT_FALSE(fs::exists(root / "after"));
  const auto small = read_file(root / "small" / "metrics.jsonl");
  const auto large = read_file(root / "large" / "metrics.jsonl");  // evaluated at its last step before the failure
  study::run_sweep(spec, options("disk.md"));  // space again: nothing is redone, the rest runs
  EXPECT_EQ(read_file(root / "small" / "metrics.jsonl"), small);
  EXPECT_EQ(read_file(root / "large" / "metrics.jsonl"), large);
  EXPECT_FALSE(fs::exists(root / "large" / "checkpoints"));  // finished: its checkpoints and the failed write's leftover are gone
  EXPECT_TRUE(fs::exists(root / "after" / "metrics.jsonl"));
  const std::string doc = read_file(kRoot / "disk.md");
  for (const char* row : {"| small | - | 1 | 1 |", "| large | - | 1 | 1 |", "| after | - | 1 | 1 |"}) EXPECT_NE(doc.find(row), std::string::npos) << row;
}

TEST_F(Sweep, KeepCheckpointsKeepsThem) {
  study::run_sweep(study::load_sweep(sweep_file("keep", "[[variant]]\nname = \"v\"\n", "keep_checkpoints = true\n")),
                   options("keep.md"));
  EXPECT_TRUE(fs::exists(kRoot / "runs" / "keep" / "v" / "checkpoints"));
  EXPECT_FALSE(train::RunCheckpoints(kRoot / "runs" / "keep" / "v", 1).committed(0).empty());
}

// Without --doc a sweep reports into its own directory, never into the tracked docs/results.md;
// its plots are titled and carry the data's unigram baseline line.
TEST_F(Sweep, ReportsIntoItsOwnDirectoryByDefault) {
  const auto spec = study::load_sweep(sweep_file("own", "[[variant]]\nname = \"v\"\n"));
  study::SweepOptions o;
  o.runs_root = kRoot / "runs";
  o.command = "gasloc sweep (test)";
  study::run_sweep(spec, o);
  const fs::path dir = kRoot / "runs" / "own";
  const std::string doc = read_file(dir / "results.md");
  EXPECT_NE(doc.find("<!-- own:begin"), std::string::npos) << doc;
  EXPECT_NE(doc.find("Unigram baseline of the data: "), std::string::npos) << doc;
  EXPECT_NE(doc.find("](results/own-step.png)"), std::string::npos) << doc;
  EXPECT_TRUE(fs::exists(dir / "results" / "own-step.png"));
  const std::string gp = read_file(dir / "results" / "own-step.gp");
  EXPECT_NE(gp.find("set title 'own'"), std::string::npos) << gp;
  EXPECT_NE(gp.find("title 'unigram baseline ("), std::string::npos) << gp;
  // Its files are named relative to the script, so a shipped plot points into the repository.
  EXPECT_NE(gp.find("set output 'own-step.png'"), std::string::npos) << gp;
  EXPECT_NE(gp.find("plot 'own-step.dat' index 0"), std::string::npos) << gp;
  EXPECT_EQ(gp.find(kRoot.string()), std::string::npos) << gp;
  EXPECT_FALSE(fs::exists(gasloc::test_paths::source_dir() / "docs" / "results" / "own-step.png"));
}

// A run stopped and resumed is two processes writing one metrics file, each with its wall clock
// starting at 0: the training time is the sum of the parts. Hand-written lines, hand-computed sums.
TEST(RunSummary, TrainingTimeSumsResumedPartsAndTheCurveKeepsConsensus) {
  const fs::path dir = kRoot / "summary";
  fs::create_directories(dir);
  std::ofstream(dir / "run.json") << R"({"world": 2, "config": {"algo": {"name": "gasloc", "topology": "1peer"},
    "train": {"steps": 30}, "optim": {"name": "adamw"}}})";
  std::ofstream(dir / "metrics.jsonl")
      << R"({"event":"train","step":10,"worker":1,"wall_time_s":4.0,"virtual_time_s":1.0,"bytes_sent":100})" "\n"
      << R"({"event":"eval","step":10,"val_loss":5.0,"consensus_distance":0.5,"wall_time_s":4.5,"virtual_time_s":1.0})" "\n"
      << R"({"event":"eval","step":20,"val_loss":4.0,"consensus_distance":0.25,"wall_time_s":9.0,"virtual_time_s":2.0})" "\n"
      << "{\"event\":\"eval\",\"step\":2\n"  // the first process died mid-line
      << R"({"event":"eval","step":20,"val_loss":4.0,"consensus_distance":0.25,"wall_time_s":0.5,"virtual_time_s":2.0})" "\n"
      << R"({"event":"eval","step":30,"val_loss":3.5,"consensus_distance":0.125,"wall_time_s":6.0,"virtual_time_s":3.0})" "\n";
  const auto r = study::read_run_summary(dir);
  EXPECT_DOUBLE_EQ(r.wall_s, 9.0 + 6.0);
  EXPECT_TRUE(r.finished());
  EXPECT_EQ(r.label, "gasloc-1peer");
  ASSERT_EQ(r.curve.size(), 4u);
  EXPECT_DOUBLE_EQ(r.curve.back().consensus, 0.125);
  EXPECT_DOUBLE_EQ(r.consensus, 0.125);
  const auto hit = study::reach_target(r.curve, 3.75);  // halfway from step 20 (4.0) to 30 (3.5)
  ASSERT_TRUE(hit.has_value());
  EXPECT_DOUBLE_EQ(hit->first, 25.0);
  EXPECT_DOUBLE_EQ(hit->second, 2.5);
  EXPECT_LT(r.utilization, 0.0);  // lines before metrics version 4 say nothing of it
  fs::remove_all(dir);
}

// Without an average model over processes (elastic Gloo, train.eval_model = local) every rank
// writes its own model's line: one point per step, their mean, whatever order the lines came in.
TEST(RunSummary, EachRanksOwnModelLinesMakeOnePointTheirMean) {
  const fs::path dir = kRoot / "summary_own";
  fs::create_directories(dir);
  std::ofstream(dir / "run.json") << R"({"world": 3, "config": {"algo": {"name": "gasloc", "topology": "1peer"},
    "train": {"steps": 20}, "optim": {"name": "adamw"}}})";
  auto own = [](int step, int worker, double loss, double vt) {
    return fmt::format(R"({{"event":"eval","step":{},"worker":{},"val_loss":{},"worker_val_loss":[{}],"members":[{}],)"
                       R"("wall_time_s":{},"virtual_time_s":{}}})"
                       "\n",
                       step, worker, loss, loss, worker, vt, vt);
  };
  std::ofstream(dir / "metrics.jsonl") << own(10, 0, 4.0, 1.0) << own(10, 2, 5.0, 1.5) << own(20, 0, 3.0, 2.0)
                                       << own(10, 1, 6.0, 1.2) << own(20, 1, 2.0, 2.1) << own(20, 2, 4.0, 2.2);
  const auto r = study::read_run_summary(dir);
  ASSERT_EQ(r.curve.size(), 2u);
  EXPECT_DOUBLE_EQ(r.curve[0].val_loss, 5.0);
  EXPECT_DOUBLE_EQ(r.curve[0].virtual_s, 1.5);
  EXPECT_DOUBLE_EQ(r.curve[1].val_loss, 3.0);
  EXPECT_DOUBLE_EQ(r.val_loss, 3.0);
  EXPECT_EQ(r.last_step, 20);
  // Tables say so: these are not the average model's losses.
  EXPECT_TRUE(r.own_models);
  EXPECT_NE(study::val_loss_header(true).find("own"), std::string::npos);
  EXPECT_EQ(study::val_loss_header(false), "val_loss (average model)");
  fs::remove_all(dir);
}

// Over processes a joiner listed by a view pinned ahead of its heal is healed twice: one death,
// one restart (a new incarnation), two heals.
TEST(RunSummary, DeathsRestartsAndHealsAreCountedApart) {
  const fs::path dir = kRoot / "summary_heals";
  fs::create_directories(dir);
  std::ofstream(dir / "run.json") << R"({"world": 3, "config": {"algo": {"name": "gasloc", "topology": "1peer"},
    "train": {"steps": 20}, "optim": {"name": "adamw"}}})";
  std::ofstream(dir / "metrics.jsonl")
      << R"({"event":"view","step":10,"worker":0,"round":2,"members":[0,1],"died":[2],"joined":[2],"joined_incarnations":[1],"virtual_time_s":1})"
      << "\n"
      << R"({"event":"view","step":15,"worker":0,"round":3,"members":[0,1],"died":[],"joined":[2],"joined_incarnations":[1],"virtual_time_s":2})"
      << "\n";
  const auto r = study::read_run_summary(dir);
  EXPECT_EQ(r.deaths, 1);
  EXPECT_EQ(r.restarts, 1);
  EXPECT_EQ(r.rejoins, 2);
  fs::remove_all(dir);
}

// An elastic run's view changes: counted in the summary and drawn as ticks on loss plots against
// step or time (red where a worker died, green where one rejoined), never on a bytes plot.
TEST(RunSummary, ViewChangesAreCountedAndMarkedOnThePlot) {
  const fs::path dir = kRoot / "summary_views";
  fs::create_directories(dir);
  std::ofstream(dir / "run.json") << R"({"world": 3, "config": {"algo": {"name": "diloco"},
    "train": {"steps": 20}, "optim": {"name": "adamw"}}})";
  std::ofstream(dir / "metrics.jsonl")
      << R"({"event":"view","step":10,"worker":0,"round":1,"members":[0,2],"died":[1],"joined":[],"virtual_time_s":11.5})"
      << "\n"
      << R"({"event":"view","step":15,"worker":0,"round":2,"members":[0,1,2],"died":[],"joined":[1],"virtual_time_s":17.25})"
      << "\n"
      << R"({"event":"eval","step":20,"worker":0,"val_loss":4.0,"wall_time_s":3,"virtual_time_s":22})" << "\n";
  const auto r = study::read_run_summary(dir);
  EXPECT_EQ(r.deaths, 1);
  EXPECT_EQ(r.rejoins, 1);
  EXPECT_FALSE(r.own_models);  // an average model's line
  EXPECT_EQ(r.restarts, 1);  // in-process: every heal is a restart
  ASSERT_EQ(r.views.size(), 2u);
  EXPECT_EQ(r.views[1].step, 15);
  EXPECT_DOUBLE_EQ(r.views[1].virtual_s, 17.25);
  study::plot_runs({r}, {"run"}, dir / "time.png", "time", {});
  const std::string gp = read_file(dir / "time.gp");
  EXPECT_NE(gp.find("set arrow from 11.5, graph 0 to 11.5, graph 0.05 nohead linecolor 'red'"), std::string::npos) << gp;
  EXPECT_NE(gp.find("set arrow from 17.25, graph 0.05 to 17.25, graph 0.1 nohead linecolor 'forest-green'"),
            std::string::npos) << gp;
  EXPECT_NE(gp.find("title 'a worker died (tick)'"), std::string::npos) << gp;
  study::plot_runs({r}, {"run"}, dir / "step.png", "step", {});
  EXPECT_NE(read_file(dir / "step.gp").find("set arrow from 10, graph 0 to 10,"), std::string::npos);
  study::plot_runs({r}, {"run"}, dir / "bytes.png", "bytes", {});
  EXPECT_EQ(read_file(dir / "bytes.gp").find("set arrow"), std::string::npos);
  fs::remove_all(dir);
}

// Compute utilization: the mean over workers of their last line's, shown where every worker has one.
TEST(RunSummary, UtilizationIsTheWorkersMeanAtTheirLastLine) {
  const fs::path dir = kRoot / "summary_util";
  fs::create_directories(dir);
  std::ofstream(dir / "run.json") << R"({"world": 2, "config": {"algo": {"name": "diloco"}, "train": {"steps": 20}, "optim": {"name": "adamw"}}})";
  std::ofstream(dir / "metrics.jsonl")
      << R"({"event":"train","step":10,"worker":0,"virtual_time_s":1.0,"compute_s":0.9,"utilization":0.9,"version":4})" "\n"
      << R"({"event":"train","step":20,"worker":0,"virtual_time_s":4.0,"compute_s":2.0,"utilization":0.5,"version":4})" "\n"
      << R"({"event":"train","step":20,"worker":1,"virtual_time_s":4.0,"compute_s":3.0,"utilization":0.75,"version":4})" "\n";
  EXPECT_DOUBLE_EQ(study::read_run_summary(dir).utilization, 0.625);
  // A worker whose line lacks it (an older gasloc resumed by a newer one) leaves the run without one.
  std::ofstream(dir / "metrics.jsonl", std::ios::app) << R"({"event":"train","step":20,"worker":2,"virtual_time_s":4.0})" "\n";
  EXPECT_LT(study::read_run_summary(dir).utilization, 0.0);
  fs::remove_all(dir);
}

// A time-to-target claim can read its target earlier in the reference's runs (target_at), as the
// heterogeneity study does: hand-written curves, hand-computed crossings.
TEST(SweepClaims, TargetAtReadsTheReferenceEarlierAndInterpolates) {
  const fs::path root = kRoot / "target_at";
  auto write_run = [&](const std::string& name, const std::vector<std::array<double, 3>>& evals) {
    return write_eval_run(root / name, name, 0, evals);
  };
  // ref: loss 6.5 at step 90 (time 90), 6.0 at the end. fast: from 6.6 at step 90 (time 30) to
  // 6.2 at 120 (time 40), so it crosses 6.5 a quarter of the way: step 97.5, time 32.5; it never
  // reaches ref's final 6.0.
  const std::vector<study::SweepRun> runs = {write_run("ref", {{{30, 8.0, 30}, {60, 7.0, 60}, {90, 6.5, 90}, {120, 6.0, 120}}}),
                                             write_run("fast", {{{30, 7.5, 10}, {60, 6.8, 20}, {90, 6.6, 30}, {120, 6.2, 40}}})};
  study::SweepSpec spec;
  spec.name = spec.title = "t";
  spec.target_from = "ref";
  spec.plot_x.clear();
  spec.variants = {{"ref", {}, {}, {}}, {"fast", {}, {}, {}}};
  study::SweepClaim at_end{"fast reaches ref's final loss 2x sooner", "faster", "fast", "ref", 1.0};
  study::SweepClaim early = at_end;
  early.text = "fast reaches ref's 3/4 loss 2x sooner";
  early.target_at = 0.75;
  spec.claims = {at_end, early};
  study::SweepOptions o;
  o.doc = "";
  o.command = "test";
  const std::string md = study::sweep_section(spec, runs, o);
  EXPECT_NE(md.find("fast reaches ref's final loss 2x sooner: **not reproduced** (a = fast, b = ref; virtual s to target: a -, "
                    "b 120.0; a x 2.00 - b (virtual s) per seed: one run: only b reached"),
            std::string::npos) << md;
  EXPECT_NE(md.find("fast reaches ref's 3/4 loss 2x sooner: **reproduced** (a = fast, b = ref; virtual s to target 6.5000 "
                    "(ref's loss at 75% of its steps, the highest of its runs): a 32.5, b 90.0; a x 2.00 - b (virtual s) per seed: one run: -25.0"),
            std::string::npos) << md;
  fs::remove_all(root);
}

// Issue 66: the unigram gate is the reference's. Unigram baseline 7.0, learned_by 1.0: a run has
// learned when it ends at or below 6.0. ref ends at 5.5 and 5.6 (learned), sub at 6.4 and 6.5
// (not: its worst is 0.50 nats below the baseline), late at 6.2 and 6.3 (not either).
TEST(SweepClaims, UnigramGateIsTheReferences) {
  const fs::path root = kRoot / "gate";
  const fs::path data = unigram_data(root, 7.0);
  std::vector<study::SweepRun> runs;
  auto write_run = [&](const std::string& name, int64_t seed, double final_loss) {
    runs.push_back(write_run_on(data, root / fmt::format("{}-{}", name, seed), name, seed, {{{60, 6.8, 60}, {120, final_loss, 120}}}));
  };
  write_run("ref", 1, 5.5);
  write_run("ref", 2, 5.6);
  write_run("sub", 1, 6.4);
  write_run("sub", 2, 6.5);
  write_run("late", 1, 6.2);
  write_run("late", 2, 6.3);
  study::SweepSpec spec;
  spec.name = spec.title = "t";
  spec.plot_x.clear();
  spec.variants = {{"ref", {}, {}, {}}, {"sub", {}, {}, {}}, {"late", {}, {}, {}}};
  spec.claims = {{"sub ends lower than ref", "lower", "sub", "ref"},
                 {"ref is within 1% of sub", "within", "ref", "sub", 0.01},
                 {"sub is within 1% of late", "within", "sub", "late", 0.01}};
  study::SweepOptions o;
  o.doc = "";
  o.command = "test";
  const std::string md = study::sweep_section(spec, runs, o);
  // The subject did not learn while its reference did: a failure, with the reason.
  EXPECT_NE(md.find("- sub ends lower than ref: **not reproduced: sub's worst run ends 0.50 nats below the unigram baseline "
                    "7.0000, not the 1.0 a verdict needs, while ref learned** (a = sub, b = ref; final loss: a 6.4500"),
            std::string::npos) << md;
  // The reference did not learn: nothing to compare against, whatever the subject did.
  EXPECT_NE(md.find("- ref is within 1% of sub: **says nothing: sub's worst run ends 0.50 nats below the unigram baseline"),
            std::string::npos) << md;
  EXPECT_NE(md.find("- sub is within 1% of late: **says nothing: late's worst run ends 0.70 nats below the unigram baseline"),
            std::string::npos) << md;
  fs::remove_all(root);
}

// Issue 66: the runs table holds what the verdicts read, so judging again from it alone gives the
// section's verdict lines bit for bit. Two groups (lr, with a comma in their names: workers too),
// two seeds, every kind of claim, the unigram gate (baseline 7.0) and an earlier target.
TEST(SweepClaims, ReverdictFromTheRunsTableGivesTheSectionsVerdicts) {
  const fs::path root = kRoot / "reverdict";
  fs::remove_all(root);
  const fs::path data = unigram_data(root, 7.0);
  study::SweepSpec spec;
  spec.name = spec.title = "rv";
  spec.file = root / "rv.toml";
  spec.target_from = "ref";
  spec.plot_x.clear();
  spec.grid = {{"optim.lr", {0.001, 0.002}}, {"cluster.workers", {2}}, {"train.seed", {1, 2}}};
  spec.variants = {{"ref", {}, {}, {}}, {"fast", {}, {}, {}}, {"stuck", {}, {}, {}}};
  study::SweepClaim faster{"fast reaches ref's loss sooner", "faster", "fast", "ref", 0.5};
  study::SweepClaim early = faster;
  early.text = "fast reaches ref's halfway loss in fewer steps";
  early.target_at = 0.5;
  early.by = "steps";
  spec.claims = {faster, early, {"fast ends lower", "lower", "fast", "ref"}, {"fast within 1%", "within", "fast", "ref", 0.01},
                 {"stuck is no worse", "no_worse", "stuck", "ref", 0.01}};
  std::vector<study::SweepRun> runs;
  for (double lr : {0.001, 0.002})
    for (int64_t seed : {1, 2}) {
      // Losses in 1/16ths: exact in binary, so the hand-computed crossings below are exact too.
      const double shift = 0.0625 * static_cast<double>(seed) + (lr > 0.0015 ? 0.0625 : 0.0);
      auto add = [&](const std::string& variant, const std::vector<std::array<double, 3>>& evals) {
        auto r = write_run_on(data, root / fmt::format("{}-{}-{}", variant, lr, seed), variant, 0, evals);
        r.point = {{"optim.lr", lr}, {"cluster.workers", 2}, {"train.seed", seed}};  // the seed from the grid, as untuned runs
        runs.push_back(r);
      };
      add("ref", {{{60, 6.25 + shift, 60}, {120, 5.75 + shift, 120}}});
      add("fast", {{{60, 5.9375 + shift, 30}, {120, 5.6875 + shift, 60}}});
      add("stuck", {{{60, 6.625 + shift, 60}, {120, 6.4375 + shift, 120}}});
    }
  study::SweepOptions o;
  o.doc = "";
  o.command = "test";
  const study::SweepReport report = study::sweep_report(spec, runs, o);
  const std::string& md = report.section;
  const auto claims_at = md.find("\nClaims:\n\n");
  ASSERT_NE(claims_at, std::string::npos) << md;
  const std::string claims = md.substr(claims_at, md.rfind("<!-- rv:end -->") - claims_at);
  EXPECT_NE(claims.find("- stuck is no worse [lr=0.001,workers=2]: **not reproduced: stuck's worst run ends 0.44 nats"),
            std::string::npos) << claims;
  // The table's columns, and a row: ref's seed 1 at lr 0.001, finished at 5.8125 on data whose
  // baseline is 7, its virtual time 0 (no train lines); it crosses the group's target 5.875 (seed
  // 2's final loss) at step 112.5 (6.3125 at 60 to 5.8125 at 120: 0.4375 of 0.5 down), second 112.5.
  EXPECT_EQ(report.runs_csv.substr(0, report.runs_csv.find('\n')),
            "run,variant,group,tune,tuning,seed,finished,val_loss,unigram,virtual_s,eval_s,steps_to_target,virtual_s_to_target,"
            "mb_per_worker,consensus,utilization,loss_at_0.5,steps_to_target_at_0.5,virtual_s_to_target_at_0.5");
  EXPECT_NE(report.runs_csv.find(",ref,\"lr=0.001,workers=2\",,0,1,1,5.8125,7,0,0,112.5,112.5,"), std::string::npos)
      << report.runs_csv;
  EXPECT_EQ(study::verdicts_from_table(spec, false, report.runs_csv, "test"), claims);

  // --reverdict on a document: its claim lines, whatever they say, become the table's.
  const fs::path doc = root / "results.md";
  study::write_doc_section(doc, "rv", md);
  std::string stale = read_file(doc);
  stale.replace(stale.find("\nClaims:\n\n"), claims.size(), "\nClaims:\n\n- stale verdict\n");
  write_file_atomic(doc, stale);
  EXPECT_NE(study::reverdict(doc, spec, false).find("no runs table"), std::string::npos);
  EXPECT_NE(read_file(doc).find("- stale verdict\n"), std::string::npos);
  write_file_atomic(study::runs_table_path(root / "results", spec, false), report.runs_csv);
  EXPECT_NE(study::reverdict(doc, spec, false).find("judged again from"), std::string::npos);
  EXPECT_EQ(study::find_doc_section(read_file(doc), "rv"), md);
  // A table that lacks a column is refused, naming it.
  std::string cut = report.runs_csv;
  cut.replace(cut.find(",eval_s"), 7, "");
  write_file_atomic(study::runs_table_path(root / "results", spec, false), cut);
  try {
    study::reverdict(doc, spec, false);
    ADD_FAILURE() << "a table without eval_s must be refused";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("no column 'eval_s'"), std::string::npos) << e.what();
  }
  fs::remove_all(root);
}

// The target is the highest of the reference's final losses, which each of its seeds reaches (with
// their mean, 6.1, seed 2 would never reach its own reference's target): hand-computed crossings.
TEST(SweepClaims, TargetIsTheReferencesHighestFinalLoss) {
  const fs::path root = kRoot / "target_highest";
  auto write_run = [&](const std::string& name, int64_t seed, const std::vector<std::array<double, 3>>& evals) {
    return write_eval_run(root / fmt::format("{}-{}", name, seed), name, seed, evals);
  };
  // ref ends at 6.0, 6.2 and 6.1 from 6.6 at time 60: it crosses 6.2 at times 100, 120 and 108.
  // fast goes from 6.4 (time 20) to 6.0 (time 40) on every seed: it crosses 6.2 at time 30.
  std::vector<study::SweepRun> runs;
  const double ref_final[] = {6.0, 6.2, 6.1};
  for (int64_t seed = 1; seed <= 3; ++seed) {
    runs.push_back(write_run("ref", seed, {{{60, 6.6, 60}, {120, ref_final[seed - 1], 120}}}));
    runs.push_back(write_run("fast", seed, {{{60, 6.4, 20}, {120, 6.0, 40}}}));
  }
  study::SweepSpec spec;
  spec.name = spec.title = "t";
  spec.target_from = "ref";
  spec.plot_x.clear();
  spec.variants = {{"ref", {}, {}, {}}, {"fast", {}, {}, {}}};
  spec.claims = {{"fast reaches ref's final loss 2x sooner", "faster", "fast", "ref", 1.0}};
  study::SweepOptions o;
  o.doc = "";
  o.command = "test";
  const std::string md = study::sweep_section(spec, runs, o);
  EXPECT_NE(md.find("Target validation loss: 6.2000 (the highest final loss of ref's runs"), std::string::npos) << md;
  // a x 2 - b per seed: 60 - 100, 60 - 120, 60 - 108; b's spread 20.
  EXPECT_NE(md.find("fast reaches ref's final loss 2x sooner: **reproduced** (a = fast, b = ref; virtual s to target: "
                    "a 30.0 (30.0-30.0), b 109.3 (100.0-120.0); a x 2.00 - b (virtual s) per seed: seed 1: -40.0, seed 2: -60.0, "
                    "seed 3: -48.0"),
            std::string::npos) << md;
  fs::remove_all(root);
}

// sweep.equal_time: a faster-by-time verdict needs every run to have had the reference's virtual
// time, to within the declared fraction below it. Hand-written curves: ref ends at 6.0 at 120 s;
// fast crosses 6.0 at 30 s and ends at 5.8 at 40 s, far below the budget, so no verdict until its
// runs take their share of the budget (ending at 115 s: within 5%).
TEST(SweepClaims, EqualTimeBudgetGatesTheFasterVerdict) {
  const fs::path root = kRoot / "equal_time";
  study::SweepSpec spec;
  spec.name = spec.title = "t";
  spec.target_from = "ref";
  spec.equal_time = 0.05;
  spec.plot_x.clear();
  spec.variants = {{"ref", {}, {}, {}}, {"fast", {}, {}, {}}};
  spec.claims = {{"fast reaches ref's final loss sooner", "faster", "fast", "ref"},
                 {"fast reaches it in fewer steps", "faster", "fast", "ref", 0.0, "steps"}};
  study::SweepOptions o;
  o.doc = "";
  o.command = "test";
  // A run's virtual time is its workers' clock in their train lines, here that of its last eval.
  auto write_run = [&](const std::string& dir, const std::string& variant, const std::vector<std::array<double, 3>>& evals) {
    auto r = write_eval_run(root / dir, variant, 0, evals);
    std::ofstream(root / dir / "metrics.jsonl", std::ios::app)
        << "{\"event\":\"train\",\"step\":120,\"worker\":0,\"virtual_time_s\":" << evals.back()[2] << "}\n";
    return r;
  };
  const auto ref = write_run("ref", "ref", {{{60, 6.5, 60}, {120, 6.0, 120}}});
  const auto short_run = write_run("short", "fast", {{{60, 6.2, 20}, {120, 5.8, 40}}});
  std::string md = study::sweep_section(spec, {ref, short_run}, o);
  EXPECT_NE(md.find("Virtual-time budget: 120.0 s, ref's; each variant's train.steps is set in the study file so that its runs "
                    "end at most 5% below it (sweep.equal_time): ref 120.0 s, fast 40.0 s (outside it)."),
            std::string::npos) << md;
  EXPECT_NE(md.find("fast reaches ref's final loss sooner: **says nothing: fast's runs ended at 40.0 virtual s, not within 5% "
                    "below the budget of 120.0 s (ref's)"),
            std::string::npos) << md;
  // By steps the budget does not apply: 6.0 at step 90 (halfway from 6.2 to 5.8) against 120.
  EXPECT_NE(md.find("fast reaches it in fewer steps: **reproduced**"), std::string::npos) << md;
  // Longer than the budget is refused too.
  const auto long_run = write_run("long", "fast", {{{60, 6.2, 60}, {120, 5.8, 121}}});
  md = study::sweep_section(spec, {ref, long_run}, o);
  EXPECT_NE(md.find("fast's runs ended at 121.0 virtual s"), std::string::npos) << md;
  // 6.0 at 87.5 s (halfway from 60 to 115) against ref's 120 s, 115 s within 5% of the budget: judged.
  const auto fair_run = write_run("fair", "fast", {{{60, 6.2, 60}, {120, 5.8, 115}}});
  md = study::sweep_section(spec, {ref, fair_run}, o);
  EXPECT_NE(md.find("fast reaches ref's final loss sooner: **reproduced** (a = fast, b = ref; virtual s to target: a 87.5, b 120.0"),
            std::string::npos) << md;
  fs::remove_all(root);
}

// The verdict rules on hand-made numbers: pairing by seed, the spread to exceed, the tolerance.
TEST(SweepVerdicts, PairedDifferencesMustExceedTheSeedsSpread) {
  using study::BySeed;
  // a lower on every seed by 0.10, each method's range 0.02: reproduced.
  EXPECT_EQ(study::judge_lower(BySeed{{1, 4.90}, {2, 4.92}, {3, 4.91}}, BySeed{{1, 5.00}, {2, 5.02}, {3, 5.01}}).verdict, "reproduced");
  // b lower on every seed: not reproduced.
  EXPECT_EQ(study::judge_lower(BySeed{{1, 5.00}, {2, 5.02}}, BySeed{{1, 4.90}, {2, 4.92}}).verdict, "not reproduced");
  // lower on every seed by 0.05, and a's own range (0.30) is larger: the paired differences
  // (-0.05, -0.05) have no spread, so it is reproduced.
  EXPECT_EQ(study::judge_lower(BySeed{{1, 4.70}, {2, 5.00}}, BySeed{{1, 4.75}, {2, 5.05}}).verdict, "reproduced");
  // lower on every seed, by 0.05 and 0.01: mean -0.03 within the differences' spread 0.04.
  EXPECT_EQ(study::judge_lower(BySeed{{1, 4.70}, {2, 5.00}}, BySeed{{1, 4.75}, {2, 5.01}}).verdict,
            "inconclusive (the difference is within the spread of the paired differences)");
  // the seeds disagree on the sign.
  EXPECT_EQ(study::judge_lower(BySeed{{1, 4.9}, {2, 5.1}}, BySeed{{1, 5.0}, {2, 5.0}}).verdict, "inconclusive (the seeds disagree)");
  // Seeds pair by number: seed 3 ran for a only, so it is left out (the spread too).
  const auto j = study::judge_lower(BySeed{{1, 4.9}, {2, 4.9}, {3, 9.0}}, BySeed{{1, 5.0}, {2, 5.0}});
  EXPECT_EQ(j.verdict, "reproduced");
  EXPECT_NE(j.numbers.find("seed 1: -0.1000, seed 2: -0.1000; paired rule (docs/experiments.md): mean paired difference -0.1000, "
                           "spread of the paired differences 0.0000"),
            std::string::npos) << j.numbers;
  EXPECT_NEAR(study::seed_spread(BySeed{{1, 4.9}, {2, 4.95}, {3, 9.0}}, BySeed{{1, 5.0}, {2, 5.1}}), 0.1, 1e-12);
  EXPECT_NEAR(study::paired_spread(BySeed{{1, 4.9}, {2, 4.95}, {3, 9.0}}, BySeed{{1, 5.0}, {2, 5.1}}), 0.05, 1e-12);
  // No seed shared: today's rule on the means, the larger own range (0.1) the noise, and it says so.
  const auto unpaired = study::judge_lower(BySeed{{1, 4.8}, {2, 4.9}}, BySeed{{3, 5.0}, {4, 5.05}});
  EXPECT_EQ(unpaired.verdict, "reproduced");  // -0.175 beyond 0.1
  EXPECT_NE(unpaired.numbers.find("unpaired rule (no seed ran both; docs/experiments.md): mean a - mean b -0.1750, seeds' spread "
                                  "0.1000"),
            std::string::npos) << unpaired.numbers;
  EXPECT_EQ(study::judge_lower(BySeed{{1, 4.8}, {2, 4.9}}, BySeed{{3, 4.9}, {4, 4.95}}).verdict,
            "inconclusive (the difference is within the seeds' spread)");  // -0.075 within 0.1
  EXPECT_EQ(study::judge_lower(BySeed{{1, 4.9}}, BySeed{}).verdict, "inconclusive (no seed ran both)");
  // within 2% of 5.01 = 0.1002: a paired gap of 0.05 on both seeds (no spread) holds; 0.2 does not;
  // gaps of 0.05 and 0.13 (mean 0.09, spread 0.08) straddle the tolerance.
  EXPECT_EQ(study::judge_within(BySeed{{1, 5.05}, {2, 5.07}}, BySeed{{1, 5.0}, {2, 5.02}}, 0.02).verdict, "reproduced");
  EXPECT_EQ(study::judge_within(BySeed{{1, 5.2}, {2, 5.22}}, BySeed{{1, 5.0}, {2, 5.02}}, 0.02).verdict, "not reproduced");
  EXPECT_EQ(study::judge_within(BySeed{{1, 5.05}, {2, 5.15}}, BySeed{{1, 5.0}, {2, 5.02}}, 0.02).verdict,
            "inconclusive (the gap is within the spread of the paired differences of the tolerance)");
  // faster with tolerance 1 (2x): 40 vs 100 and 45 vs 100 hold (2a - b = -20, -10; spread 5).
  const double never = std::numeric_limits<double>::infinity();
  EXPECT_EQ(study::judge_faster(BySeed{{1, 40}, {2, 45}}, BySeed{{1, 100}, {2, 100}}, 1.0, "steps").verdict, "reproduced");
  EXPECT_EQ(study::judge_faster(BySeed{{1, never}, {2, never}}, BySeed{{1, 100}, {2, 90}}, 1.0, "steps").verdict, "not reproduced");
  EXPECT_EQ(study::judge_faster(BySeed{{1, 40}, {2, never}}, BySeed{{1, 100}, {2, never}}, 1.0, "steps").verdict,
            "inconclusive (on some seed neither reached the target)");
}

// Fair tuning: each variant's own grid runs on the tuning seed, the best point reruns on the
// fresh seeds, untuned variants run on them directly, and the section shows the grid.
TEST_F(Sweep, TuningChoosesEachVariantsBestPointThenRerunsItOnFreshSeeds) {
  expect_config_error("[[variant]]\nname = \"a\"\ntune = { \"optim.lr\" = [0.001, 0.01] }\n", "a tuning grid needs a [tuning]");
  expect_config_error("[tuning]\nseed = 7\nseeds = [7, 8]\n[[variant]]\nname = \"a\"\n", "fresh seeds");
  expect_config_error("[tuning]\nseed = 7\nseeds = [1]\n[grid]\n\"train.seed\" = [1]\n[[variant]]\nname = \"a\"\n", "grid.train.seed");
  expect_config_error("[tuning]\nseed = 7\nseeds = [1]\n[[variant]]\nname = \"a\"\ntune = { \"optim.lr\" = [0.001] }\n"
                      "quick_tune = { \"optim.beta1\" = [0.9] }\n",
                      "quick_tune.optim.beta1");
  const std::string body = R"(
[tuning]
seed = 7
seeds = [1, 2]
[[variant]]
name = "tuned"
tune = { "optim.lr" = [0.0001, 0.01] }
[[variant]]
name = "fixed"
set = { "optim.lr" = 0.003 }
[[claim]]
text = "tuned ends lower"
kind = "lower"
a = "tuned"
b = "fixed"
)";
  const auto spec = study::load_sweep(sweep_file("tuning", body, "learned_by = 0.0\n"));
  const auto tuning = study::expand_tuning(spec, false, kRoot / "runs");
  ASSERT_EQ(tuning.size(), 2u);  // the untuned variant has no tuning runs
  EXPECT_EQ(tuning[1].dir, kRoot / "runs" / "tuning" / "tuned" / "tune" / "lr=0.01");
  EXPECT_NE(std::find(tuning[1].overrides.begin(), tuning[1].overrides.end(), "train.seed=7"), tuning[1].overrides.end());
  // Before tuning, the tuned variant's final runs are provisional (a dry run says so).
  const auto before = study::expand_final(spec, false, kRoot / "runs", {});
  ASSERT_EQ(before.size(), 4u);
  EXPECT_TRUE(before[0].provisional);
  EXPECT_FALSE(before[2].provisional);
  EXPECT_EQ(before[3].dir, kRoot / "runs" / "tuning" / "fixed" / "seed=2");
  study::run_sweep(spec, options("tuning.md"));
  const double loss_lo = study::read_run_summary(tuning[0].dir).val_loss, loss_hi = study::read_run_summary(tuning[1].dir).val_loss;
  ASSERT_NE(loss_lo, loss_hi);
  const study::Point best = loss_lo < loss_hi ? tuning[0].tune : tuning[1].tune;
  const auto chosen = study::choose_points(spec, tuning);
  ASSERT_EQ(chosen.size(), 1u);
  EXPECT_EQ(chosen.begin()->second, best);
  const auto finals = study::expand_final(spec, false, kRoot / "runs", chosen);
  EXPECT_EQ(finals[0].dir, kRoot / "runs" / "tuning" / "tuned" / (study::point_name(best) + ",seed=1"));
  for (const auto& r : finals) {
    ASSERT_TRUE(study::read_run_summary(r.dir).finished()) << r.dir;
    const auto cfg = nlohmann::json::parse(read_file(r.dir / "run.json"));
    EXPECT_EQ(cfg["config"]["train"]["seed"].get<int64_t>(), r.seed) << r.dir;
  }
  const std::string doc = read_file(kRoot / "tuning.md");
  EXPECT_NE(doc.find("| tuned | **" + study::point_name(best) + "** |"), std::string::npos) << doc;
  EXPECT_NE(doc.find("| tuned | " + study::point_name(best) + " | 2 | 2 |"), std::string::npos) << doc;
  EXPECT_NE(doc.find("tuned ends lower"), std::string::npos) << doc;
  EXPECT_NE(doc.find("seed 1: "), std::string::npos) << doc;
}

// The paper-scale projection prices a finished run's rounds with the network model by hand:
// DiLoCo on 2 workers, 4 steps at H = 2 is 2 rounds of a 2-worker ring all-reduce of the 134m
// model in bf16: 2 l + P / B each.
TEST_F(Sweep, ProjectionPricesTheRunsRoundsAtPaperScale) {
  const auto spec = study::load_sweep(sweep_file("proj", R"(
[set]
"cluster.workers" = 2
"algo.name" = "diloco"
"algo.H" = 2
[[variant]]
name = "diloco"
[[variant]]
name = "diloco-int8"
set = { "algo.compression" = "int8" }
)", "project = [\"134m:bf16\"]\n"));
  study::run_sweep(spec, options("proj.md"));
  const auto runs = study::expand_sweep(spec, false, kRoot / "runs");
  const auto p = study::project_run(runs[0].dir, "134m:bf16");
  const double P = 2.0 * static_cast<double>(model::LlamaConfig::preset("134m").num_params());
  EXPECT_EQ(p.rounds, 2);
  EXPECT_NEAR(p.seconds_per_round, 2 * 0.001 + P / 125e6, 1e-9);
  EXPECT_NEAR(p.slowest_per_round, p.seconds_per_round, 1e-12);
  EXPECT_NEAR(p.mb_per_round, P / 1e6, 1e-6);
  EXPECT_NEAR(p.compute_s, 4 * 0.1, 1e-12);
  // int8: the owners' all-reduce of the 134m model's parameters in chunks of 256 (256 codes and
  // a 4-byte scale each): 2 (n - 1) = 2 payloads of half the chunks, over the same ring's terms.
  const auto q = study::project_run(runs[1].dir, "134m:bf16");
  const int64_t chunks = (model::LlamaConfig::preset("134m").num_params() + 255) / 256;
  const double int8 = 2.0 * 260.0 * static_cast<double>((chunks + 1) / 2);
  EXPECT_NEAR(q.mb_per_round, int8 / 1e6, 1e-6);
  EXPECT_NEAR(q.seconds_per_round, 2 * 0.001 + int8 / 125e6, 1e-9);
  EXPECT_NE(read_file(kRoot / "proj.md").find("At paper scale (134m:bf16)"), std::string::npos);
  try {
    study::load_sweep(sweep_file("badproj", "[[variant]]\nname = \"a\"\n", "project = [\"134m:int3\"]\n"));
    ADD_FAILURE() << "a bad projection model must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sweep.project"), std::string::npos) << e.what();
  }
}

// Issue 66: the noise of a paired difference is the spread of the differences. Each side's own
// spread (0.07 for b, 0.071 for a) exceeds the 1% tolerance (0.01 x mean b 4.54 = 0.0454), yet the
// paired differences (+0.002, -0.001, +0.003: mean +0.0013, spread 0.004) are far inside it.
TEST(SweepVerdicts, PairedClaimHoldsThoughEachSidesSpreadExceedsTheTolerance) {
  using study::BySeed;
  const BySeed b{{1, 4.50}, {2, 4.55}, {3, 4.57}};
  const BySeed a{{1, 4.502}, {2, 4.549}, {3, 4.573}};
  ASSERT_GT(study::seed_spread(a, b), 0.0454);
  EXPECT_NEAR(study::paired_spread(a, b), 0.004, 1e-12);
  const auto j = study::judge_within(a, b, 0.01);
  EXPECT_EQ(j.verdict, "reproduced") << j.numbers;  // 0.0013 + 0.004 <= 0.0454
  EXPECT_NE(j.numbers.find("paired rule (docs/experiments.md): mean paired difference +0.0013, spread of the paired differences "
                           "0.0040; allowed gap 0.0454"),
            std::string::npos) << j.numbers;
  EXPECT_EQ(study::judge_no_worse(a, b, 0.01).verdict, "reproduced");
  // A paired gap of 0.05 on every seed (spread 0) is beyond it: not reproduced.
  EXPECT_EQ(study::judge_within(BySeed{{1, 4.55}, {2, 4.60}, {3, 4.62}}, b, 0.01).verdict, "not reproduced");
}

// "Competitive" is one-sided: ending lower never refutes it; ending more than the tolerance above
// (beyond the spread) does.
TEST(SweepVerdicts, NoWorseCountsBeingBetterAsHolding) {
  using study::BySeed;
  const BySeed b{{1, 5.0}, {2, 5.02}};
  EXPECT_EQ(study::judge_no_worse(BySeed{{1, 4.5}, {2, 4.52}}, b, 0.02).verdict, "reproduced");
  EXPECT_EQ(study::judge_within(BySeed{{1, 4.5}, {2, 4.52}}, b, 0.02).verdict, "not reproduced");  // the two-sided claim
  EXPECT_EQ(study::judge_no_worse(BySeed{{1, 5.05}, {2, 5.07}}, b, 0.02).verdict, "reproduced");  // +0.05 + 0 <= 0.1
  EXPECT_EQ(study::judge_no_worse(BySeed{{1, 5.2}, {2, 5.22}}, b, 0.02).verdict, "not reproduced");
  EXPECT_EQ(study::judge_no_worse(BySeed{{1, 5.05}, {2, 5.15}}, b, 0.02).verdict.rfind("inconclusive", 0), 0u);  // 0.09 +- 0.08
  // A run without a seed (an untuned grid point) is named as such.
  EXPECT_NE(study::judge_lower(BySeed{{0, 4.0}}, BySeed{{0, 5.0}}).numbers.find("one run: -1.0000"), std::string::npos);
}

// [[scenario]]: each is a group with its own settings (after [set], before the variant's) and,
// where it lists them, its own variants; a claim is judged in the scenarios it names only.
TEST_F(Sweep, ScenariosAreGroupsWithTheirOwnSettingsAndVariants) {
  const std::string variants = "[[variant]]\nname = \"a\"\n[[variant]]\nname = \"b\"\nset = { \"optim.lr\" = 0.01 }\n";
  const std::string slow_only_a = "[[scenario]]\nname = \"fast\"\n[[scenario]]\nname = \"slow\"\nvariants = [\"a\"]\n";
  expect_config_error(slow_only_a + variants + "[[claim]]\ntext = \"t\"\nkind = \"lower\"\na = \"a\"\nb = \"b\"\n",
                      "scenario 'slow' does not run variant 'b'");
  expect_config_error(slow_only_a + variants + "[[claim]]\ntext = \"t\"\nkind = \"lower\"\na = \"a\"\nb = \"b\"\nscenarios = [\"mid\"]\n",
                      "'mid' is not a [[scenario]]");
  expect_config_error("[[scenario]]\nname = \"x\"\nvariants = [\"zz\"]\n" + variants, "scenario.x.variants");
  expect_config_error("[[scenario]]\nname = \"x\"\n[[scenario]]\nname = \"x\"\n" + variants, "appears twice");
  expect_config_error("[[scenario]]\nname = \"x,y\"\n" + variants, "scenario.name");
  expect_config_error("[[scenario]]\nname = \"x\"\nset = { \"network.stragglerz\" = 1 }\n" + variants, "network.stragglerz");
  expect_config_error("[[scenario]]\nname = \"x\"\nspeed = 1\n" + variants, "scenario.speed");
  const std::string body = R"(
[set]
"cluster.workers" = 2
"algo.name" = "diloco"
"algo.H" = 2
[[scenario]]
name = "fast"
[[scenario]]
name = "slow"
set = { "network.stragglers" = [{ rank = 1, bandwidth = 0.01 }] }
variants = ["a"]
)" + variants + R"(
[[claim]]
text = "a ends lower than b"
kind = "lower"
a = "a"
b = "b"
scenarios = ["fast"]
)";
  const auto spec = study::load_sweep(sweep_file("scen", body, "learned_by = 0.0\n"));
  const auto runs = study::expand_sweep(spec, false, kRoot / "runs");
  ASSERT_EQ(runs.size(), 3u);  // a in both scenarios, b in "fast" only
  EXPECT_EQ(runs[1].dir, kRoot / "runs" / "scen" / "a" / "slow");
  EXPECT_EQ(runs[2].dir, kRoot / "runs" / "scen" / "b" / "fast");
  const auto& o = runs[1].overrides;
  const auto straggler = std::find(o.begin(), o.end(), "network.stragglers=[{ bandwidth = 0.01, rank = 1 }]");
  ASSERT_NE(straggler, o.end());
  EXPECT_LT(std::find(o.begin(), o.end(), "algo.H=2"), straggler);  // [set] first
  study::run_sweep(spec, options("scen.md"));
  // The straggler's scenario reached its run: its all-reduces take longer on the virtual clock.
  EXPECT_GT(study::read_run_summary(runs[1].dir).virtual_s, study::read_run_summary(runs[0].dir).virtual_s);
  const std::string doc = read_file(kRoot / "scen.md");
  const auto slow = doc.find("\n### slow\n"), claims = doc.find("\nClaims:");
  ASSERT_NE(doc.find("\n### fast\n"), std::string::npos) << doc;
  ASSERT_NE(slow, std::string::npos) << doc;
  ASSERT_NE(claims, std::string::npos) << doc;
  EXPECT_NE(doc.find("| slow | `--set network.stragglers=[{ bandwidth = 0.01, rank = 1 }]` | a |"), std::string::npos) << doc;
  EXPECT_EQ(doc.substr(slow, claims - slow).find("| b |"), std::string::npos) << "b does not run in slow:\n" << doc;
  EXPECT_NE(doc.find("- a ends lower than b [fast]: **"), std::string::npos) << doc;
  EXPECT_EQ(doc.find("[slow]: **"), std::string::npos) << doc;
}

// sweep.memory: each variant's state per parameter, from the memory line its trainer logged.
TEST_F(Sweep, MemoryTableShowsEachVariantsStatePerParameter) {
  const auto spec = study::load_sweep(sweep_file("mem", R"(
[set]
"cluster.workers" = 1
"algo.name" = "none"
[[variant]]
name = "adamw"
set = { "optim.name" = "adamw" }
)", "memory = true\nnotes = \"How to read it: a fixed note.\"\n"));
  study::run_sweep(spec, options("mem.md"));
  const auto run = study::expand_sweep(spec, false, kRoot / "runs").at(0);
  const auto s = study::read_run_summary(run.dir);
  ASSERT_GT(s.params, 0);
  // AdamW holds two moments in fp32.
  EXPECT_DOUBLE_EQ(s.optimizer_state_per_param, 8.0);
  EXPECT_DOUBLE_EQ(s.sync_state_per_param, 0.0);
  const std::string doc = read_file(kRoot / "mem.md");
  EXPECT_NE(doc.find(fmt::format("| adamw | adamw | none | {} | 8.0 | 0.0 | 8.0 |", s.params)), std::string::npos) << doc;
  EXPECT_NE(doc.find("\nHow to read it: a fixed note.\n"), std::string::npos) << doc;
}

// kind = "consensus": nothing trains; each variant's job keys pick the graph and the form, and
// the section's numbers are the consensus simulator's (algo/consensus.hpp) for them.
TEST_F(Sweep, ConsensusStudySimulatesEachVariantAndJudgesItsClaims) {
  const std::string kind = "kind = \"consensus\"\nrounds = 5\nrate_rounds = 200\ndim = 64\n";
  const std::string one = "[[variant]]\nname = \"a\"\n";
  expect_config_error(one, "sweep.kind", "kind = \"gossip\"\n");
  expect_config_error(one, "sweep.rounds", "rounds = 5\n");  // a training study
  expect_config_error(one, "sweep.target_from", kind + "target_from = \"a\"\n");
  expect_config_error("[tuning]\nseed = 7\nseeds = [1]\n" + one, "nothing to tune", kind);
  expect_config_error("[[scenario]]\nname = \"x\"\n" + one, "no scenarios", kind);
  expect_config_error(one + "[[claim]]\ntext = \"t\"\nkind = \"gap_rate\"\na = \"a\"\nb = \"a\"\n", "claim.b", kind);
  expect_config_error(one + "[[claim]]\ntext = \"t\"\nkind = \"faster\"\na = \"a\"\nb = \"a\"\n", "claim.kind", kind);
  expect_config_error(one + "[[claim]]\ntext = \"t\"\nkind = \"gap_rate\"\na = \"a\"\nb = \"a\"\n", "claim.kind");  // training
  const auto spec = study::load_sweep(sweep_file("cons", R"(
[set]
"cluster.workers" = 8
"algo.name" = "gasloc"
"algo.outer_lr" = 1.0
"algo.outer_momentum" = 0.0
"train.seed" = 3
[[variant]]
name = "plain"
set = { "algo.topology" = "1peer" }
[[variant]]
name = "outer"
set = { "algo.topology" = "1peer", "algo.outer_lr" = 0.7, "algo.outer_momentum" = 0.9 }
[[claim]]
text = "plain gossip decays as the gap says"
kind = "gap_rate"
a = "plain"
tolerance = 0.1
[[claim]]
text = "the outer step slows consensus"
kind = "lower"
a = "plain"
b = "outer"
)", kind));
  study::run_sweep(spec, options("cons.md"));
  EXPECT_FALSE(fs::exists(kRoot / "runs" / "cons")) << "a consensus study trains nothing";
  const auto runs = study::expand_sweep(spec, false, kRoot / "runs");
  ASSERT_EQ(runs.size(), 2u);
  const auto plain = study::simulate_run(spec, runs[0]);
  const topology::Topology t(topology::Kind::one_peer, 8, 3);
  EXPECT_EQ(plain.distance, algo::simulate_consensus(t, 5, 64, 3, {}));
  EXPECT_TRUE(plain.plain);
  const auto outer = study::simulate_run(spec, runs[1]);
  EXPECT_EQ(outer.distance, algo::simulate_consensus(t, 5, 64, 3, {0.7, 0.9}));
  const std::string doc = read_file(kRoot / "cons.md");
  EXPECT_NE(doc.find(fmt::format("| plain | 1peer | 8 | plain averaging | {:.4f} |", plain.gap)), std::string::npos) << doc;
  EXPECT_NE(doc.find("| outer | 1peer | 8 | anchor, lr 0.7, momentum 0.9 |"), std::string::npos) << doc;
  EXPECT_NE(doc.find("- plain gossip decays as the gap says: **"), std::string::npos) << doc;
  // The outer step's per-round contraction is about 0.9 against plain averaging's 0.45 (docs/topology.md).
  EXPECT_NE(doc.find("- the outer step slows consensus: **reproduced** (a = plain, b = outer;"), std::string::npos) << doc;
  EXPECT_TRUE(fs::exists(kRoot / "plots" / "cons-consensus.png"));
}

// The consensus verdicts on hand-made numbers.
TEST(SweepVerdicts, ConsensusClaimsCompareTheRatesAsDeclared) {
  study::ConsensusResult a;
  a.gap = 0.5;
  a.rate.mean = 0.52;  // 4% above 1 - gap
  EXPECT_EQ(study::judge_gap_rate(a, 0.05, 100).verdict, "reproduced");
  EXPECT_NE(study::judge_gap_rate(a, 0.05, 100).numbers.find("+4.0%"), std::string::npos);
  EXPECT_EQ(study::judge_gap_rate(a, 0.03, 100).verdict, "not reproduced");
  a.rate.mean = 0.47;  // 6% below
  EXPECT_EQ(study::judge_gap_rate(a, 0.05, 100).verdict, "not reproduced");
  study::ConsensusResult b;
  a.rate.geometric = 0.4;
  b.rate.geometric = 0.9;
  EXPECT_EQ(study::judge_contraction_lower(a, b, 100).verdict, "reproduced");
  EXPECT_EQ(study::judge_contraction_lower(b, a, 100).verdict, "not reproduced");
}

// launch = { ranks = N }: the variant's runs start as processes under `gasloc launch` (over
// Gloo), and step_time_from gives an in-process variant the seconds per step they measured.
TEST_F(Sweep, LaunchedVariantsRunAsProcessesAndCalibrateTheOthers) {
  const std::string gloo = "set = { \"cluster.backend\" = \"gloo\" }\n";
  expect_config_error("[[variant]]\nname = \"a\"\nlaunch = { ranks = 2 }\n", "variant.a.launch");
  expect_config_error("[[variant]]\nname = \"a\"\n" + gloo, "add launch = { ranks = N }");
  expect_config_error("[[variant]]\nname = \"a\"\n" + gloo + "launch = { ranks = 1 }\n", "launch.ranks");
  expect_config_error("[[variant]]\nname = \"a\"\n" + gloo + "launch = { ranks = 2, hosts = 2 }\n", "hosts");
  expect_config_error("[[variant]]\nname = \"a\"\nstep_time_from = \"b\"\n[[variant]]\nname = \"b\"\n", "variant.a.step_time_from");
  const auto spec = study::load_sweep(sweep_file("launch", R"(
[set]
"cluster.workers" = 2
"algo.name" = "diloco"
"algo.H" = 2
[[variant]]
name = "real"
set = { "cluster.backend" = "gloo", "cluster.timeout_s" = 120 }
launch = { ranks = 2 }
[[variant]]
name = "virtual"
step_time_from = "real"
)"));
  auto runs = study::expand_sweep(spec, false, kRoot / "runs");
  ASSERT_EQ(runs.size(), 2u);
  study::apply_step_times(spec, runs);
  EXPECT_TRUE(runs[1].awaits_step_time);  // real has not run yet
  auto o = options("launch.md");
  o.gasloc = gasloc::test_paths::binary_dir() / "gasloc";
  study::run_sweep(spec, o);
  const auto real = study::read_run_summary(runs[0].dir);
  ASSERT_TRUE(real.finished()) << read_file(runs[0].dir.string() + ".log");
  EXPECT_EQ(real.workers, 2);
  EXPECT_NE(read_file(runs[0].dir.string() + ".log").find("[rank 1]"), std::string::npos);
  const auto cfg = nlohmann::json::parse(read_file(runs[1].dir / "run.json"));
  EXPECT_DOUBLE_EQ(cfg["config"]["network"]["step_time_s"].get<double>(),
                   real.train_wall_s / static_cast<double>(real.last_train_step));
  EXPECT_EQ(cfg["config"]["cluster"]["backend"].get<std::string>(), "inproc");
  const std::string doc = read_file(kRoot / "launch.md");
  EXPECT_NE(doc.find("run as 2 processes (`gasloc launch -n 2`)"), std::string::npos) << doc;
  EXPECT_NE(doc.find("| virtual | - | 1 | 1 |"), std::string::npos) << doc;
  // Again: both are reused, and the calibrated run's configuration still matches.
  study::run_sweep(spec, o);
  EXPECT_EQ(study::read_run_summary(runs[1].dir).last_step, 4);
}

// by = "time" on within: the runs' final times on their own clocks (a launched run's is the wall
// clock), paired by seed, instead of their losses.
TEST(SweepClaims, WithinByTimeComparesEachRunsFinalTime) {
  const fs::path root = kRoot / "within_time";
  study::SweepSpec spec;
  spec.name = spec.title = "t";
  spec.learned_by = 0.0;
  spec.plot_x.clear();
  spec.variants = {{"real", {}, {}, {}}, {"virtual", {}, {}, {}}};
  spec.claims = {{"the virtual clock predicts the real time within 10%", "within", "real", "virtual", 0.1, "time"}};
  study::SweepOptions o;
  o.doc = "";
  o.command = "test";
  auto write_run = [&](const std::string& dir, const std::string& variant, double seconds, double eval_s = 0) {
    auto r = write_eval_run(root / dir, variant, 0, {{{120, 6.0, seconds}}});
    std::ofstream(root / dir / "metrics.jsonl", std::ios::app)
        << "{\"event\":\"train\",\"step\":60,\"worker\":0,\"virtual_time_s\":" << seconds / 2
        << ",\"eval_time_s\":" << eval_s / 2 << "}\n"
        << "{\"event\":\"train\",\"step\":120,\"worker\":0,\"virtual_time_s\":" << seconds
        << ",\"eval_time_s\":" << eval_s << "}\n";
    return r;
  };
  const auto virt = write_run("virtual", "virtual", 100.0, 12.0);
  EXPECT_DOUBLE_EQ(study::read_run_summary(virt.dir).eval_s, 12.0);  // the priced evaluations of the last line
  std::string md = study::sweep_section(spec, {write_run("close", "real", 105.0), virt}, o);
  EXPECT_NE(md.find("within 10%: **reproduced** (a = real, b = virtual; final time (s, each run's own clock): a 105.0000, "
                    "b 100.0000"),
            std::string::npos) << md;
  md = study::sweep_section(spec, {write_run("far", "real", 125.0), virt}, o);
  EXPECT_NE(md.find("within 10%: **not reproduced**"), std::string::npos) << md;
  // by = "time_and_eval": the virtual run's evaluations, priced apart, join its time (100 + 12);
  // a real run's clock already holds its own.
  const auto slow = write_run("slow", "real", 115.0);
  md = study::sweep_section(spec, {slow, virt}, o);
  EXPECT_NE(md.find("within 10%: **not reproduced**"), std::string::npos) << md;
  spec.claims[0].by = "time_and_eval";
  md = study::sweep_section(spec, {slow, virt}, o);
  EXPECT_NE(md.find("within 10%: **reproduced** (a = real, b = virtual; final time with priced evaluations (s, each run's "
                    "own clock): a 115.0000, b 112.0000"),
            std::string::npos) << md;
  fs::remove_all(root);
}

namespace {
size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A study section as section.cpp writes one: heading, generation line, a table, its claims.
std::string fake_section(const std::string& id, int64_t version, const std::string& title, const std::string& verdicts,
                         const std::string& table = "| variant | val_loss |\n| a | 4.5 |\n") {
  return study::section_begin(id, "gasloc sweep experiments/" + id + ".toml", version) + "\n## " + title +
         "\n\nGenerated by `gasloc sweep experiments/" + id + ".toml` on 2026-01-0" + std::to_string(version) +
         " UTC. Base job `configs/research.toml`.\n\nTraining time of these 4 runs: 2.5 min (their own wall clock, summed).\n\n"
         "### " + title + "\n\nUnigram baseline of the data: 5.9302 (the validation loss of token frequencies alone).\n\n" +
         table + (verdicts.empty() ? "" : "\nClaims:\n\n" + verdicts) + "<!-- " + id + ":end -->";
}
}  // namespace

// A study file's new version replaces its section, and the verdicts of the version it replaces
// stay in the document (with the line that says what made them), once, whatever is rewritten later.
TEST(SweepDoc, ANewVersionKeepsTheSupersededVerdicts) {
  const fs::path doc = kRoot / "versions.md";
  fs::remove(doc);
  std::ofstream(doc) << "# Results\n\n" << fake_section("e9", 1, "E9: a study", "- claim one: **reproduced** (v1 numbers)\n")
                     << "\n\n<!-- e10:begin (generated by x) -->\n## E10\n<!-- e10:end -->\n";
  EXPECT_EQ(study::section_version(read_file(doc).substr(read_file(doc).find("<!-- e9:begin"))), 1);
  const std::string v2 = fake_section("e9", 2, "E9: a study", "- claim one: **not reproduced** (v2 numbers)\n",
                                      "| variant | val_loss |\n| a | 4.1 |\n");
  EXPECT_EQ(study::section_version(v2), 2);
  EXPECT_NE(v2.find("; version 2;"), std::string::npos) << v2;
  study::write_doc_section(doc, "e9", v2);
  std::string text = read_file(doc);
  EXPECT_EQ(study::find_doc_section(text, "e9"), v2);
  const std::string kept = study::find_doc_section(text, "e9@v1");
  ASSERT_FALSE(kept.empty()) << text;
  EXPECT_NE(kept.find("### E9: a study: version 1 (superseded by version 2)"), std::string::npos) << kept;
  EXPECT_NE(kept.find("- claim one: **reproduced** (v1 numbers)"), std::string::npos) << kept;
  EXPECT_NE(kept.find("Generated by `gasloc sweep experiments/e9.toml` on 2026-01-01 UTC."), std::string::npos) << kept;
  EXPECT_EQ(kept.find("| a | 4.5 |"), std::string::npos) << "the old tables stay in git history only: " << kept;
  EXPECT_LT(text.find("<!-- e9:end -->"), text.find("<!-- e9@v1:begin")) << "the old verdicts follow the new section";
  EXPECT_NE(text.find("<!-- e10:end -->"), std::string::npos) << "the other sections stay";

  // Regenerating the same version rewrites the section only; a third version keeps the second's.
  study::write_doc_section(doc, "e9", fake_section("e9", 2, "E9: a study", "- claim one: **inconclusive** (v2 again)\n"));
  text = read_file(doc);
  EXPECT_EQ(count_of(text, "<!-- e9@v1:begin"), 1u) << text;
  EXPECT_EQ(count_of(text, "(v1 numbers)"), 1u) << text;
  EXPECT_EQ(count_of(text, "(v2 numbers)"), 0u) << text;
  study::write_doc_section(doc, "e9", fake_section("e9", 3, "E9: a study", "- claim one: **reproduced** (v3)\n"));
  text = read_file(doc);
  EXPECT_EQ(count_of(text, "<!-- e9@v1:begin"), 1u) << text;
  EXPECT_NE(study::find_doc_section(text, "e9@v2").find("(v2 again)"), std::string::npos) << text;
  EXPECT_EQ(count_of(text, "<!-- e9:begin"), 1u) << text;
  fs::remove(doc);
}

// "Claims at a glance" is gathered from the study sections of the document, not from runs: each
// study's title, unigram baseline and verdict lines as its section states them, the training time
// summed, the studies without a section named; a superseded version's verdicts are left out.
TEST(SweepGlance, GathersEachStudysVerdictsFromItsSection) {
  auto spec = [](const std::string& name) {
    study::SweepSpec s;
    s.name = name;
    s.file = "experiments/" + name + "_study.toml";
    return s;
  };
  std::vector<study::SweepSpec> studies = {spec("e1"), spec("e2"), spec("e3")};
  studies[0].version = 2;
  const std::string e1 = fake_section("e1", 2, "E1: one step", "- A beats B: **reproduced** (numbers)\n- C: **inconclusive** (x)\n");
  const std::string e1_old = "<!-- e1@v1:begin (version 1) -->\n### E1: version 1\n\nClaims:\n\n- A beats B: **old** (v1)\n<!-- e1@v1:end -->";
  const std::string e2 = fake_section("e2", 1, "E2: no claims", "");
  const std::string e2_quick = fake_section("e2-quick", 1, "E2: no claims (quick mode)", "- quick: **one seed** (q)\n");
  const std::string doc = "# Results\n\n" + e1 + "\n\n" + e1_old + "\n\n" + e2 + "\n\n" + e2_quick + "\n";
  const std::string md = study::glance_section(doc, studies, false, "gasloc sweep --glance (test)", "2026-12-02");
  EXPECT_EQ(md.rfind("<!-- claims:begin (generated by `gasloc sweep --glance (test)`; edits here are overwritten) -->\n", 0), 0u) << md;
  EXPECT_NE(md.find("Training time of the suite's 8 runs:\n5 min"), std::string::npos) << md;
  EXPECT_NE(md.find("\n- **E1: one step** (unigram baseline 5.9302)\n"
                    "  - A beats B: **reproduced** (numbers)\n  - C: **inconclusive** (x)\n"
                    "- **E2: no claims** (unigram baseline 5.9302)\n"
                    "  - (no claim: a study of how the method behaves; see its section)\n"),
            std::string::npos)
      << md;
  EXPECT_EQ(md.find("(v1)"), std::string::npos) << "a superseded version is not a verdict of the suite: " << md;
  EXPECT_EQ(md.find("rerun it"), std::string::npos) << "every section is its study file's version: " << md;
  studies[1].version = 3;  // the study file moved on; its section did not
  EXPECT_NE(study::glance_section(doc, studies, false, "g", "2026-12-02")
                .find("- **E2: no claims** (unigram baseline 5.9302) (its section is version 1's; the study file is at version 3: "
                      "rerun it)\n"),
            std::string::npos);
  studies[1].version = 1;
  EXPECT_EQ(md.find("quick:"), std::string::npos) << "the quick sections are the quick glance's: " << md;
  EXPECT_NE(md.find("Not run yet in this mode (their sections appear when they finish): e3_study.toml."), std::string::npos) << md;
  EXPECT_TRUE(md.size() > 20 && md.substr(md.size() - 19) == "<!-- claims:end -->") << md;

  const std::string quick = study::glance_section(doc, studies, true, "g", "2026-12-02");
  EXPECT_NE(quick.find("<!-- claims-quick:begin"), std::string::npos) << quick;
  EXPECT_NE(quick.find("- **E2: no claims** (unigram baseline 5.9302)\n  - quick: **one seed** (q)\n"), std::string::npos) << quick;
  EXPECT_NE(quick.find("e1_study.toml, e3_study.toml."), std::string::npos) << quick;

  // Written into the document in place of the old glance, the studies' sections untouched.
  const fs::path path = kRoot / "glance.md";
  std::ofstream(path) << "# Results\n\n<!-- claims:begin (old) -->\nstale\n<!-- claims:end -->\n\n" << doc;
  study::write_glance(path, studies, false, "g");
  const std::string text = read_file(path);
  EXPECT_EQ(text.find("stale"), std::string::npos) << text;
  EXPECT_LT(text.find("<!-- claims:begin"), text.find("<!-- e1:begin")) << text;
  EXPECT_NE(text.find(e1), std::string::npos);
  EXPECT_NE(text.find(e2_quick), std::string::npos);
  fs::remove(path);
  EXPECT_THROW(study::write_glance(path, studies, false, "g"), ConfigError);
}

// An untuned study on several seeds says that its verdicts need the paired spread exceeded, not
// that one seed has none; quick mode on one seed says that.
TEST(SweepSection, UntunedStudiesStateTheirSeedsRule) {
  study::SweepSpec spec;
  spec.name = spec.title = "u";
  spec.plot_x.clear();
  spec.tuned = true;
  spec.tuning.seed = 100;
  spec.tuning.seeds = {1, 2, 3};
  spec.variants = {{"a", {}, {}, {}}};
  study::SweepOptions o;
  o.doc = "";
  o.command = "test";
  std::string md = study::sweep_section(spec, {}, o);
  EXPECT_NE(md.find("No tuning (each point is declared in the study file before any run): each variant runs the one point "
                    "declared for it on seeds {1, 2, 3}."),
            std::string::npos) << md;
  EXPECT_NE(md.find("need the mean paired difference to exceed the spread of the paired differences"), std::string::npos) << md;
  EXPECT_EQ(md.find("one seed"), std::string::npos) << md;
  o.quick = true;
  md = study::sweep_section(spec, {}, o);
  EXPECT_NE(md.find("No tuning in this mode: each variant runs the one point declared for it on seeds {1}."), std::string::npos)
      << md;
  EXPECT_NE(md.find("with one seed there is no spread to exceed"), std::string::npos) << md;
}
