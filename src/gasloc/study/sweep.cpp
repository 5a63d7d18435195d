#include "gasloc/study/sweep.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/study/consensus_study.hpp"
#include "gasloc/study/run_summary.hpp"
#include "gasloc/study/section.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/job_config.hpp"
#include "gasloc/train/run.hpp"
#include "gasloc/train/run_files.hpp"
#include "gasloc/train/trainer.hpp"

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
// point's, its tuning point and seed, then --quick's (the study's, then the variant's), and last
// its directory.
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
    if (!fs::exists(r.dir / "run.json")) continue;
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

namespace {

// Runs (or reuses, or resumes) each run in turn; returns how many are done.
size_t run_all(const SweepSpec& spec, const std::vector<SweepRun>& runs, const SweepOptions& opts, const std::string& stage) {
  size_t done = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    const std::string what = fmt::format("[{} {}/{}] {}", stage, i + 1, runs.size(), run_title(r));
    // Finished: evaluated at its last step. Its results are complete even if its final checkpoint
    // then failed (a full disk), so it is not redone.
    const bool finished = fs::exists(r.dir / "run.json") && read_run_summary(r.dir).finished();
    if (opts.dry_run) {
      if (r.provisional) {
        fmt::print("{}: after tuning (its point, and so its directory under {}, is chosen then)\n", what,
                   r.dir.parent_path().string());
        continue;
      }
      fmt::print("{}: {} ({})\n", what, finished ? "finished" : has_checkpoint(r.dir) ? "stopped, will resume" : "to run",
                 r.dir.string());
      continue;
    }
    // A finished run's checkpoints cost about 16 bytes per parameter per worker (a GB for 8 tiny
    // workers) and serve no result: they go, unless the sweep keeps them to train on later.
    auto tidy = [&] {
      if (spec.keep_checkpoints) return;
      if (const uintmax_t freed = train::RunCheckpoints(r.dir, /*world: the layout does not depend on it*/ 1).remove_all(); freed > 0)
        fmt::print("{}: removed its checkpoints ({:.0f} MB; sweep.keep_checkpoints = true keeps them)\n", what,
                   static_cast<double>(freed) / 1e6);
    };
    if (finished) {
      fmt::print("{}: finished, reused\n", what);
      tidy();
      ++done;
      continue;
    }
    train::TrainRequest req;
    if (has_checkpoint(r.dir)) {
      fmt::print("{}: resuming {}\n", what, r.dir.string());
      req.resume_dir = r.dir.string();
    } else {
      fmt::print("{}: running into {}\n", what, r.dir.string());
      fs::remove_all(r.dir);  // a run that died before its first checkpoint starts over
      req.config_path = spec.job;
      req.overrides = r.overrides;
    }
    std::fflush(stdout);
    const train::TrainSummary s = train::run_training(req);
    if (s.interrupted)
      throw Error("sweep interrupted during " + what, "run the same command again: finished runs are reused and this one resumes");
    tidy();
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
  const std::string section = spec.consensus ? consensus_section(spec, runs, o) : sweep_section(spec, runs, o);
  if (o.print_only) {
    fmt::print("{}\n", section);
  } else {
    write_doc_section(o.doc, spec.name + (opts.quick ? "-quick" : ""), section);
    fmt::print("wrote the '{}' section of {}\n", spec.name, o.doc.string());
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
  const auto tuning = expand_tuning(spec, opts.quick, opts.runs_root);
  // Refuse to mix results before anything runs; the final runs of points already chosen too.
  check_same_config(spec, tuning);
  check_same_config(spec, expand_final(spec, opts.quick, opts.runs_root, choose_points(spec, tuning)));
  const auto t0 = std::chrono::steady_clock::now();
  size_t done = run_all(spec, tuning, opts, "tuning");
  // The tuning is complete here (or this is a dry run): each variant's point is fixed from now on.
  const Chosen chosen = choose_points(spec, tuning);
  const auto finals = expand_final(spec, opts.quick, opts.runs_root, chosen);
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
