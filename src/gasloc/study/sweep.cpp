#include "gasloc/study/sweep.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/study/claims.hpp"
#include "gasloc/study/consensus_study.hpp"
#include "gasloc/study/run_summary.hpp"
#include "gasloc/study/section.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/job_config.hpp"
#include "gasloc/train/run.hpp"
#include "gasloc/train/run_files.hpp"
#include "gasloc/train/trainer.hpp"

extern char** environ;

namespace gasloc::study {
namespace fs = std::filesystem;
using nlohmann::json;
using train::read_run_info;
using train::rank_checkpoint_files;
using train::RunInfo;

namespace {

// The run wrote a checkpoint (rank 0's; run_files.hpp knows the layout): it resumes, and a
// partial set is the trainer's to refuse, not the sweep's to delete.
bool has_checkpoint(const fs::path& dir) {
  if (!fs::exists(dir / "run.json")) return false;
  try {
    const RunInfo info = read_run_info({dir});
    rank_checkpoint_files({dir}, info.world, {0});
    return true;
  } catch (const Error&) {
    return false;
  }
}

// A run's trainer arguments: the study's settings, its scenario's, the variant's, the grid
// point's, its tuning point and seed, then --quick's (the study's, then the variant's), then a
// try's (--set, --steps), and last its directory.
SweepRun make_run(const SweepSpec& spec, const SweepVariant& var, const Point& group, const Point& tune, int64_t seed,
                  bool tuning, bool quick, fs::path dir) {
  SweepRun r;
  r.variant = var.name;
  r.point = group;
  r.tune = tune;
  r.seed = seed;
  r.tuning = tuning;
  r.dir = std::move(dir);
  r.overrides = spec.settings;
  if (const SweepScenario* sc = spec.scenario_of(group)) r.overrides.insert(r.overrides.end(), sc->settings.begin(), sc->settings.end());
  r.overrides.insert(r.overrides.end(), var.settings.begin(), var.settings.end());
  for (const auto& s : as_overrides(group)) r.overrides.push_back(s);
  for (const auto& s : as_overrides(tune)) r.overrides.push_back(s);
  if (spec.tuned) r.overrides.push_back(fmt::format("train.seed={}", seed));
  if (quick) {
    r.overrides.insert(r.overrides.end(), spec.quick.begin(), spec.quick.end());
    r.overrides.insert(r.overrides.end(), var.quick_settings.begin(), var.quick_settings.end());
  }
  r.overrides.insert(r.overrides.end(), spec.tried.begin(), spec.tried.end());
  r.overrides.push_back("train.run_dir=" + r.dir.string());
  return r;
}

// The [grid] in this mode, [quick_grid] replacing its axes with --quick.
Axes grid_in(const SweepSpec& spec, bool quick) {
  Axes axes = spec.grid;
  if (quick)
    for (auto& [key, values] : axes)
      for (const auto& [qk, qv] : spec.quick_grid)
        if (qk == key) values = qv;
  return axes;
}

// The groups: each scenario (if any) crossed with the grid's points, scenarios outermost.
std::vector<Point> groups_in(const SweepSpec& spec, bool quick) {
  const auto points = grid_points(grid_in(spec, quick));
  if (spec.scenarios.empty()) return points;
  std::vector<Point> out;
  for (const auto& sc : spec.scenarios)
    for (const auto& p : points) {
      Point g = {{kScenarioKey, sc.name}};
      g.insert(g.end(), p.begin(), p.end());
      out.push_back(std::move(g));
    }
  return out;
}

fs::path group_dir(const fs::path& base, const SweepVariant& var, const Point& group) {
  return group.empty() ? base / var.name : base / var.name / point_name(group);
}

// Refuse to mix results: a directory must hold this very configuration.
void check_same_config(const SweepSpec& spec, const std::vector<SweepRun>& runs) {
  for (const auto& r : runs) {
    if (r.awaits_step_time || !fs::exists(r.dir / "run.json")) continue;
    const json expected = train::load_job(spec.job, r.overrides).to_json();
    const json found = json::parse(read_file(r.dir / "run.json"), nullptr, false);
    if (found.is_discarded() || !found.contains("config"))
      throw CheckpointError("'" + r.dir.string() + "' holds a corrupt run.json", "remove that directory to run it again");
    const std::string diff = train::config_difference(expected, found["config"]);
    if (!diff.empty())
      throw CheckpointError(fmt::format("'{}' holds a run of another configuration (it differs at '{}')", r.dir.string(), diff),
                            "results of different configurations are not mixed: remove that directory, or give the "
                            "sweep another name");
  }
}

std::string run_title(const SweepRun& r) {
  std::string s = r.variant;
  if (!r.point.empty()) s += " " + point_name(r.point);
  if (r.tuning) s += " tuning " + point_name(r.tune);
  else if (r.provisional) s += " (chosen point)";
  else if (!r.tune.empty()) s += " " + point_name(r.tune);
  if (r.tuning || r.seed != 0) s += fmt::format(" seed={}", r.seed);
  return s;
}

}  // namespace

std::string chosen_key(const std::string& variant, const Point& group) { return variant + "|" + point_name(group); }

fs::path sweep_dir(const SweepSpec& spec, bool quick, const fs::path& runs_root) {
  return runs_root / (spec.name + (quick ? "-quick" : ""));
}

std::vector<SweepRun> expand_tuning(const SweepSpec& spec, bool quick, const fs::path& runs_root) {
  std::vector<SweepRun> runs;
  if (!spec.tuned) return runs;
  const fs::path base = sweep_dir(spec, quick, runs_root);
  const auto groups = groups_in(spec, quick);
  for (const auto& var : spec.variants) {
    const auto points = grid_points(spec.tune_of(var, quick));
    if (points.size() < 2) continue;  // nothing to choose
    for (const auto& g : groups)
      for (const auto& p : points)
        if (spec.runs_in(var.name, g))
        runs.push_back(make_run(spec, var, g, p, spec.tuning.seed, true, quick, group_dir(base, var, g) / "tune" / point_name(p)));
  }
  return runs;
}

std::vector<SweepRun> expand_final(const SweepSpec& spec, bool quick, const fs::path& runs_root, const Chosen& chosen) {
  const fs::path base = sweep_dir(spec, quick, runs_root);
  std::vector<SweepRun> runs;
  if (!spec.tuned) {
    for (const auto& var : spec.variants)
      for (const auto& p : groups_in(spec, quick))
        if (spec.runs_in(var.name, p)) runs.push_back(make_run(spec, var, p, {}, 0, false, quick, group_dir(base, var, p)));
    return runs;
  }
  for (const auto& var : spec.variants) {
    const auto points = grid_points(spec.tune_of(var, quick));
    for (const auto& g : groups_in(spec, quick)) {
      if (!spec.runs_in(var.name, g)) continue;
      Point tune = points.front();
      bool provisional = false;
      if (points.size() > 1) {
        const auto it = chosen.find(chosen_key(var.name, g));
        provisional = it == chosen.end();
        if (!provisional) tune = it->second;
      }
      for (int64_t seed : spec.seeds(quick)) {
        Point named = tune;
        named.emplace_back("train.seed", seed);
        auto r = make_run(spec, var, g, tune, seed, false, quick, group_dir(base, var, g) / point_name(named));
        r.provisional = provisional;
        runs.push_back(std::move(r));
      }
    }
  }
  return runs;
}

std::vector<SweepRun> expand_sweep(const SweepSpec& spec, bool quick, const fs::path& runs_root) {
  return expand_final(spec, quick, runs_root, {});
}

Chosen choose_points(const SweepSpec& spec, const std::vector<SweepRun>& tuning_runs) {
  std::map<std::string, std::pair<double, Point>> best;
  std::map<std::string, bool> complete;
  for (const auto& r : tuning_runs) {
    const std::string key = chosen_key(r.variant, r.point);
    complete.try_emplace(key, true);
    const bool done = fs::exists(r.dir / "run.json") && read_run_summary(r.dir).finished();
    if (!done) {
      complete[key] = false;
      continue;
    }
    const double loss = read_run_summary(r.dir).val_loss;
    auto it = best.find(key);
    if (it == best.end() || loss < it->second.first) best[key] = {loss, r.tune};
  }
  Chosen out;
  for (const auto& [key, b] : best)
    if (complete[key]) out[key] = b.second;
  return out;
}

void apply_step_times(const SweepSpec& spec, std::vector<SweepRun>& runs) {
  constexpr const char* kKey = "network.step_time_s=";
  for (auto& r : runs) {
    const auto& from = std::find_if(spec.variants.begin(), spec.variants.end(), [&](const auto& v) { return v.name == r.variant; })
                           ->step_time_from;
    if (from.empty()) continue;
    const auto cal = std::find_if(runs.begin(), runs.end(), [&](const SweepRun& c) {
      return c.variant == from && c.point == r.point && c.seed == r.seed && !c.tuning;
    });
    const bool ready = cal != runs.end() && fs::exists(cal->dir / "run.json") && read_run_summary(cal->dir).finished();
    // Drop a step time set before (the run's own settings may hold one too: the calibrated one comes last and wins).
    auto& o = r.overrides;
    if (r.calibrated) o.erase(o.end() - 2);
    r.calibrated = false;
    r.awaits_step_time = !ready;
    if (!ready) continue;
    const RunSummary s = read_run_summary(cal->dir);
    const double step_s = s.train_wall_s / static_cast<double>(std::max<int64_t>(1, s.last_train_step));
    o.insert(o.end() - 1, fmt::format("{}{}", kKey, step_s));  // before train.run_dir, which stays last
    r.calibrated = true;
  }
}

namespace {

const SweepVariant& variant_of(const SweepSpec& spec, const std::string& name) {
  return *std::find_if(spec.variants.begin(), spec.variants.end(), [&](const auto& v) { return v.name == name; });
}

// One run of a launched variant: `gasloc launch -n RANKS [--netns] -- gasloc train ...`, started
// without a shell, its output (every rank's, prefixed) into DIR.log beside the run.
void launch_run(const SweepSpec& spec, const SweepVariant& var, const SweepRun& r, bool resume, const SweepOptions& opts) {
  if (opts.gasloc.empty())
    throw Error("variant '" + var.name + "' runs as processes, but this sweep was not started by the gasloc program",
                "run it with `gasloc sweep`");
  std::vector<std::string> args = {opts.gasloc.string(), "launch", "-n", std::to_string(var.ranks)};
  if (var.netns) args.push_back("--netns");
  for (const char* a : {"--", "gasloc", "train"}) args.emplace_back(a);
  if (resume) {
    args.insert(args.end(), {"--resume", r.dir.string()});
  } else {
    args.insert(args.end(), {"--config", spec.job});
    for (const auto& o : r.overrides) args.insert(args.end(), {"--set", o});
  }
  const std::string log = r.dir.string() + ".log";
  fs::create_directories(r.dir.parent_path());
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | (resume ? O_APPEND : O_TRUNC), 0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int err = posix_spawn(&pid, args[0].c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (err != 0) throw Error(fmt::format("cannot start {}: {}", args[0], std::strerror(err)));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw Error(fmt::format("lost the launcher of {}: {}", r.dir.string(), std::strerror(errno)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error(fmt::format("the launched run {} failed ({}); its ranks' output is in {}", r.dir.string(),
                            WIFEXITED(status) ? fmt::format("exit {}", WEXITSTATUS(status)) : "killed by a signal", log),
                "read that log; the same command resumes it from its checkpoint, or starts it over");
}

// Trains one unfinished run: resumed from its checkpoint, else from scratch; in this process or,
// for a launched variant, as processes.
void train_run(const SweepSpec& spec, const SweepRun& r, const SweepOptions& opts, const std::string& what) {
  const bool resume = has_checkpoint(r.dir);
  if (resume) {
    fmt::print("{}: resuming {}\n", what, r.dir.string());
  } else {
    fmt::print("{}: running into {}\n", what, r.dir.string());
    fs::remove_all(r.dir);  // a run that died before its first checkpoint starts over
  }
  std::fflush(stdout);
  const SweepVariant& var = variant_of(spec, r.variant);
  if (var.ranks > 0) return launch_run(spec, var, r, resume, opts);
  train::TrainRequest req;
  if (resume) {
    req.resume_dir = r.dir.string();
  } else {
    req.config_path = spec.job;
    req.overrides = r.overrides;
  }
  if (train::run_training(req).interrupted)
    throw Error("sweep interrupted during " + what, "run the same command again: finished runs are reused and this one resumes");
}

// What a dry run says of a run.
void print_state(const SweepRun& r, const std::string& what, bool finished) {
  if (r.provisional)
    fmt::print("{}: after tuning (its point, and so its directory under {}, is chosen then)\n", what, r.dir.parent_path().string());
  else if (r.awaits_step_time && !finished)
    fmt::print("{}: to run after its step_time_from run, which sets its step time ({})\n", what, r.dir.string());
  else
    fmt::print("{}: {} ({})\n", what, finished ? "finished" : has_checkpoint(r.dir) ? "stopped, will resume" : "to run",
               r.dir.string());
}

// Runs (or reuses, or resumes) each run in turn; returns how many are done. A calibrated run
// takes its step time here, from a run finished earlier in the same loop.
size_t run_all(const SweepSpec& spec, std::vector<SweepRun>& runs, const SweepOptions& opts, const std::string& stage) {
  size_t done = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    apply_step_times(spec, runs);
    const auto& r = runs[i];
    const std::string what = fmt::format("[{} {}/{}] {}", stage, i + 1, runs.size(), run_title(r));
    // Finished: evaluated at its last step. Its results are complete even if its final checkpoint
    // then failed (a full disk), so it is not redone.
    const bool finished = fs::exists(r.dir / "run.json") && read_run_summary(r.dir).finished();
    if (opts.dry_run) {
      print_state(r, what, finished);
      continue;
    }
    if (r.awaits_step_time)
      throw Error(what + ": the run that sets its step time (step_time_from) did not finish", "run the same command again");
    if (finished) {
      fmt::print("{}: finished, reused\n", what);
    } else {
      train_run(spec, r, opts, what);
    }
    // A finished run's checkpoints cost about 16 bytes per parameter per worker (a GB for 8 tiny
    // workers) and serve no result: they go, unless the sweep keeps them to train on later.
    if (!spec.keep_checkpoints)
      if (const uintmax_t freed = train::RunCheckpoints(r.dir, /*world: the layout does not depend on it*/ 1).remove_all(); freed > 0)
        fmt::print("{}: removed its checkpoints ({:.0f} MB; sweep.keep_checkpoints = true keeps them)\n", what,
                   static_cast<double>(freed) / 1e6);
    ++done;
  }
  return done;
}

}  // namespace

namespace {

// Writes a section where the options say: printed, into --doc, or into the sweep's own directory.
void write_section(const SweepSpec& spec, const SweepOptions& opts, const std::vector<SweepRun>& runs) {
  SweepOptions o = opts;
  if (o.command.empty()) o.command = fmt::format("gasloc sweep {}{}", spec.file.string(), opts.quick ? " --quick" : "");
  const fs::path own = sweep_dir(spec, opts.quick, opts.runs_root);
  if (o.print_only) {
    o.doc.clear();
    if (o.plots_dir.empty()) o.plots_dir = own / "results";
  } else if (o.doc.empty()) {
    o.doc = own / "results.md";
  }
  const SweepReport report = spec.consensus ? SweepReport{consensus_section(spec, runs, o), ""} : sweep_report(spec, runs, o);
  if (o.print_only) {
    fmt::print("{}\n", report.section);
  } else {
    write_doc_section(o.doc, spec.name + (opts.quick ? "-quick" : ""), report.section);
    fmt::print("wrote the '{}' section of {}\n", spec.name, o.doc.string());
  }
  // The raw per-run results beside the plots: `gasloc sweep --reverdict` judges from them alone.
  if (!report.runs_csv.empty()) {
    const fs::path table = runs_table_path(plot_dir(o), spec, opts.quick);
    fs::create_directories(table.parent_path());
    write_file_atomic(table, report.runs_csv);
    fmt::print("wrote its runs table {}\n", table.string());
  }
}

// A consensus study trains nothing: its variants are simulated as the section is written.
void run_consensus(const SweepSpec& spec, const SweepOptions& opts) {
  const auto runs = expand_sweep(spec, opts.quick, opts.runs_root);
  if (opts.dry_run) {
    for (size_t i = 0; i < runs.size(); ++i)
      fmt::print("[consensus {}/{}] {}: simulated when the section is written (no training run)\n", i + 1, runs.size(),
                 run_title(runs[i]));
    return;
  }
  write_section(spec, opts, runs);
}

}  // namespace

void run_sweep(const SweepSpec& spec, const SweepOptions& opts) {
  if (spec.consensus) return run_consensus(spec, opts);
  auto tuning = expand_tuning(spec, opts.quick, opts.runs_root);
  // Refuse to mix results before anything runs; the final runs of points already chosen too.
  check_same_config(spec, tuning);
  auto known = expand_final(spec, opts.quick, opts.runs_root, choose_points(spec, tuning));
  apply_step_times(spec, known);
  check_same_config(spec, known);
  const auto t0 = std::chrono::steady_clock::now();
  size_t done = run_all(spec, tuning, opts, "tuning");
  // The tuning is complete here (or this is a dry run): each variant's point is fixed from now on.
  const Chosen chosen = choose_points(spec, tuning);
  auto finals = expand_final(spec, opts.quick, opts.runs_root, chosen);
  apply_step_times(spec, finals);
  check_same_config(spec, finals);
  done += run_all(spec, finals, opts, spec.tuned ? "seeds" : "run");
  if (opts.dry_run) return;
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 60.0;
  fmt::print("sweep '{}': {} run{} done in {:.1f} min\n", spec.name, done, done == 1 ? "" : "s", minutes);
  std::vector<SweepRun> all = tuning;
  all.insert(all.end(), finals.begin(), finals.end());
  write_section(spec, opts, all);
}

}  // namespace gasloc::study
