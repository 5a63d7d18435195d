#include "gasloc/study/study_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "gasloc/core/config.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/shipped_files.hpp"
#include "gasloc/study/sweep.hpp"
#include "gasloc/train/job_config.hpp"

namespace gasloc::study {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& key, const std::string& what) {
  throw ConfigError("sweep key '" + key + "': " + what, "fix '" + key + "' in the sweep file");
}

// The job files' loader, with the sweep file's hint: the same typed checks, another file to fix.
template <class Section>
Section read_section(const json& table, const std::string& where) {
  Section s;
  try {
    config::apply_table(s, where, table);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(e.what()), e.hint().empty() ? "fix it in the sweep file" : e.hint() + " (in the sweep file)");
  }
  return s;
}

// A table of settings: "section.key" = value, or [table.section] key = value (TOML nests both
// unquoted dotted keys and sub-tables), flattened to section.key=value in file order.
Point settings_of(const json& table, const std::string& where) {
  if (!table.is_object()) bad(where, "must be a table of \"section.key\" = value");
  Point out;
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

Axes axes_of(const json& table, const std::string& where) {
  Axes out;
  for (auto& [key, values] : settings_of(table, where)) {
    if (!values.is_array()) bad(where + "." + key, "must be a list of values to try, e.g. [8, 16]");
    if (values.empty()) bad(where + "." + key, "is an empty list: the grid would have no runs");
    out.emplace_back(key, std::vector<json>(values.begin(), values.end()));
  }
  return out;
}

bool has_axis(const Axes& axes, const std::string& key) {
  return std::any_of(axes.begin(), axes.end(), [&](const auto& a) { return a.first == key; });
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

// A consensus study's claims: gap_rate about one variant, lower between two.
void check_consensus_claim(const std::set<std::string>& names, const json& raw, const SweepClaim& cl) {
  for (const char* k : {"text", "kind", "a"})
    if (!raw.contains(k)) bad(std::string("claim.") + k, "is required");
  if (cl.kind != "gap_rate" && cl.kind != "lower")
    bad("claim.kind", "a consensus study judges gap_rate (a's mean per-round ratio against 1 - gap) or lower (a's contraction "
                      "is lower than b's)");
  if (cl.kind == "lower" && !raw.contains("b")) bad("claim.b", "is required: the variant a is compared with");
  if (cl.kind == "gap_rate" && raw.contains("b")) bad("claim.b", "a gap_rate claim is about one variant, a: remove b");
  for (const auto& n : {cl.a, cl.b})
    if (!n.empty() && !names.count(n)) bad("claim.a/b", "'" + n + "' is not a variant");
  if (cl.tolerance < 0) bad("claim.tolerance", "must be a number >= 0");
  for (const char* k : {"by", "target_at", "scenarios"})
    if (raw.contains(k)) bad(std::string("claim.") + k, "applies to training studies only");
}

// claim.scenarios: known scenarios, each running both variants.
void check_claim_scenarios(const SweepSpec& spec, const SweepClaim& cl) {
  for (const auto& name : cl.scenarios) {
    const auto it = std::find_if(spec.scenarios.begin(), spec.scenarios.end(), [&](const auto& s) { return s.name == name; });
    if (it == spec.scenarios.end()) bad("claim.scenarios", "'" + name + "' is not a [[scenario]]");
    const Point group = {{kScenarioKey, name}};
    for (const auto& v : {cl.a, cl.b})
      if (!spec.runs_in(v, group))
        bad("claim.scenarios", "scenario '" + name + "' does not run variant '" + v + "': list only scenarios that run both");
  }
  if (cl.scenarios.empty())
    for (const auto& sc : spec.scenarios)
      for (const auto& v : {cl.a, cl.b})
        if (!spec.runs_in(v, {{kScenarioKey, sc.name}}))
          bad("claim.scenarios", "scenario '" + sc.name + "' does not run variant '" + v +
                                     "': name the scenarios the claim is about, e.g. scenarios = [\"bw10\"]");
}

void check_claim(const SweepSpec& spec, const std::set<std::string>& names, const json& raw, const SweepClaim& cl) {
  if (spec.consensus) return check_consensus_claim(names, raw, cl);
  for (const char* k : {"text", "kind", "a", "b"})
    if (!raw.contains(k)) bad(std::string("claim.") + k, "is required");
  if (cl.kind != "lower" && cl.kind != "within" && cl.kind != "no_worse" && cl.kind != "faster")
    bad("claim.kind", "must be lower, within, no_worse or faster");
  for (const auto& n : {cl.a, cl.b})
    if (!names.count(n)) bad("claim.a/b", "'" + n + "' is not a variant");
  check_claim_scenarios(spec, cl);
  if (cl.tolerance < 0) bad("claim.tolerance", "must be a number >= 0");
  if (cl.kind == "faster" && !cl.by.empty() && cl.by != "time" && cl.by != "steps")
    bad("claim.by", "a 'faster' claim measures time (virtual seconds, the default) or steps to the target");
  if (cl.kind != "faster" && !cl.by.empty() && cl.by != "loss" && cl.by != "time" && cl.by != "time_and_eval")
    bad("claim.by", "lower, within and no_worse compare the final loss (the default), time (each run's final time on its "
                    "clock) or time_and_eval (that plus its priced evaluations); steps is for 'faster'");
  if (raw.contains("target_at")) {
    if (!(cl.target_at > 0 && cl.target_at <= 1)) bad("claim.target_at", "must be a fraction of train.steps in (0, 1]");
    if (cl.kind != "faster" || spec.target_from.empty())
      bad("claim.target_at", "only a 'faster' claim in a sweep with target_from reads the target earlier in a run");
  }
  if (cl.kind == "faster" && spec.target <= 0 && spec.target_from.empty())
    bad("claim.kind", "'faster' compares time to a target loss: set sweep.target or sweep.target_from");
}

}  // namespace

std::string toml_text(const json& v, bool top) {
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

std::vector<std::string> as_overrides(const Point& kv) {
  std::vector<std::string> out;
  for (const auto& [k, v] : kv)
    if (k != kScenarioKey) out.push_back(k + "=" + toml_text(v));
  return out;
}

std::string point_name(const Point& point) {
  std::string s;
  for (const auto& [k, v] : point) {
    std::string value = toml_text(v);
    for (char& c : value)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
    s += (s.empty() ? "" : ",") + (k == kScenarioKey ? value : k.substr(k.rfind('.') + 1) + "=" + value);
  }
  return s;
}

std::vector<Point> grid_points(const Axes& axes) {
  std::vector<Point> points(1);
  for (const auto& [key, values] : axes) {
    std::vector<Point> next;
    for (const auto& p : points)
      for (const auto& v : values) {
        auto q = p;
        q.emplace_back(key, v);
        next.push_back(std::move(q));
      }
    points = std::move(next);
  }
  return points;
}

std::vector<int64_t> SweepSpec::seeds(bool quick) const {
  if (!quick || tuning.seeds.empty()) return tuning.seeds;  // empty without [tuning]
  if (!tuning.quick_seeds.empty()) return tuning.quick_seeds;
  return {tuning.seeds.front()};
}

const Axes& SweepSpec::tune_of(const SweepVariant& v, bool quick) const {
  return quick && !v.quick_tune.empty() ? v.quick_tune : v.tune;
}

const SweepScenario* SweepSpec::scenario_of(const Point& group) const {
  for (const auto& [k, v] : group)
    if (k == kScenarioKey)
      for (const auto& s : scenarios)
        if (v.is_string() && s.name == v.get<std::string>()) return &s;
  return nullptr;
}

bool SweepSpec::runs_in(const std::string& variant, const Point& group) const {
  const SweepScenario* s = scenario_of(group);
  return !s || s->variants.empty() || std::find(s->variants.begin(), s->variants.end(), variant) != s->variants.end();
}

bool SweepSpec::judged_in(const SweepClaim& claim, const Point& group) const {
  const SweepScenario* s = scenario_of(group);
  return !s || claim.scenarios.empty() || std::find(claim.scenarios.begin(), claim.scenarios.end(), s->name) != claim.scenarios.end();
}

namespace {

// The [sweep] table's settings, checked, into spec.
void read_sweep_table(const StudySection& sw, SweepSpec& spec) {
  spec.name = sw.name;
  if (spec.name.empty() || spec.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") != std::string::npos)
    bad("sweep.name", "must be lower-case letters, digits, - and _ (it names directories and a docs section)");
  spec.title = sw.title.empty() ? spec.name : sw.title;
  if (sw.version < 1) bad("sweep.version", "must be 1 or more (1: the first version; raise it when the grid or claims change)");
  spec.version = sw.version;
  spec.job = find_shipped(sw.job);
  if (!fs::exists(spec.job)) bad("sweep.job", "'" + spec.job + "' does not exist (" + shipped_hint() + ")");
  spec.target_from = sw.target_from;
  if (!(sw.target >= 0)) bad("sweep.target", "must be a loss >= 0 (0 = none)");
  spec.target = sw.target;
  if (sw.plot_x.empty()) bad("sweep.plot_x", "must be a non-empty list of step, time, bytes, consensus");
  for (const auto& x : sw.plot_x)
    if (x != "step" && x != "time" && x != "bytes" && x != "consensus") bad("sweep.plot_x", "entries are step, time, bytes or consensus");
  spec.plot_x = sw.plot_x;
  spec.keep_checkpoints = sw.keep_checkpoints;
  if (!(sw.learned_by >= 0)) bad("sweep.learned_by", "must be a number of nats >= 0");
  spec.learned_by = sw.learned_by;
  for (const auto& p : sw.project) {
    train::NetworkSection n;
    n.simulated_model = p;
    try {
      n.resolve();
    } catch (const ConfigError& e) {
      bad("sweep.project", "'" + p + "': " + e.what());
    }
  }
  spec.project = sw.project;
  if (!(sw.equal_time >= 0 && sw.equal_time < 1)) bad("sweep.equal_time", "must be a fraction in [0, 1) (0 = not checked)");
  if (sw.equal_time > 0 && sw.target_from.empty())
    bad("sweep.equal_time", "needs sweep.target_from: the budget is that variant's virtual time");
  spec.equal_time = sw.equal_time;
  spec.memory = sw.memory;
  spec.notes = sw.notes;
}

// kind = "consensus": what it needs, and the training-only keys it refuses (they would be ignored).
void read_kind(const json& raw, const StudySection& sw, SweepSpec& spec) {
  if (sw.kind != "train" && sw.kind != "consensus") bad("sweep.kind", "must be train or consensus");
  spec.consensus = sw.kind == "consensus";
  if (!spec.consensus) {
    for (const char* k : {"rounds", "rate_rounds", "dim"})
      if (raw.contains(k)) bad(std::string("sweep.") + k, "applies to kind = \"consensus\" only");
    return;
  }
  for (const char* k : {"target_from", "target", "plot_x", "project", "equal_time", "memory", "keep_checkpoints"})
    if (raw.contains(k)) bad(std::string("sweep.") + k, "applies to training studies only (this one has kind = \"consensus\")");
  if (sw.rounds < 1 || sw.rounds > 200) bad("sweep.rounds", "must be 1 to 200 (the table and plot show every round)");
  if (sw.rate_rounds < 1) bad("sweep.rate_rounds", "must be a number of rounds >= 1");
  if (sw.dim < 1) bad("sweep.dim", "must be a number of entries >= 1");
  spec.rounds = sw.rounds;
  spec.rate_rounds = sw.rate_rounds;
  spec.dim = sw.dim;
}

// The [[scenario]] tables: names unique, variants known (checked once variants are read).
void read_scenarios(const json& doc, SweepSpec& spec) {
  if (!doc.contains("scenario")) return;
  if (!doc["scenario"].is_array()) bad("scenario", "write scenarios as [[scenario]] tables");
  if (spec.consensus) bad("scenario", "a consensus study has no scenarios: give each setting its own variant");
  std::set<std::string> names;
  for (const auto& raw : doc["scenario"]) {
    const auto ss = read_section<ScenarioSection>(raw, "scenario");
    if (ss.name.empty() || ss.name.find_first_of("/ \t,=") != std::string::npos)
      bad("scenario.name", "must be a non-empty word (no / , = or spaces: it names directories)");
    if (!names.insert(ss.name).second) bad("scenario.name", "'" + ss.name + "' appears twice");
    spec.scenarios.push_back({ss.name, as_overrides(settings_of(ss.set, "scenario." + ss.name + ".set")), ss.variants});
  }
}

// [set], [quick], [grid], [quick_grid] and [tuning].
void read_run_tables(const json& doc, SweepSpec& spec) {
  if (doc.contains("set")) spec.settings = as_overrides(settings_of(doc["set"], "set"));
  if (doc.contains("quick")) spec.quick = as_overrides(settings_of(doc["quick"], "quick"));
  if (doc.contains("grid")) spec.grid = axes_of(doc["grid"], "grid");
  if (doc.contains("quick_grid")) {
    spec.quick_grid = axes_of(doc["quick_grid"], "quick_grid");
    for (const auto& [key, values] : spec.quick_grid)
      if (!has_axis(spec.grid, key)) bad("quick_grid." + key, "replaces a [grid] axis in --quick mode, but [grid] has no '" + key + "'");
  }
  if (doc.contains("tuning")) {
    spec.tuned = true;
    spec.tuning = read_section<TuningSection>(doc["tuning"], "tuning");
    if (spec.tuning.seeds.empty()) bad("tuning.seeds", "must list the fresh seeds the chosen points run on, e.g. [1, 2, 3]");
    for (int64_t s : spec.tuning.seeds)
      if (s == spec.tuning.seed) bad("tuning.seeds", fmt::format("holds the tuning seed {}: the reruns must be fresh seeds", s));
    if (has_axis(spec.grid, "train.seed")) bad("grid.train.seed", "with [tuning] the seeds are tuning.seeds, not a grid axis");
  }
}

// A variant's launch table and step_time_from (`names`: the variants declared before it, itself included).
void read_launch(const VariantSection& vs, const std::string& where, const std::set<std::string>& names, SweepVariant& var,
                 const SweepSpec& spec) {
  if (!vs.launch.empty()) {
    const auto ls = read_section<LaunchSection>(vs.launch, where + ".launch");
    if (ls.ranks < 2) bad(where + ".launch.ranks", "must be at least 2 processes, e.g. launch = { ranks = 4 }");
    var.ranks = ls.ranks;
    var.netns = ls.netns;
  }
  var.step_time_from = vs.step_time_from;
  if (spec.consensus && (var.ranks > 0 || !var.step_time_from.empty()))
    bad(where + (var.ranks > 0 ? ".launch" : ".step_time_from"), "a consensus study trains nothing: remove it");
  if (var.step_time_from.empty()) return;
  if (var.step_time_from == var.name || !names.count(var.step_time_from))
    bad(where + ".step_time_from", "'" + var.step_time_from + "' must be a variant declared before this one (it runs first)");
  if (!var.tune.empty() || !var.quick_tune.empty())
    bad(where + ".step_time_from", "a calibrated variant is paired with its calibration run by seed: give it no tune grid");
}

// The [[variant]] tables; returns their names.
std::set<std::string> read_variants(const json& doc, SweepSpec& spec) {
  std::set<std::string> names;
  for (const auto& v : doc["variant"]) {
    const auto vs = read_section<VariantSection>(v, "variant");
    SweepVariant var;
    var.name = vs.name;
    if (var.name.empty() || var.name.find_first_of("/ \t") != std::string::npos) bad("variant.name", "must be a non-empty word");
    if (!names.insert(var.name).second) bad("variant.name", "'" + var.name + "' appears twice");
    const std::string where = "variant." + var.name;
    var.settings = as_overrides(settings_of(vs.set, where + ".set"));
    var.tune = axes_of(vs.tune, where + ".tune");
    var.quick_tune = axes_of(vs.quick_tune, where + ".quick_tune");
    var.quick_settings = as_overrides(settings_of(vs.quick_set, where + ".quick_set"));
    if ((!var.tune.empty() || !var.quick_tune.empty()) && !spec.tuned)
      bad(where + ".tune", "a tuning grid needs a [tuning] table (seed, seeds)");
    for (const auto& [key, values] : var.quick_tune)
      if (!has_axis(var.tune, key)) bad(where + ".quick_tune." + key, "replaces a tune axis in --quick mode, but tune has no '" + key + "'");
    for (const auto& [key, values] : var.tune)
      if (key == "train.seed" || has_axis(spec.grid, key)) bad(where + ".tune." + key, "is also set by the sweep itself");
    read_launch(vs, where, names, var, spec);
    spec.variants.push_back(std::move(var));
  }
  return names;
}

// Launched runs talk over Gloo, in-process ones over the in-process cluster: the other way round
// a run would fail only when it starts.
void check_backend(const SweepSpec& spec, const std::string& variant, const train::JobConfig& job) {
  const auto& var = *std::find_if(spec.variants.begin(), spec.variants.end(), [&](const auto& v) { return v.name == variant; });
  const bool gloo = job.cluster.backend == "gloo";
  if (var.ranks > 0 && !gloo)
    bad("variant." + variant + ".launch", "launched runs need \"cluster.backend\" = \"gloo\" in the variant's set");
  if (var.ranks == 0 && job.cluster.backend != "inproc")
    bad("variant." + variant + ".set", "cluster.backend = \"" + job.cluster.backend.str() +
                                           "\" needs processes: add launch = { ranks = N } to the variant");
}

// Every run's job must load: a bad setting fails here, before hours of other runs.
void check_every_job_loads(const SweepSpec& spec) {
  for (bool quick : {false, true}) {
    auto runs = expand_tuning(spec, quick, "runs/experiments");
    for (auto& r : expand_final(spec, quick, "runs/experiments", {})) runs.push_back(std::move(r));
    for (const auto& r : runs) {
      train::JobConfig job;
      try {
        job = train::load_job(spec.job, r.overrides);
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("sweep run {} {}: {}", r.variant, r.dir.filename().string(), e.what()), e.hint());
      }
      check_backend(spec, r.variant, job);
    }
  }
}
}  // namespace

SweepSpec load_sweep(const fs::path& file) {
  SweepSpec spec;
  spec.file = file;
  const json doc = config::parse_toml_file(file.string());
  only_keys(doc, "sweep file", {"sweep", "set", "quick", "grid", "quick_grid", "tuning", "variant", "claim", "scenario"});
  if (!doc.contains("sweep")) bad("sweep", "the [sweep] table is required (name, job)");
  const auto sw = read_section<StudySection>(doc["sweep"], "sweep");
  if (!doc["sweep"].contains("name")) bad("sweep.name", "is required");
  if (!doc["sweep"].contains("job")) bad("sweep.job", "is required");
  read_sweep_table(sw, spec);
  read_kind(doc["sweep"], sw, spec);
  read_run_tables(doc, spec);
  if (spec.consensus && spec.tuned) bad("tuning", "a consensus study trains nothing, so it has nothing to tune");
  read_scenarios(doc, spec);
  if (!doc.contains("variant") || !doc["variant"].is_array() || doc["variant"].empty())
    bad("variant", "at least one [[variant]] with a name (and its settings) is required");
  const std::set<std::string> names = read_variants(doc, spec);
  if (!spec.target_from.empty() && !names.count(spec.target_from))
    bad("sweep.target_from", "'" + spec.target_from + "' is not a variant");
  for (const auto& sc : spec.scenarios) {
    for (const auto& v : sc.variants)
      if (!names.count(v)) bad("scenario." + sc.name + ".variants", "'" + v + "' is not a variant");
    if (!spec.target_from.empty() && !spec.runs_in(spec.target_from, {{kScenarioKey, sc.name}}))
      bad("scenario." + sc.name + ".variants", "must include target_from '" + spec.target_from + "': each group's target is its loss");
    for (const auto& v : spec.variants)
      if (!v.step_time_from.empty() && spec.runs_in(v.name, {{kScenarioKey, sc.name}}) &&
          !spec.runs_in(v.step_time_from, {{kScenarioKey, sc.name}}))
        bad("scenario." + sc.name + ".variants", "runs '" + v.name + "' but not '" + v.step_time_from + "', whose run sets its step time");
  }
  if (doc.contains("claim")) {
    if (!doc["claim"].is_array()) bad("claim", "write claims as [[claim]] tables");
    for (const auto& c : doc["claim"]) {
      const auto cl = read_section<ClaimSection>(c, "claim");
      check_claim(spec, names, c, cl);
      spec.claims.push_back(cl);
    }
  }
  check_every_job_loads(spec);
  return spec;
}

}  // namespace gasloc::study
