#include "gasloc/train/sweep.hpp"

#include "gasloc/train/checkpoint.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <optional>
#include <set>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/config.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/job_config.hpp"
#include "gasloc/train/run_files.hpp"
#include "gasloc/train/run_summary.hpp"
#include "gasloc/train/trainer.hpp"

namespace gasloc::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& key, const std::string& what) {
  throw ConfigError("sweep key '" + key + "': " + what, "fix '" + key + "' in the sweep file");
}

// A value as the text of --set section.key=TEXT: strings verbatim, the rest as TOML.
std::string toml_text(const json& v, bool top = true) {
  if (v.is_string()) return top ? v.get<std::string>() : v.dump();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + toml_text(v[i], false);
    return s + "]";
  }
  if (v.is_object()) {
    std::string s = "{ ";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it, first = false) s += (first ? "" : ", ") + it.key() + " = " + toml_text(it.value(), false);
    return s + " }";
  }
  return v.dump();
}

// A table of settings: "section.key" = value, or [table.section] key = value (TOML nests both
// unquoted dotted keys and sub-tables), flattened to section.key=TEXT in file order.
std::vector<std::pair<std::string, json>> settings_of(const json& table, const std::string& where) {
  if (!table.is_object()) bad(where, "must be a table of \"section.key\" = value");
  std::vector<std::pair<std::string, json>> out;
  for (auto it = table.begin(); it != table.end(); ++it) {
    if (it.key().find('.') != std::string::npos) {
      out.emplace_back(it.key(), it.value());
    } else if (it.value().is_object()) {
      for (auto jt = it.value().begin(); jt != it.value().end(); ++jt) out.emplace_back(it.key() + "." + jt.key(), jt.value());
    } else {
      bad(where + "." + it.key(), "settings are written \"section.key\" = value, e.g. \"algo.H\" = 30");
    }
  }
  return out;
}

std::vector<std::string> as_overrides(const std::vector<std::pair<std::string, json>>& kv) {
  std::vector<std::string> out;
  for (const auto& [k, v] : kv) out.push_back(k + "=" + toml_text(v));
  return out;
}

std::string get_string(const json& t, const std::string& key, const std::string& where, bool required) {
  auto it = t.find(key);
  if (it == t.end()) {
    if (required) bad(where + "." + key, "is required");
    return "";
  }
  if (!it->is_string()) bad(where + "." + key, "must be a string, got " + it->dump());
  return it->get<std::string>();
}

void only_keys(const json& t, const std::string& where, std::initializer_list<const char*> keys) {
  if (!t.is_object()) bad(where, "must be a table");
  for (auto it = t.begin(); it != t.end(); ++it) {
    bool ok = false;
    std::string valid;
    for (const char* k : keys) {
      ok = ok || it.key() == k;
      valid += (valid.empty() ? "" : ", ") + std::string(k);
    }
    if (!ok) throw ConfigError("unknown sweep key '" + where + "." + it.key() + "'", "valid keys in " + where + ": " + valid);
  }
}

// "cluster.workers" = 8 -> "workers=8" (characters a path should not hold become _).
std::string point_name(const std::vector<std::pair<std::string, json>>& point) {
  std::string s;
  for (const auto& [k, v] : point) {
    std::string value = toml_text(v);
    for (char& c : value)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
    s += (s.empty() ? "" : ",") + k.substr(k.rfind('.') + 1) + "=" + value;
  }
  return s;
}

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

// Removes a finished run's checkpoints (and the temporary files of a failed write); returns the
// bytes freed. Its results live in metrics.jsonl.
uintmax_t remove_checkpoints(const fs::path& dir) {
  uintmax_t freed = 0;
  std::error_code ec;
  if (fs::exists(dir / "checkpoints")) {
    for (const auto& e : fs::recursive_directory_iterator(dir / "checkpoints", ec))
      if (e.is_regular_file()) freed += e.file_size();
    fs::remove_all(dir / "checkpoints", ec);
  }
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.rfind("checkpoint", 0) == 0 &&
        (name.ends_with(".pt") || name.ends_with(".pt.tmp"))) {
      freed += e.file_size();
      fs::remove(e.path());
    }
  }
  return freed;
}

// The first key at which two resolved configurations differ ("" if none), ignoring where the
// run lives and where it was told to stop.
std::string first_difference(const json& a, const json& b) {
  for (auto it = a.begin(); it != a.end(); ++it) {
    if (!b.contains(it.key())) return it.key();
    for (auto jt = it.value().begin(); jt != it.value().end(); ++jt) {
      const std::string key = it.key() + "." + jt.key();
      if (key == "train.run_dir" || key == "train.stop_at") continue;
      if (!b[it.key()].contains(jt.key()) || b[it.key()][jt.key()] != jt.value()) return key;
    }
  }
  return "";
}

struct Stats {
  int n = 0;
  double mean = 0, lo = 0, hi = 0;
};
Stats stats_of(const std::vector<double>& v) {
  Stats s;
  s.n = static_cast<int>(v.size());
  if (v.empty()) return s;
  s.lo = *std::min_element(v.begin(), v.end());
  s.hi = *std::max_element(v.begin(), v.end());
  for (double x : v) s.mean += x / static_cast<double>(v.size());
  return s;
}
// The validation loss of a curve at `step`, interpolated linearly between evaluations; nothing if
// the curve does not span it.
std::optional<double> loss_at(const std::vector<EvalPoint>& curve, double step) {
  for (size_t i = 0; i < curve.size(); ++i) {
    const double s = static_cast<double>(curve[i].step);
    if (s < step) continue;
    if (s == step || i == 0) return s == step ? std::optional<double>(curve[i].val_loss) : std::nullopt;
    const double s0 = static_cast<double>(curve[i - 1].step);
    return curve[i - 1].val_loss + (step - s0) / (s - s0) * (curve[i].val_loss - curve[i - 1].val_loss);
  }
  return std::nullopt;
}

// Where a variant's runs first reach `target` (none if target <= 0): steps and virtual seconds
// over the runs that reach it, and how many do.
struct Reach {
  Stats steps, time;
  size_t n = 0;
};
Reach reach_of(const std::vector<RunSummary>& runs, double target) {
  std::vector<double> st, tt;
  for (const auto& r : runs)
    if (auto hit = target > 0 ? reach_target(r.curve, target) : std::nullopt) {
      st.push_back(hit->first);
      tt.push_back(hit->second);
    }
  return {stats_of(st), stats_of(tt), st.size()};
}

std::string fmt_stats(const Stats& s, const char* f) {
  if (s.n == 0) return "-";
  const std::string m = fmt::format(fmt::runtime(f), s.mean);
  return s.n == 1 ? m : m + " (" + fmt::format(fmt::runtime(f), s.lo) + "-" + fmt::format(fmt::runtime(f), s.hi) + ")";
}

}  // namespace

SweepSpec load_sweep(const fs::path& file) {
  SweepSpec spec;
  spec.file = file;
  const json doc = config::parse_toml_file(file.string());
  only_keys(doc, "sweep file", {"sweep", "set", "quick", "grid", "quick_grid", "variant", "claim"});
  if (!doc.contains("sweep")) bad("sweep", "the [sweep] table is required (name, job)");
  const json& sw = doc["sweep"];
  only_keys(sw, "sweep", {"name", "title", "job", "target", "target_from", "plot_x", "keep_checkpoints"});
  if (sw.contains("keep_checkpoints")) {
    if (!sw["keep_checkpoints"].is_boolean()) bad("sweep.keep_checkpoints", "must be true or false");
    spec.keep_checkpoints = sw["keep_checkpoints"].get<bool>();
  }
  spec.name = get_string(sw, "name", "sweep", true);
  if (spec.name.empty() || spec.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") != std::string::npos)
    bad("sweep.name", "must be lower-case letters, digits, - and _ (it names directories and a docs section)");
  spec.title = get_string(sw, "title", "sweep", false);
  if (spec.title.empty()) spec.title = spec.name;
  spec.job = get_string(sw, "job", "sweep", true);
  if (!fs::exists(spec.job)) bad("sweep.job", "'" + spec.job + "' does not exist (paths are relative to where gasloc runs)");
  spec.target_from = get_string(sw, "target_from", "sweep", false);
  if (sw.contains("target")) {
    if (!sw["target"].is_number() || sw["target"].get<double>() < 0) bad("sweep.target", "must be a loss >= 0 (0 = none)");
    spec.target = sw["target"].get<double>();
  }
  if (sw.contains("plot_x")) {
    spec.plot_x.clear();
    if (!sw["plot_x"].is_array() || sw["plot_x"].empty()) bad("sweep.plot_x", "must be a non-empty list of step, time, bytes, consensus");
    for (const auto& x : sw["plot_x"]) {
      if (!x.is_string() || (x != "step" && x != "time" && x != "bytes" && x != "consensus"))
        bad("sweep.plot_x", "entries are step, time, bytes or consensus");
      spec.plot_x.push_back(x.get<std::string>());
    }
  }
  if (doc.contains("set")) spec.settings = as_overrides(settings_of(doc["set"], "set"));
  if (doc.contains("quick")) spec.quick = as_overrides(settings_of(doc["quick"], "quick"));
  if (doc.contains("grid")) {
    for (auto& [key, values] : settings_of(doc["grid"], "grid")) {
      if (!values.is_array()) bad("grid." + key, "must be a list of values to try, e.g. [8, 16]");
      if (values.empty()) bad("grid." + key, "is an empty list: the grid would have no runs");
      spec.grid.emplace_back(key, std::vector<json>(values.begin(), values.end()));
    }
  }
  if (doc.contains("quick_grid")) {
    for (auto& [key, values] : settings_of(doc["quick_grid"], "quick_grid")) {
      const bool in_grid = std::any_of(spec.grid.begin(), spec.grid.end(), [&](const auto& g) { return g.first == key; });
      if (!in_grid) bad("quick_grid." + key, "replaces a [grid] axis in --quick mode, but [grid] has no '" + key + "'");
      if (!values.is_array() || values.empty()) bad("quick_grid." + key, "must be a non-empty list of values");
      spec.quick_grid.emplace_back(key, std::vector<json>(values.begin(), values.end()));
    }
  }
  if (!doc.contains("variant") || !doc["variant"].is_array() || doc["variant"].empty())
    bad("variant", "at least one [[variant]] with a name (and its settings) is required");
  std::set<std::string> names;
  for (const auto& v : doc["variant"]) {
    only_keys(v, "variant", {"name", "set"});
    SweepVariant var;
    var.name = get_string(v, "name", "variant", true);
    if (var.name.empty() || var.name.find_first_of("/ \t") != std::string::npos) bad("variant.name", "must be a non-empty word");
    if (!names.insert(var.name).second) bad("variant.name", "'" + var.name + "' appears twice");
    if (v.contains("set")) var.settings = as_overrides(settings_of(v["set"], "variant." + var.name + ".set"));
    spec.variants.push_back(std::move(var));
  }
  if (!spec.target_from.empty() && !names.count(spec.target_from))
    bad("sweep.target_from", "'" + spec.target_from + "' is not a variant");
  if (doc.contains("claim")) {
    if (!doc["claim"].is_array()) bad("claim", "write claims as [[claim]] tables");
    for (const auto& c : doc["claim"]) {
      only_keys(c, "claim", {"text", "kind", "a", "b", "tolerance", "by", "target_at"});
      SweepClaim cl;
      cl.text = get_string(c, "text", "claim", true);
      cl.kind = get_string(c, "kind", "claim", true);
      if (cl.kind != "lower" && cl.kind != "within" && cl.kind != "faster") bad("claim.kind", "must be lower, within or faster");
      cl.a = get_string(c, "a", "claim", true);
      cl.b = get_string(c, "b", "claim", true);
      for (const auto& n : {cl.a, cl.b})
        if (!names.count(n)) bad("claim.a/b", "'" + n + "' is not a variant");
      if (c.contains("tolerance")) {
        if (!c["tolerance"].is_number() || c["tolerance"].get<double>() < 0) bad("claim.tolerance", "must be a number >= 0");
        cl.tolerance = c["tolerance"].get<double>();
      }
      cl.by = get_string(c, "by", "claim", false);
      if (cl.by.empty()) cl.by = "time";
      if (cl.by != "time" && cl.by != "steps") bad("claim.by", "must be time (virtual seconds) or steps");
      if (c.contains("by") && cl.kind != "faster") bad("claim.by", "only a 'faster' claim measures time or steps");
      if (c.contains("target_at")) {
        if (!c["target_at"].is_number() || !(c["target_at"].get<double>() > 0 && c["target_at"].get<double>() <= 1))
          bad("claim.target_at", "must be a fraction of train.steps in (0, 1]");
        if (cl.kind != "faster" || spec.target_from.empty())
          bad("claim.target_at", "only a 'faster' claim in a sweep with target_from reads the target earlier in a run");
        cl.target_at = c["target_at"].get<double>();
      }
      if (cl.kind == "faster" && spec.target <= 0 && spec.target_from.empty())
        bad("claim.kind", "'faster' compares time to a target loss: set sweep.target or sweep.target_from");
      spec.claims.push_back(cl);
    }
  }
  // Every run's job must load: a bad setting fails here, before hours of other runs.
  for (bool quick : {false, true})
    for (const auto& r : expand_sweep(spec, quick, "runs/experiments")) {
      try {
        load_job(spec.job, r.overrides);
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("sweep run {}{}: {}", r.variant, r.point.empty() ? "" : " " + point_name(r.point), e.what()),
                          e.hint());
      }
    }
  return spec;
}

fs::path sweep_dir(const SweepSpec& spec, bool quick, const fs::path& runs_root) {
  return runs_root / (spec.name + (quick ? "-quick" : ""));
}

std::vector<SweepRun> expand_sweep(const SweepSpec& spec, bool quick, const fs::path& runs_root) {
  std::vector<std::vector<std::pair<std::string, json>>> points(1);
  for (const auto& [key, grid_values] : spec.grid) {
    const std::vector<json>* values_ptr = &grid_values;
    if (quick)
      for (const auto& [qk, qv] : spec.quick_grid)
        if (qk == key) values_ptr = &qv;
    const auto& values = *values_ptr;
    std::vector<std::vector<std::pair<std::string, json>>> next;
    for (const auto& p : points)
      for (const auto& v : values) {
        auto q = p;
        q.emplace_back(key, v);
        next.push_back(std::move(q));
      }
    points = std::move(next);
  }
  const fs::path base = sweep_dir(spec, quick, runs_root);
  std::vector<SweepRun> runs;
  for (const auto& var : spec.variants)
    for (const auto& p : points) {
      SweepRun r;
      r.variant = var.name;
      r.point = p;
      r.dir = p.empty() ? base / var.name : base / var.name / point_name(p);
      r.overrides = spec.settings;
      r.overrides.insert(r.overrides.end(), var.settings.begin(), var.settings.end());
      for (const auto& s : as_overrides(p)) r.overrides.push_back(s);
      if (quick) r.overrides.insert(r.overrides.end(), spec.quick.begin(), spec.quick.end());
      r.overrides.push_back("train.run_dir=" + r.dir.string());
      runs.push_back(std::move(r));
    }
  return runs;
}

void run_sweep(const SweepSpec& spec, const SweepOptions& opts) {
  const auto runs = expand_sweep(spec, opts.quick, opts.runs_root);
  // Refuse to mix results before anything runs: a directory must hold this very configuration.
  for (const auto& r : runs) {
    if (!fs::exists(r.dir / "run.json")) continue;
    const json expected = load_job(spec.job, r.overrides).to_json();
    const json found = json::parse(read_file(r.dir / "run.json"), nullptr, false);
    if (found.is_discarded() || !found.contains("config"))
      throw CheckpointError("'" + r.dir.string() + "' holds a corrupt run.json", "remove that directory to run it again");
    const std::string diff = first_difference(expected, found["config"]);
    if (!diff.empty())
      throw CheckpointError(fmt::format("'{}' holds a run of another configuration (it differs at '{}')", r.dir.string(), diff),
                            "results of different configurations are not mixed: remove that directory, or give the "
                            "sweep another name");
  }
  const auto t0 = std::chrono::steady_clock::now();
  size_t done = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    const std::string what = fmt::format("[{}/{}] {}{}", i + 1, runs.size(), r.variant, r.point.empty() ? "" : " " + point_name(r.point));
    // Finished: evaluated at its last step. Its results are complete even if its final checkpoint
    // then failed (a full disk), so it is not redone.
    const bool finished = fs::exists(r.dir / "run.json") && read_run_summary(r.dir).finished();
    if (opts.dry_run) {
      fmt::print("{}: {} ({})\n", what, finished ? "finished" : has_checkpoint(r.dir) ? "stopped, will resume" : "to run", r.dir.string());
      continue;
    }
    // A finished run's checkpoints cost about 16 bytes per parameter per worker (a GB for 8 tiny
    // workers) and serve no result: they go, unless the sweep keeps them to train on later.
    auto tidy = [&] {
      if (spec.keep_checkpoints) return;
      if (const uintmax_t freed = remove_checkpoints(r.dir); freed > 0)
        fmt::print("{}: removed its checkpoints ({:.0f} MB; sweep.keep_checkpoints = true keeps them)\n", what,
                   static_cast<double>(freed) / 1e6);
    };
    if (finished) {
      fmt::print("{}: finished, reused\n", what);
      tidy();
      ++done;
      continue;
    }
    TrainRequest req;
    if (has_checkpoint(r.dir) && !read_run_summary(r.dir).finished()) {
      fmt::print("{}: resuming {}\n", what, r.dir.string());
      req.resume_dir = r.dir.string();
    } else {
      fmt::print("{}: running into {}\n", what, r.dir.string());
      fs::remove_all(r.dir);  // a run that died before its first checkpoint starts over
      req.config_path = spec.job;
      req.overrides = r.overrides;
    }
    std::fflush(stdout);
    const TrainSummary s = run_training(req);
    if (s.interrupted)
      throw Error("sweep interrupted during " + what, "run the same command again: finished runs are reused and this one resumes");
    tidy();
    ++done;
  }
  if (opts.dry_run) return;
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 60.0;
  fmt::print("sweep '{}': {} runs done in {:.1f} min\n", spec.name, done, minutes);
  SweepOptions o = opts;
  if (o.command.empty()) o.command = fmt::format("gasloc sweep {}{}", spec.file.string(), opts.quick ? " --quick" : "");
  const fs::path own = sweep_dir(spec, opts.quick, opts.runs_root);
  if (o.print_only) {
    o.doc.clear();
    if (o.plots_dir.empty()) o.plots_dir = own / "results";
  } else if (o.doc.empty()) {
    o.doc = own / "results.md";
  }
  const std::string section = sweep_section(spec, runs, o);
  if (o.print_only) {
    fmt::print("{}\n", section);
  } else {
    write_doc_section(o.doc, spec.name + (opts.quick ? "-quick" : ""), section);
    fmt::print("wrote the '{}' section of {}\n", spec.name, o.doc.string());
  }
}

std::string sweep_section(const SweepSpec& spec, const std::vector<SweepRun>& runs, const SweepOptions& opts) {
  const std::string id = spec.name + (opts.quick ? "-quick" : "");
  // Group runs by their grid point without the seed; seeds are aggregated.
  std::map<std::string, std::map<std::string, std::vector<RunSummary>>> groups;  // point -> variant -> runs
  std::vector<std::string> group_order;
  for (const auto& r : runs) {
    std::vector<std::pair<std::string, json>> p;
    for (const auto& kv : r.point)
      if (kv.first != "train.seed") p.push_back(kv);
    const std::string g = point_name(p);
    if (!groups.count(g)) group_order.push_back(g);
    if (fs::exists(r.dir / "run.json")) groups[g][r.variant].push_back(read_run_summary(r.dir));
  }
  std::string md = fmt::format("<!-- {}:begin (generated by `{}`; edits here are overwritten) -->\n## {}{}\n\n", id,
                               opts.command, spec.title, opts.quick ? " (quick mode)" : "");
  md += fmt::format("Generated by `{}` on {} UTC. Base job `{}`", opts.command,
                    fmt::format("{:%Y-%m-%d}", fmt::gmtime(std::time(nullptr))), spec.job);
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "`--set " : " --set ") + x;
    return s.empty() ? std::string("none") : s + "`";
  };
  md += fmt::format("; settings of every run: {}", list(spec.settings));
  if (opts.quick) md += fmt::format("; quick mode adds {}", list(spec.quick));
  md += ".\n\n| variant | settings |\n| --- | --- |\n";
  for (const auto& v : spec.variants) md += fmt::format("| {} | {} |\n", v.name, list(v.settings));
  auto axes = [](const std::vector<std::pair<std::string, std::vector<json>>>& grid) {
    std::string out;
    for (const auto& [k, vals] : grid) {
      std::string s;
      for (const auto& v : vals) s += (s.empty() ? "" : ", ") + toml_text(v);
      out += fmt::format(" `{}` in {{{}}};", k, s);
    }
    return out;
  };
  if (!spec.grid.empty()) {
    md += "\nGrid (every combination, for every variant):" + axes(spec.grid) +
          " seeds (`train.seed`) are aggregated as mean (min-max).\n";
    if (opts.quick && !spec.quick_grid.empty()) md += "Quick mode narrows the grid to" + axes(spec.quick_grid) + "\n";
  }
  std::vector<std::string> claim_lines;
  double wall_s = 0;
  int with_runs = 0;
  for (const auto& [g, byvar] : groups)
    for (const auto& [v, rs] : byvar)
      for (const auto& r : rs) {
        wall_s += r.wall_s;
        ++with_runs;
      }
  md += fmt::format("\nTraining time of these {} runs: {:.1f} min (their own wall clock, summed; a resumed run counts "
                    "each part).\n",
                    with_runs, wall_s / 60);
  for (const auto& g : group_order) {
    auto& byvar = groups[g];
    // The target of this group.
    double target = spec.target;
    if (!spec.target_from.empty()) {
      std::vector<double> f;
      for (const auto& r : byvar[spec.target_from])
        if (r.has_val_loss) f.push_back(r.val_loss);
      target = f.empty() ? 0.0 : stats_of(f).mean;
    }
    md += fmt::format("\n### {}\n\n", g.empty() ? spec.title : g);
    // The data's unigram baseline, when every run of the group shares it.
    double unigram = -1;
    bool shared = true;
    for (const auto& [v, rs] : byvar)
      for (const auto& r : rs) {
        if (r.unigram < 0) continue;
        if (unigram < 0) unigram = r.unigram;
        shared = shared && std::abs(unigram - r.unigram) < 1e-9;
      }
    if (!shared) unigram = -1;
    if (unigram >= 0)
      md += fmt::format("Unigram baseline of the data: {:.4f} (the validation loss of token frequencies alone).\n\n", unigram);
    if (target > 0) md += fmt::format("Target validation loss: {:.4f}{}.\n\n", target,
                                      spec.target_from.empty() ? "" : " (the mean final loss of " + spec.target_from + ")");
    md += "| variant | runs | finished | val_loss (average model) | consensus distance | steps to target | virtual s to target | virtual time (s) | MB sent per worker | idle |\n";
    md += "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
    std::map<std::string, Stats> loss;
    std::map<std::string, Reach> reach;
    for (const auto& v : spec.variants) {
      const auto& rs = byvar[v.name];
      std::vector<double> l, cd, vt, mb, idle;
      int finished = 0;
      for (const auto& r : rs) {
        finished += r.finished();
        if (r.has_val_loss) {
          l.push_back(r.val_loss);
          cd.push_back(r.consensus);
        }
        vt.push_back(r.virtual_s);
        mb.push_back(r.mb_per_worker);
        idle.push_back(100 * r.idle_fraction);
      }
      loss[v.name] = stats_of(l);
      const Reach& hit = reach[v.name] = reach_of(rs, target);
      // Over the runs that reached the target; "(k of n)" when some did not.
      const std::string partial = hit.n > 0 && hit.n < rs.size() ? fmt::format(" ({} of {})", hit.n, rs.size()) : "";
      md += fmt::format("| {} | {} | {} | {} | {} | {}{} | {}{} | {} | {} | {}% |\n", v.name, rs.size(), finished,
                        fmt_stats(loss[v.name], "{:.4f}"), fmt_stats(stats_of(cd), "{:.3g}"), fmt_stats(hit.steps, "{:.0f}"), partial,
                        fmt_stats(hit.time, "{:.1f}"), partial, fmt_stats(stats_of(vt), "{:.1f}"), fmt_stats(stats_of(mb), "{:.1f}"),
                        fmt_stats(stats_of(idle), "{:.1f}"));
    }
    // Plots: each variant's first run (lowest seed) of this group.
    for (const auto& x : spec.plot_x) {
      std::vector<RunSummary> rs;
      std::vector<std::string> titles;
      for (const auto& v : spec.variants)
        if (!byvar[v.name].empty() && !byvar[v.name].front().curve.empty()) {
          rs.push_back(byvar[v.name].front());
          titles.push_back(v.name);
        }
      if (rs.empty()) continue;
      std::string file = id + (g.empty() ? "" : "-" + g) + "-" + x + ".png";
      std::replace(file.begin(), file.end(), ',', '_');
      std::replace(file.begin(), file.end(), '=', '-');
      const fs::path dir = !opts.plots_dir.empty() ? opts.plots_dir
                           : opts.doc.empty()     ? fs::path("sweep-plots")
                                                  : fs::absolute(opts.doc).parent_path() / "results";
      fs::create_directories(dir);
      PlotStyle style;
      style.title = spec.title + (g.empty() ? "" : " [" + g + "]") + (opts.quick ? " (quick mode)" : "");
      style.baseline = unigram;
      plot_runs(rs, titles, dir / file, x, style);
      const fs::path rel = opts.doc.empty() ? dir / file : fs::relative(fs::absolute(dir / file), fs::absolute(opts.doc).parent_path());
      md += x == "consensus" ? fmt::format("\n![consensus distance versus step]({})\n", rel.string())
                             : fmt::format("\n![validation loss versus {}]({})\n", x, rel.string());
    }
    for (const auto& c : spec.claims) {
      const Stats a = loss[c.a], b = loss[c.b];
      std::string verdict, numbers;
      if (c.kind == "faster") {
        const bool steps = c.by == "steps";
        Reach ra = reach[c.a], rb = reach[c.b];
        std::string which = "target";
        if (c.target_at < 1) {  // this claim's own target: target_from's loss earlier in its runs
          std::vector<double> at;
          for (const auto& r : byvar[spec.target_from])
            if (auto l = loss_at(r.curve, c.target_at * static_cast<double>(r.planned_steps))) at.push_back(*l);
          const double t = at.empty() ? 0.0 : stats_of(at).mean;
          ra = reach_of(byvar[c.a], t);
          rb = reach_of(byvar[c.b], t);
          which = fmt::format("target {:.4f} ({}'s loss at {:.0f}% of its steps)", t, spec.target_from, 100 * c.target_at);
        }
        const Stats ta = steps ? ra.steps : ra.time, tb = steps ? rb.steps : rb.time;
        const int reached_a = static_cast<int>(ra.n), reached_b = static_cast<int>(rb.n);
        const char* f = steps ? "{:.0f}" : "{:.1f}";
        numbers = fmt::format("{} to {}: {} {}, {} {}", steps ? "steps" : "virtual s", which, c.a, fmt_stats(ta, f), c.b,
                              fmt_stats(tb, f));
        if (reached_a == 0 && reached_b == 0) verdict = "inconclusive";
        else if (reached_a == 0) verdict = "not reproduced";
        else if (reached_b == 0) verdict = "reproduced";
        else verdict = ta.mean * (1 + c.tolerance) <= tb.mean ? "reproduced" : "not reproduced";
      } else {
        numbers = fmt::format("final loss: {} {}, {} {}", c.a, fmt_stats(a, "{:.4f}"), c.b, fmt_stats(b, "{:.4f}"));
        if (a.n == 0 || b.n == 0) verdict = "inconclusive";
        else if (c.kind == "within")
          verdict = std::abs(a.mean - b.mean) <= c.tolerance * std::abs(b.mean) ? "reproduced" : "not reproduced";
        else if (a.n > 1 && b.n > 1 && a.hi >= b.lo && b.hi >= a.lo) verdict = "inconclusive (the seeds' ranges overlap)";
        else verdict = a.mean < b.mean ? "reproduced" : "not reproduced";
      }
      claim_lines.push_back(fmt::format("- {}{}: **{}** ({})", c.text, g.empty() ? "" : " [" + g + "]", verdict, numbers));
    }
  }
  if (!claim_lines.empty()) {
    md += "\nClaims:\n\n";
    for (const auto& l : claim_lines) md += l + "\n";
  }
  md += fmt::format("<!-- {}:end -->", id);
  return md;
}

void write_doc_section(const fs::path& doc, const std::string& name, const std::string& section) {
  std::string text = fs::exists(doc) ? read_file(doc)
                                     : std::string("# Results\n\nEvery section below is generated by the script or sweep it "
                                                   "names, from runs on this project's embedded data; rerun it to regenerate it.\n");
  const std::string begin = "<!-- " + name + ":begin", end = "<!-- " + name + ":end -->";
  const auto b = text.find(begin);
  const auto e = b == std::string::npos ? std::string::npos : text.find(end, b);
  if (b != std::string::npos && e != std::string::npos) text.replace(b, e + end.size() - b, section);
  else text += (text.empty() || text.back() == '\n' ? "\n" : "\n\n") + section + "\n";
  write_file_atomic(doc, text);
}

}  // namespace gasloc::train
