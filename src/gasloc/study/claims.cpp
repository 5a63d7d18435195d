#include "gasloc/study/claims.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/study/runs_csv.hpp"
#include "gasloc/study/section.hpp"
#include "gasloc/study/sweep.hpp"
#include "gasloc/study/verdict.hpp"

namespace gasloc::study {
namespace fs = std::filesystem;

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

bool has_loss(const RunOutcome& r) { return !std::isnan(r.val_loss); }

// The highest of the values, 0 when there are none (a target nothing sets).
double highest(const std::vector<double>& v) { return v.empty() ? 0.0 : stats_of(v).hi; }

const std::vector<RunOutcome>& finals_of(const GroupOutcomes& grp, const std::string& variant) {
  static const std::vector<RunOutcome> none;
  const auto it = grp.finals.find(variant);
  return it == grp.finals.end() ? none : it->second;
}

}  // namespace

Point group_point(const Point& p) {
  Point out;
  for (const auto& kv : p)
    if (kv.first != "train.seed") out.push_back(kv);
  return out;
}

std::vector<double> early_fractions(const SweepSpec& spec) {
  std::set<double> f;
  for (const auto& c : spec.claims)
    if (c.kind == "faster" && c.target_at < 1) f.insert(c.target_at);
  return {f.begin(), f.end()};
}

double shared_unigram(const GroupOutcomes& grp) {
  double unigram = -1;
  bool shared = true;
  auto see = [&](const RunOutcome& r) {
    if (r.unigram < 0) return;
    if (unigram < 0) unigram = r.unigram;
    shared = shared && std::abs(unigram - r.unigram) < 1e-9;
  };
  for (const auto& [v, rs] : grp.finals)
    for (const auto& r : rs) see(r);
  for (const auto& r : grp.tuning) see(r);
  return shared ? unigram : -1;
}

double group_target(const SweepSpec& spec, const GroupOutcomes& grp) {
  if (spec.target_from.empty()) return spec.target;
  // The highest of the reference's final losses, not their mean: every reference run reaches
  // it, so a time-to-target verdict never fails for the reference's own seeds.
  std::vector<double> f;
  for (const auto& r : finals_of(grp, spec.target_from))
    if (has_loss(r)) f.push_back(r.val_loss);
  return highest(f);
}

double early_target(const SweepSpec& spec, const GroupOutcomes& grp, double fraction) {
  std::vector<double> at;
  for (const auto& r : finals_of(grp, spec.target_from))
    if (const auto it = r.loss_at.find(fraction); it != r.loss_at.end() && !std::isnan(it->second)) at.push_back(it->second);
  return highest(at);
}

double time_budget(const SweepSpec& spec, const GroupOutcomes& grp) {
  if (spec.equal_time <= 0) return 0.0;
  double budget = 0;
  for (const auto& r : finals_of(grp, spec.target_from)) budget = std::max(budget, r.virtual_s);
  return budget;
}

std::string over_budget(const SweepSpec& spec, const std::string& name, const std::vector<RunOutcome>& runs, double budget) {
  for (const auto& r : runs) {
    const double t = r.virtual_s;
    if (t > budget * (1 + 1e-9) || t < budget * (1 - spec.equal_time))
      return fmt::format("{}'s runs ended at {:.1f} virtual s, not within {:.0f}% below the budget of {:.1f} s ({}'s); set its "
                         "train.steps to fit",
                         name, t, 100 * spec.equal_time, budget, spec.target_from);
  }
  return "";
}

namespace {

// Why a claim's runs cannot support a verdict ("" when they can): no runs, or unfinished ones.
std::string unready(const std::string& name, const std::vector<RunOutcome>& runs) {
  if (runs.empty()) return name + " has no runs";
  for (const auto& r : runs)
    if (!r.finished) return name + " has unfinished runs";
  return "";
}

// Why a variant's runs have not learned ("" when they have): the worst did not end learned_by
// nats below the unigram baseline (unknown baseline: not checked).
std::string unlearned(const SweepSpec& spec, const std::string& name, const std::vector<RunOutcome>& runs, double unigram) {
  double worst = -kNever;
  for (const auto& r : runs) worst = std::max(worst, r.val_loss);
  if (unigram >= 0 && worst > unigram - spec.learned_by)
    return fmt::format("{}'s worst run ends {:.2f} nats below the unigram baseline {:.4f}, not the {:.1f} a verdict needs",
                       name, unigram - worst, unigram, spec.learned_by);
  return "";
}

// Time (steps or virtual seconds) to a target per seed, +inf where a run never reached it;
// `fraction` < 1 picks a claim's earlier target.
BySeed times_to(const std::vector<RunOutcome>& runs, double fraction, bool steps) {
  BySeed out;
  for (const auto& r : runs) {
    const auto it = r.early.find(fraction);
    const Crossing c = fraction >= 1 ? r.target : it == r.early.end() ? Crossing{} : it->second;
    out[r.seed] = steps ? c.steps : c.seconds;
  }
  return out;
}

BySeed losses_of(const std::vector<RunOutcome>& runs) {
  BySeed out;
  for (const auto& r : runs)
    if (has_loss(r)) out[r.seed] = r.val_loss;
  return out;
}

// Each run's final time on its clock (the wall clock for launched runs) per seed; with_eval adds
// the evaluations the virtual clock priced apart (a real clock's time already holds them).
BySeed final_times_of(const std::vector<RunOutcome>& runs, bool with_eval) {
  BySeed out;
  for (const auto& r : runs) out[r.seed] = r.virtual_s + (with_eval ? r.eval_s : 0.0);
  return out;
}

// A faster claim: time (or steps) to the group's target, or to target_from's loss at
// c.target_at of its steps; `why` gets the equal-time budget's objection, if any.
Judgement judge_faster_claim(const SweepSpec& spec, const SweepClaim& c, const GroupOutcomes& grp, std::string& why) {
  const auto &ra = finals_of(grp, c.a), &rb = finals_of(grp, c.b);
  const bool steps = c.by == "steps";
  const double budget = time_budget(spec, grp);
  if (why.empty() && !steps && budget > 0) why = over_budget(spec, c.a, ra, budget);
  if (why.empty() && !steps && budget > 0) why = over_budget(spec, c.b, rb, budget);
  std::string which = "target";
  const double fraction = c.target_at < 1 ? c.target_at : 1.0;
  if (fraction < 1)  // this claim's own target: target_from's loss earlier in its runs
    which = fmt::format("target {:.4f} ({}'s loss at {:.0f}% of its steps, the highest of its runs)",
                        early_target(spec, grp, fraction), spec.target_from, 100 * fraction);
  Judgement j = judge_faster(times_to(ra, fraction, steps), times_to(rb, fraction, steps), c.tolerance, steps ? "steps" : "virtual s");
  j.numbers = (steps ? "steps to " : "virtual s to ") + which + ": " + j.numbers;
  return j;
}

// lower, within, no_worse: on the final losses, or with by = "time" on the runs' final times.
Judgement judge_value_claim(const SweepClaim& c, const GroupOutcomes& grp) {
  const bool with_eval = c.by == "time_and_eval", time = c.by == "time" || with_eval;
  const BySeed a = time ? final_times_of(finals_of(grp, c.a), with_eval) : losses_of(finals_of(grp, c.a));
  const BySeed b = time ? final_times_of(finals_of(grp, c.b), with_eval) : losses_of(finals_of(grp, c.b));
  Judgement j = c.kind == "within" ? judge_within(a, b, c.tolerance) : c.kind == "no_worse" ? judge_no_worse(a, b, c.tolerance)
                                                                                            : judge_lower(a, b);
  j.numbers = (with_eval ? "final time with priced evaluations (s, each run's own clock): "
               : time    ? "final time (s, each run's own clock): "
                         : "final loss: ") +
              j.numbers;
  return j;
}

}  // namespace

std::vector<std::string> judge_claims(const SweepSpec& spec, const GroupOutcomes& grp, const std::string& label) {
  const double unigram = shared_unigram(grp);
  std::vector<std::string> lines;
  for (const auto& c : spec.claims) {
    if (!spec.judged_in(c, grp.point)) continue;
    const auto &ra = finals_of(grp, c.a), &rb = finals_of(grp, c.b);
    // The unigram gate is the reference's (b): without a learned reference there is nothing to
    // compare against; a subject (a) that did not learn while b did fails the claim.
    std::string why = unready(c.a, ra);
    if (why.empty()) why = unready(c.b, rb);
    if (why.empty()) why = unlearned(spec, c.b, rb, unigram);
    Judgement j = c.kind == "faster" ? judge_faster_claim(spec, c, grp, why) : judge_value_claim(c, grp);
    const std::string failed = why.empty() ? unlearned(spec, c.a, ra, unigram) : "";
    if (!why.empty()) j.verdict = "says nothing: " + why;
    else if (!failed.empty()) j.verdict = fmt::format("not reproduced: {}, while {} learned", failed, c.b);
    lines.push_back(fmt::format("- {}{}: **{}** (a = {}, b = {}; {})", c.text, label.empty() ? "" : " [" + label + "]", j.verdict,
                                c.a, c.b, j.numbers));
  }
  return lines;
}

std::string claims_md(const std::vector<std::string>& lines) {
  if (lines.empty()) return "";
  std::string md = "\nClaims:\n\n";
  for (const auto& l : lines) md += l + "\n";
  return md;
}

namespace {

// The runs table's columns; each target_at fraction f adds loss_at_f, steps_to_target_at_f and
// virtual_s_to_target_at_f.
const std::vector<std::string> kTableColumns = {"run",           "variant",    "group",       "tune",
                                                "tuning",        "seed",       "finished",    "val_loss",
                                                "unigram",       "virtual_s",  "eval_s",      "steps_to_target",
                                                "virtual_s_to_target", "mb_per_worker", "consensus", "utilization"};

std::vector<std::string> columns_of(const SweepSpec& spec) {
  std::vector<std::string> cols = kTableColumns;
  for (double f : early_fractions(spec))
    for (const char* c : {"loss_at_", "steps_to_target_at_", "virtual_s_to_target_at_"}) cols.push_back(fmt::format("{}{}", c, f));
  return cols;
}

// A number as the shortest text that reads back to the same double: "inf" for never, "" for NaN.
std::string number(double x) { return std::isnan(x) ? std::string() : fmt::format("{}", x); }

// One run's cells, in columns_of's order.
std::vector<std::string> cells_of(const SweepSpec& spec, const RunOutcome& r) {
  std::vector<std::string> c = {r.run, r.variant, r.group, r.tune, r.tuning ? "1" : "0", std::to_string(r.seed),
                                r.finished ? "1" : "0", number(r.val_loss), number(r.unigram), number(r.virtual_s),
                                number(r.eval_s), number(r.target.steps), number(r.target.seconds), number(r.mb_per_worker),
                                number(r.consensus), number(r.utilization)};
  for (double f : early_fractions(spec)) {
    const auto at = r.loss_at.find(f);
    const auto e = r.early.find(f);
    const Crossing x = e == r.early.end() ? Crossing{} : e->second;
    c.insert(c.end(), {number(at == r.loss_at.end() ? std::nan("") : at->second), number(x.steps), number(x.seconds)});
  }
  return c;
}

}  // namespace

std::string runs_table_csv(const SweepSpec& spec, const std::vector<GroupOutcomes>& groups) {
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) {
      if (i) out += ',';
      out += csv_cell(cells[i]);
    }
    out += "\n";
  };
  line(columns_of(spec));
  for (const auto& g : groups) {
    for (const auto& [v, rs] : g.finals)
      for (const auto& r : rs) line(cells_of(spec, r));
    for (const auto& r : g.tuning) line(cells_of(spec, r));
  }
  return out;
}

namespace {

// Reads one row of the runs table back; `at` says where, for errors.
class RowReader {
 public:
  RowReader(const std::vector<std::string>& header, const std::string& where) : where_(where) {
    for (size_t i = 0; i < header.size(); ++i) index_[header[i]] = i;
  }
  void check(const std::vector<std::string>& columns) const {
    for (const auto& c : columns)
      if (!index_.count(c))
        throw DataError(fmt::format("'{}' has no column '{}'", where_, c),
                        "it was written for another version of the study or of gasloc: regenerate it with `gasloc sweep FILE --doc DOC`");
  }
  const std::string& text(const std::vector<std::string>& row, size_t line, const std::string& col) const {
    const size_t i = index_.at(col);
    if (i >= row.size()) throw DataError(fmt::format("'{}' line {}: the row has no cell '{}'", where_, line, col), "is the file cut short?");
    return row[i];
  }
  double number(const std::vector<std::string>& row, size_t line, const std::string& col) const {
    const std::string& s = text(row, line, col);
    if (s.empty()) return std::nan("");
    char* end = nullptr;
    const double x = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size())
      throw DataError(fmt::format("'{}' line {}: '{}' is not a number in column '{}'", where_, line, s, col), "regenerate the table");
    return x;
  }

 private:
  std::string where_;
  std::map<std::string, size_t> index_;
};

RunOutcome outcome_of(const SweepSpec& spec, const RowReader& rd, const std::vector<std::string>& row, size_t line) {
  RunOutcome r;
  r.run = rd.text(row, line, "run");
  r.variant = rd.text(row, line, "variant");
  r.group = rd.text(row, line, "group");
  r.tune = rd.text(row, line, "tune");
  r.tuning = rd.text(row, line, "tuning") == "1";
  r.seed = static_cast<int64_t>(rd.number(row, line, "seed"));
  r.finished = rd.text(row, line, "finished") == "1";
  r.val_loss = rd.number(row, line, "val_loss");
  r.unigram = rd.number(row, line, "unigram");
  r.virtual_s = rd.number(row, line, "virtual_s");
  r.eval_s = rd.number(row, line, "eval_s");
  r.target = {rd.number(row, line, "steps_to_target"), rd.number(row, line, "virtual_s_to_target")};
  r.mb_per_worker = rd.number(row, line, "mb_per_worker");
  r.consensus = rd.number(row, line, "consensus");
  r.utilization = rd.number(row, line, "utilization");
  for (double f : early_fractions(spec)) {
    r.loss_at[f] = rd.number(row, line, fmt::format("loss_at_{}", f));
    r.early[f] = {rd.number(row, line, fmt::format("steps_to_target_at_{}", f)),
                  rd.number(row, line, fmt::format("virtual_s_to_target_at_{}", f))};
  }
  return r;
}

}  // namespace

std::vector<GroupOutcomes> read_runs_table(const SweepSpec& spec, bool quick, const std::string& csv, const std::string& where) {
  // The groups come from the study file, in the order the section lists them (its runs' order:
  // tuning, then finals), so a group whose runs never started is judged too ("has no runs").
  std::vector<SweepRun> runs = expand_tuning(spec, quick, "");
  for (auto& r : expand_final(spec, quick, "", {})) runs.push_back(std::move(r));
  std::vector<GroupOutcomes> groups;
  std::map<std::string, size_t> by_name;
  for (const auto& r : runs) {
    const Point g = group_point(r.point);
    if (by_name.emplace(point_name(g), groups.size()).second) groups.push_back({g, {}, {}});
  }
  const auto rows = parse_csv(csv, where);
  if (rows.empty()) throw DataError("'" + where + "' is empty", "regenerate it with `gasloc sweep FILE --doc DOC`");
  const RowReader rd(rows.front(), where);
  rd.check(columns_of(spec));
  for (size_t i = 1; i < rows.size(); ++i) {
    RunOutcome r = outcome_of(spec, rd, rows[i], i + 1);
    const auto g = by_name.find(r.group);
    if (g == by_name.end())
      throw DataError(fmt::format("'{}' line {}: group '{}' is not one of the study's", where, i + 1, r.group),
                      "the table is another version's: regenerate it with `gasloc sweep FILE --doc DOC`");
    auto& grp = groups[g->second];
    if (r.tuning) grp.tuning.push_back(std::move(r));
    else grp.finals[r.variant].push_back(std::move(r));
  }
  return groups;
}

std::string verdicts_from_table(const SweepSpec& spec, bool quick, const std::string& csv, const std::string& where) {
  std::vector<std::string> lines;
  for (const auto& grp : read_runs_table(spec, quick, csv, where)) {
    const std::string g = point_name(grp.point);
    for (auto& l : judge_claims(spec, grp, g)) lines.push_back(std::move(l));
  }
  return claims_md(lines);
}

fs::path runs_table_path(const fs::path& plots_dir, const SweepSpec& spec, bool quick) {
  return plots_dir / (spec.name + (quick ? "-quick" : "") + "-runs.csv");
}

std::string reverdict(const fs::path& doc, const SweepSpec& spec, bool quick) {
  const std::string id = spec.name + (quick ? "-quick" : "");
  const std::string rerun = fmt::format("`gasloc sweep {}{} --doc {}`", spec.file.string(), quick ? " --quick" : "", doc.string());
  if (!fs::exists(doc)) throw ConfigError(fmt::format("'{}' does not exist", doc.string()), "pass the results document with --doc");
  if (spec.consensus)
    return fmt::format("{}: a consensus study simulates its variants as its section is written: left as it is ({} "
                       "judges it again in seconds)",
                       id, rerun);
  std::string text = read_file(doc);
  const std::string section = find_doc_section(text, id);
  if (section.empty()) return fmt::format("{}: no section in {}: not run yet ({})", id, doc.string(), rerun);
  SweepOptions o;
  o.doc = doc;
  const fs::path table = runs_table_path(plot_dir(o), spec, quick);
  if (!fs::exists(table))
    return fmt::format("{}: no runs table {}: its verdicts stay as generated ({} writes it; finished runs are reused)", id,
                       table.string(), rerun);
  const std::string claims = verdicts_from_table(spec, quick, read_file(table), table.string());
  // The claim lines run from "Claims:" to the section's end marker.
  const std::string end = "<!-- " + id + ":end -->";
  const auto at = section.rfind("\nClaims:\n\n");
  const size_t from = at == std::string::npos ? section.size() - end.size() : at;
  std::string updated = section;
  updated.replace(from, section.size() - end.size() - from, claims);
  text.replace(text.find(section), section.size(), updated);
  write_file_atomic(doc, text);
  return fmt::format("{}: judged again from {}", id, table.string());
}

}  // namespace gasloc::study
