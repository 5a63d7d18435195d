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

void check_claim(const SweepSpec& spec, const std::set<std::string>& names, const json& raw, const SweepClaim& cl) {
  for (const char* k : {"text", "kind", "a", "b"})
    if (!raw.contains(k)) bad(std::string("claim.") + k, "is required");
  if (cl.kind != "lower" && cl.kind != "within" && cl.kind != "no_worse" && cl.kind != "faster")
    bad("claim.kind", "must be lower, within, no_worse or faster");
  for (const auto& n : {cl.a, cl.b})
    if (!names.count(n)) bad("claim.a/b", "'" + n + "' is not a variant");
  if (cl.tolerance < 0) bad("claim.tolerance", "must be a number >= 0");
  if (cl.by != "time" && cl.by != "steps") bad("claim.by", "must be time (virtual seconds) or steps");
  if (raw.contains("by") && cl.kind != "faster") bad("claim.by", "only a 'faster' claim measures time or steps");
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
  for (const auto& [k, v] : kv) out.push_back(k + "=" + toml_text(v));
  return out;
}

std::string point_name(const Point& point) {
  std::string s;
  for (const auto& [k, v] : point) {
    std::string value = toml_text(v);
    for (char& c : value)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
    s += (s.empty() ? "" : ",") + k.substr(k.rfind('.') + 1) + "=" + value;
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
  if (!quick) return tuning.seeds;
  if (!tuning.quick_seeds.empty()) return tuning.quick_seeds;
  return {tuning.seeds.front()};
}

const Axes& SweepSpec::tune_of(const SweepVariant& v, bool quick) const {
  return quick && !v.quick_tune.empty() ? v.quick_tune : v.tune;
}

namespace {

// The [sweep] table's settings, checked, into spec.
void read_sweep_table(const StudySection& sw, SweepSpec& spec) {
  spec.name = sw.name;
  if (spec.name.empty() || spec.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") != std::string::npos)
    bad("sweep.name", "must be lower-case letters, digits, - and _ (it names directories and a docs section)");
  spec.title = sw.title.empty() ? spec.name : sw.title;
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
    spec.variants.push_back(std::move(var));
  }
  return names;
}

// Every run's job must load: a bad setting fails here, before hours of other runs.
void check_every_job_loads(const SweepSpec& spec) {
  for (bool quick : {false, true}) {
    auto runs = expand_tuning(spec, quick, "runs/experiments");
    for (auto& r : expand_final(spec, quick, "runs/experiments", {})) runs.push_back(std::move(r));
    for (const auto& r : runs) {
      try {
        train::load_job(spec.job, r.overrides);
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("sweep run {} {}: {}", r.variant, r.dir.filename().string(), e.what()), e.hint());
      }
    }
  }
}
}  // namespace

SweepSpec load_sweep(const fs::path& file) {
  SweepSpec spec;
  spec.file = file;
  const json doc = config::parse_toml_file(file.string());
  only_keys(doc, "sweep file", {"sweep", "set", "quick", "grid", "quick_grid", "tuning", "variant", "claim"});
  if (!doc.contains("sweep")) bad("sweep", "the [sweep] table is required (name, job)");
  const auto sw = read_section<StudySection>(doc["sweep"], "sweep");
  if (!doc["sweep"].contains("name")) bad("sweep.name", "is required");
  if (!doc["sweep"].contains("job")) bad("sweep.job", "is required");
  read_sweep_table(sw, spec);
  read_run_tables(doc, spec);
  if (!doc.contains("variant") || !doc["variant"].is_array() || doc["variant"].empty())
    bad("variant", "at least one [[variant]] with a name (and its settings) is required");
  const std::set<std::string> names = read_variants(doc, spec);
  if (!spec.target_from.empty() && !names.count(spec.target_from))
    bad("sweep.target_from", "'" + spec.target_from + "' is not a variant");
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
