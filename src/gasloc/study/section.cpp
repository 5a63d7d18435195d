#include "gasloc/study/section.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>
#include <optional>

#include "gasloc/algo/compression.hpp"
#include "gasloc/algo/registry.hpp"
#include "gasloc/comm/network_model.hpp"
#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/study/claims.hpp"
#include "gasloc/study/plot.hpp"
#include "gasloc/study/run_summary.hpp"
#include "gasloc/study/verdict.hpp"
#include "gasloc/topology/spectral.hpp"
#include "gasloc/topology/topology.hpp"
#include "gasloc/train/job_config.hpp"

namespace gasloc::study {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

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

// A finished run's seed for pairing: its own (tuned studies) or its grid's train.seed.
int64_t seed_of(const SweepRun& r) {
  if (r.seed != 0) return r.seed;
  for (const auto& [k, v] : r.point)
    if (k == "train.seed" && v.is_number_integer()) return v.get<int64_t>();
  return 0;
}

struct Loaded {
  const SweepRun* run;
  RunSummary summary;
};

struct Group {
  Point point;                                                // its scenario and grid values, no seed
  std::map<std::string, std::vector<Loaded>> finals, tuning;  // variant -> its runs that have started
  GroupOutcomes out;                                          // the same runs as the verdicts read them
};


std::string axes_text(const Axes& grid) {
  std::string out;
  for (const auto& [k, vals] : grid) {
    std::string s;
    for (const auto& v : vals) s += (s.empty() ? "" : ", ") + toml_text(v);
    out += fmt::format("{}`{}` in {{{}}}", out.empty() ? "" : " x ", k, s);
  }
  return out;
}

std::string seeds_text(const std::vector<int64_t>& s) {
  std::string out;
  for (auto x : s) out += (out.empty() ? "" : ", ") + std::to_string(x);
  return out;
}

}  // namespace

std::string settings_list(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "`--set " : " --set ") + x;
  return s.empty() ? std::string("none") : s + "`";
}

fs::path plot_dir(const SweepOptions& opts) {
  return !opts.plots_dir.empty() ? opts.plots_dir
         : opts.doc.empty()     ? fs::path("sweep-plots")
                                : fs::absolute(opts.doc).parent_path() / "results";
}

std::string plot_link(const SweepOptions& opts, const fs::path& png) {
  return (opts.doc.empty() ? png : fs::relative(fs::absolute(png), fs::absolute(opts.doc).parent_path())).string();
}

Projection project_run(const fs::path& run_dir, const std::string& model) {
  const json doc = json::parse(read_file(run_dir / "run.json"), nullptr, false);
  if (doc.is_discarded() || !doc.contains("config")) throw ConfigError("corrupt '" + (run_dir / "run.json").string() + "'");
  const train::JobConfig job = train::job_from_json(
      doc["config"], {"network.simulated_model=" + model, "network.simulated_model_bytes=0", "train.run_dir=" + run_dir.string()});
  const int n = static_cast<int>(job.cluster.workers);
  const comm::NetworkModel net = job.network.model(n);
  const double P = static_cast<double>(job.network.simulated_model_bytes);
  const algo::AlgorithmEntry& entry = algo::algorithm(job.algo.name);
  Projection p;
  p.compute_s = static_cast<double>(job.train.steps) * job.network.step_time_s;
  if (entry.single_worker || n < 2) return p;
  p.rounds = entry.rounds_in(job.train.steps, job.algo.H);
  const bool all_reduce = entry.all_reduces(job.algo.topology);
  std::optional<topology::Topology> topo;
  if (!all_reduce) topo.emplace(topology::parse_kind(job.algo.topology), n, static_cast<uint64_t>(job.train.seed));
  // A compressed run's messages are its codec's bytes for the projected model's parameters: an
  // all-reduce priced as a ring moving the same bytes, a gossip message as one payload a peer,
  // and delta's reference refreshed by an int8 all-reduce every K rounds. Modulo's fp32 first
  // round and its resends depend on the run's gaps: they are left out.
  double message = P, total = all_reduce ? static_cast<double>(comm::ring_allreduce_bytes(static_cast<int64_t>(P), n)) : 0;
  std::optional<double> refresh;  // delta: the reference's all-reduce, as a ring's message
  int64_t refresh_every = 0;
  if (const auto o = algo::compression_options(job.algo)) {
    const auto params = static_cast<int64_t>(P) / std::max<int64_t>(1, job.network.simulated_element_bytes);
    const double ring_share = 2.0 * (n - 1) / n;
    if (all_reduce) {
      total = static_cast<double>(algo::compressed_all_reduce_bytes(o->codec, params, n));
      message = total / ring_share;
    } else {
      message = static_cast<double>(algo::gossip_message_bytes(*o, params));
      if (o->gossip == algo::GossipCodec::delta) {
        refresh = static_cast<double>(algo::compressed_all_reduce_bytes(comm::Codec::int8(o->codec.chunk), params, n)) / ring_share;
        refresh_every = o->reference_every;
      }
    }
  }
  if (!all_reduce) total = static_cast<double>(topology::bytes_per_worker_per_round(*topo, static_cast<int64_t>(message)));
  double refresh_mb = 0;
  const std::vector<double> zero(n, 0.0);
  for (int64_t r = 0; r < p.rounds; ++r) {
    std::vector<comm::ClockUpdate> c;
    if (all_reduce) {
      c = comm::all_reduce_clocks(net, message, zero);
    } else {
      std::vector<std::vector<int>> peers(n);
      for (int i = 0; i < n; ++i) peers[i] = topo->peers(i, r);
      c = comm::exchange_clocks(net, message, peers, zero);
      if (refresh && (r == 0 || (refresh_every > 0 && r % refresh_every == 0))) {
        const auto ar = comm::all_reduce_clocks(net, *refresh, zero);
        for (size_t i = 0; i < c.size(); ++i) c[i].end_s += ar[i].end_s;
        refresh_mb += *refresh * 2.0 * (n - 1) / n / 1e6;
      }
    }
    double mean = 0, slowest = 0;
    for (const auto& u : c) {
      mean += u.end_s / n;
      slowest = std::max(slowest, u.end_s);
    }
    p.seconds_per_round += mean / static_cast<double>(p.rounds);
    p.slowest_per_round += slowest / static_cast<double>(p.rounds);
  }
  p.mb_per_round = total / 1e6 + (p.rounds > 0 ? refresh_mb / static_cast<double>(p.rounds) : 0.0);
  return p;
}

namespace {

// The started runs by group (their point without the seed), in the order the runs list them.
struct Groups {
  std::map<std::string, Group> by_name;
  std::vector<std::string> order;
  double wall_s = 0;
  int started = 0;
};
Groups collect_groups(const std::vector<SweepRun>& runs) {
  Groups out;
  for (const auto& r : runs) {
    const std::string g = point_name(group_point(r.point));
    if (!out.by_name.count(g)) {
      out.order.push_back(g);
      out.by_name[g].point = out.by_name[g].out.point = group_point(r.point);
    }
    auto& grp = out.by_name[g];
    if (r.provisional || !fs::exists(r.dir / "run.json")) continue;
    Loaded l{&r, read_run_summary(r.dir)};
    out.wall_s += l.summary.wall_s;
    ++out.started;
    (r.tuning ? grp.tuning : grp.finals)[r.variant].push_back(std::move(l));
  }
  return out;
}

// A run's row of the runs table, but its times to the group's targets (add_crossings): what it
// ended at, and its loss at each claim's target_at fraction of its steps.
RunOutcome outcome_of(const SweepSpec& spec, const Loaded& l, const fs::path& study_dir) {
  const SweepRun& r = *l.run;
  const RunSummary& s = l.summary;
  RunOutcome o;
  const fs::path rel = r.dir.lexically_relative(study_dir);
  o.run = rel.empty() || *rel.begin() == ".." ? r.dir.string() : rel.string();
  o.variant = r.variant;
  o.group = point_name(group_point(r.point));
  o.tune = point_name(r.tune);
  o.tuning = r.tuning;
  o.seed = seed_of(r);
  o.finished = s.finished();
  if (s.has_val_loss) o.val_loss = s.val_loss;
  o.unigram = s.unigram;
  o.virtual_s = s.virtual_s;
  o.eval_s = s.eval_s;
  o.mb_per_worker = s.mb_per_worker;
  o.consensus = s.consensus;
  o.utilization = s.utilization;
  for (double f : early_fractions(spec))
    o.loss_at[f] = loss_at(s.curve, f * static_cast<double>(s.planned_steps)).value_or(std::nan(""));
  return o;
}

// Where a curve reaches a target (never for a target of 0: none).
Crossing crossing(const RunSummary& s, double target) {
  const auto hit = target > 0 ? reach_target(s.curve, target) : std::nullopt;
  return hit ? Crossing{hit->first, hit->second} : Crossing{};
}

// The group's runs as the verdicts read them (grp.out): their rows first, then, from target_from's
// rows, the group's targets, and each run's times to them.
void add_outcomes(const SweepSpec& spec, Group& grp, const fs::path& study_dir) {
  for (const auto& [v, rs] : grp.finals)
    for (const auto& l : rs) grp.out.finals[v].push_back(outcome_of(spec, l, study_dir));
  for (const auto& [v, rs] : grp.tuning)
    for (const auto& l : rs) grp.out.tuning.push_back(outcome_of(spec, l, study_dir));
  const double target = group_target(spec, grp.out);
  std::map<double, double> early;
  for (double f : early_fractions(spec)) early[f] = early_target(spec, grp.out, f);
  auto add = [&](RunOutcome& o, const RunSummary& s) {
    o.target = crossing(s, target);
    for (const auto& [f, t] : early) o.early[f] = crossing(s, t);
  };
  for (auto& [v, rs] : grp.finals)
    for (size_t i = 0; i < rs.size(); ++i) add(grp.out.finals[v][i], rs[i].summary);
  size_t k = 0;
  for (const auto& [v, rs] : grp.tuning)
    for (const auto& l : rs) add(grp.out.tuning[k++], l.summary);
}

// The scenarios, each with its settings and the variants that run in it ("" without scenarios).
std::string scenarios_md(const SweepSpec& spec) {
  if (spec.scenarios.empty()) return "";
  std::string md = "\nScenarios (each a group below; its settings come before the variant's):\n\n"
                   "| scenario | settings | variants |\n| --- | --- | --- |\n";
  for (const auto& sc : spec.scenarios) {
    std::string vs;
    for (const auto& v : sc.variants) vs += (vs.empty() ? "" : ", ") + v;
    md += fmt::format("| {} | {} | {} |\n", sc.name, settings_list(sc.settings), vs.empty() ? "all" : vs);
  }
  return md;
}

// The verdict rule, as the section's opening states it (docs/experiments.md, "Seeds and verdicts").
constexpr const char* kPairedRule =
    "they pair the variants by seed and need the mean paired difference to exceed the spread of the paired differences "
    "(their min-max range), else they are inconclusive; a claim whose variants share no seed is judged unpaired, on the "
    "means against the larger of the two variants' min-max ranges";

// The unigram gate, as the section's opening states it.
std::string gate_text(const SweepSpec& spec) {
  return fmt::format("every run of the reference (b) {:.1f} nats below the unigram baseline (else a claim says nothing); a "
                     "subject (a) whose runs do not get there while b's do is not reproduced",
                     spec.learned_by);
}

// The section's opening: what was run, the variants and their grids, the tuning protocol.
std::string header_md(const SweepSpec& spec, const SweepOptions& opts, const std::string& id, int started, double wall_s) {
  std::string md = fmt::format("{}\n## {}{}\n\n", section_begin(id, opts.command, spec.version), spec.title,
                               opts.quick ? " (quick mode)" : "");
  md += fmt::format("Generated by `{}` on {} UTC{}. Base job `{}`; settings of every run: {}", opts.command,
                    fmt::format("{:%Y-%m-%d}", fmt::gmtime(std::time(nullptr))), version_text(spec), spec.job,
                    settings_list(spec.settings));
  if (opts.quick) md += fmt::format("; quick mode adds {}", settings_list(spec.quick));
  md += ".\n\n| variant | settings | tuning grid |\n| --- | --- | --- |\n";
  for (const auto& v : spec.variants) {
    const Axes& tune = spec.tune_of(v, opts.quick);
    const bool one = grid_points(tune).size() < 2;
    std::string settings = settings_list(v.settings);
    if (opts.quick && !v.quick_settings.empty()) settings += "; quick mode adds " + settings_list(v.quick_settings);
    if (v.ranks > 0)
      settings += fmt::format("; run as {} processes (`gasloc launch -n {}{}`): its times are the wall clock", v.ranks, v.ranks,
                              v.netns ? " --netns" : "");
    if (!v.step_time_from.empty())
      settings += "; `network.step_time_s` is the seconds per step that " + v.step_time_from + "'s run of the same group measured";
    md += fmt::format("| {} | {} | {} |\n", v.name, settings,
                      tune.empty() ? "-" : axes_text(tune) + (one ? " (one point: not tuned)" : ""));
  }
  md += scenarios_md(spec);
  const Axes& grid = opts.quick && !spec.quick_grid.empty() ? spec.quick_grid : spec.grid;
  if (!grid.empty()) md += "\nGrid (every combination, for every variant): " + axes_text(grid) + ".\n";
  const bool any_tuned = std::any_of(spec.variants.begin(), spec.variants.end(),
                                     [&](const SweepVariant& v) { return grid_points(spec.tune_of(v, opts.quick)).size() > 1; });
  const bool one_seed = spec.seeds(opts.quick).size() < 2;
  if (spec.tuned && !any_tuned)
    md += fmt::format("\nNo tuning {}: each variant runs the one point declared for it on seeds {{{}}}. Verdicts need "
                      "{}; {}.\n",
                      opts.quick ? "in this mode" : "(each point is declared in the study file before any run)",
                      seeds_text(spec.seeds(opts.quick)), gate_text(spec),
                      one_seed ? "with one seed there is no spread to exceed"
                               : kPairedRule);
  else if (spec.tuned)
    md += fmt::format("\nTuning, fixed in the study file before any run: each variant's grid runs on the tuning seed {}; the "
                      "point with the lowest final validation loss reruns on seeds {{{}}}. Verdicts: {}; they also need {}.\n",
                      spec.tuning.seed, seeds_text(spec.seeds(opts.quick)), kPairedRule, gate_text(spec));
  md += fmt::format("\nTraining time of these {} runs: {:.1f} min (their own wall clock, summed; a resumed run counts "
                    "each part).\n",
                    started, wall_s / 60);
  if (!spec.notes.empty()) md += "\n" + spec.notes + (spec.notes.back() == '\n' ? "" : "\n");
  return md;
}

}  // namespace

std::string version_text(const SweepSpec& spec) {
  return spec.version > 1 ? fmt::format(" from version {} of the study file (its opening comment says what changed)", spec.version)
                          : "";
}

namespace {

// The virtual-time budget line: each variant's virtual time against the budget.
std::string budget_md(const SweepSpec& spec, Group& grp, double budget) {
  std::string md;
  if (budget > 0) {
    std::string each;
    for (const auto& v : spec.variants) {
      const std::string why = over_budget(spec, v.name, grp.out.finals[v.name], budget);
      std::vector<double> vt;
      for (const auto& l : grp.finals[v.name]) vt.push_back(l.summary.virtual_s);
      each += fmt::format("{}{} {} s{}", each.empty() ? "" : ", ", v.name, fmt_stats(stats_of(vt), "{:.1f}"),
                          why.empty() ? "" : " (outside it)");
    }
    md += fmt::format("Virtual-time budget: {:.1f} s, {}'s; each variant's train.steps is set in the study file so that its "
                      "runs end at most {:.0f}% below it (sweep.equal_time): {}.\n\n",
                      budget, spec.target_from, 100 * spec.equal_time, each);
  }
  return md;
}

// One row per variant: its chosen point's runs summarized over seeds.
std::string results_table(const SweepSpec& spec, Group& grp, double unigram, double target) {
  // Elastic runs: how many workers died and rejoined, only where some did.
  bool churn = false, own = false, resent = false;
  for (const auto& [name, rs] : grp.finals)
    for (const auto& x : rs) {
      churn = churn || x.summary.deaths > 0 || x.summary.rejoins > 0;
      own = own || x.summary.own_models;
      resent = resent || x.summary.resends >= 0;  // the modulo codec's fp32 resends, where some run logs them
    }
  std::string md;
  md += "| variant | point | runs | finished | " + val_loss_header(own) +
        " | below unigram | consensus distance | steps to target "
        "| virtual s to target | virtual time (s) | MB sent per worker | idle | compute utilization |";
  md += std::string(resent ? " resends |" : "") + (churn ? " deaths | rejoins |\n" : "\n");
  md += "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |";
  md += std::string(resent ? " --- |" : "") + (churn ? " --- | --- |\n" : "\n");
  for (const auto& v : spec.variants) {
    if (!spec.runs_in(v.name, grp.point)) continue;
    const auto& rs = grp.finals[v.name];
    std::vector<double> l, below, cd, vt, mb, idle, util, st, tt, deaths, rejoins, resends;
    int finished = 0;
    bool variant_own = false;
    for (const auto& x : rs) {
      const RunSummary& r = x.summary;
      finished += r.finished();
      variant_own = variant_own || r.own_models;
      if (r.has_val_loss) {
        l.push_back(r.val_loss);
        cd.push_back(r.consensus);
        if (unigram >= 0) below.push_back(unigram - r.val_loss);
      }
      vt.push_back(r.virtual_s);
      mb.push_back(r.mb_per_worker);
      idle.push_back(100 * r.idle_fraction);
      if (r.utilization >= 0) util.push_back(100 * r.utilization);
      deaths.push_back(static_cast<double>(r.deaths));
      rejoins.push_back(static_cast<double>(r.rejoins));
      if (r.resends >= 0) resends.push_back(static_cast<double>(r.resends));
      if (auto hit = target > 0 ? reach_target(r.curve, target) : std::nullopt) {
        st.push_back(hit->first);
        tt.push_back(hit->second);
      }
    }
    // Over the runs that reached the target; "(k of n)" when some did not.
    const std::string partial = !st.empty() && st.size() < rs.size() ? fmt::format(" ({} of {})", st.size(), rs.size()) : "";
    const std::string point = rs.empty() || rs.front().run->tune.empty() ? "-" : point_name(rs.front().run->tune);
    const std::string utilization = util.empty() ? "-" : fmt_stats(stats_of(util), "{:.1f}") + "%";
    md += fmt::format("| {} | {} | {} | {} | {}{} | {} | {} | {}{} | {}{} | {} | {} | {}% | {} |", v.name, point, rs.size(),
                      finished, fmt_stats(stats_of(l), "{:.4f}"), variant_own ? " own" : "", fmt_stats(stats_of(below), "{:.2f}"), fmt_stats(stats_of(cd), "{:.3g}"),
                      fmt_stats(stats_of(st), "{:.0f}"), partial, fmt_stats(stats_of(tt), "{:.1f}"), partial,
                      fmt_stats(stats_of(vt), "{:.1f}"), fmt_stats(stats_of(mb), "{:.1f}"), fmt_stats(stats_of(idle), "{:.1f}"),
                      utilization);
    if (resent) md += fmt::format(" {} |", resends.empty() ? "-" : fmt_stats(stats_of(resends), "{:.0f}"));
    md += churn ? fmt::format(" {} | {} |\n", fmt_stats(stats_of(deaths), "{:.0f}"), fmt_stats(stats_of(rejoins), "{:.0f}")) : "\n";
  }
  return md;
}

// The tuning grids, the chosen point in bold.
std::string tuning_table(const SweepSpec& spec, Group& grp) {
  std::string md;
  if (!grp.tuning.empty()) {
    md += fmt::format("\nTuning on seed {} (final validation loss of each point; **chosen**):\n\n", spec.tuning.seed);
    md += "| variant | point | val_loss |\n| --- | --- | --- |\n";
    for (const auto& v : spec.variants) {
      const auto& ts = grp.tuning[v.name];
      const auto& fs_ = grp.finals[v.name];
      const std::string chosen = fs_.empty() ? "" : point_name(fs_.front().run->tune);
      for (const auto& t : ts) {
        const std::string p = point_name(t.run->tune);
        const std::string loss = t.summary.finished() ? fmt::format("{:.4f}", t.summary.val_loss) : "unfinished";
        md += p == chosen ? fmt::format("| {} | **{}** | **{}** |\n", v.name, p, loss) : fmt::format("| {} | {} | {} |\n", v.name, p, loss);
      }
    }
  }
  return md;
}

// Plots: each variant's first final run (lowest seed) of this group.
std::string plots_md(const SweepSpec& spec, Group& grp, const std::string& g, const std::string& id, const SweepOptions& opts,
                     double unigram) {
  std::string md;
  for (const auto& x : spec.plot_x) {
    std::vector<RunSummary> rs;
    std::vector<std::string> titles;
    for (const auto& v : spec.variants)
      if (!grp.finals[v.name].empty() && !grp.finals[v.name].front().summary.curve.empty()) {
        rs.push_back(grp.finals[v.name].front().summary);
        titles.push_back(v.name);
      }
    if (rs.empty()) continue;
    std::string file = id + (g.empty() ? "" : "-" + g) + "-" + x + ".png";
    std::replace(file.begin(), file.end(), ',', '_');
    std::replace(file.begin(), file.end(), '=', '-');
    const fs::path dir = plot_dir(opts);
    fs::create_directories(dir);
    PlotStyle style;
    style.title = spec.title + (g.empty() ? "" : " [" + g + "]") + (opts.quick ? " (quick mode)" : "");
    style.baseline = unigram;
    plot_runs(rs, titles, dir / file, x, style);
    const std::string rel = plot_link(opts, dir / file);
    md += x == "consensus" ? fmt::format("\n![consensus distance versus step]({})\n", rel)
                           : fmt::format("\n![validation loss versus {}]({})\n", x, rel);
  }
  return md;
}

// What each variant holds between steps, from the tensors (its first final run's memory line).
std::string memory_md(const SweepSpec& spec, Group& grp) {
  std::string rows;
  for (const auto& v : spec.variants) {
    const auto& rs = grp.finals[v.name];
    if (rs.empty() || rs.front().summary.params <= 0) continue;
    const RunSummary& r = rs.front().summary;
    rows += fmt::format("| {} | {} | {} | {} | {:.1f} | {:.1f} | {:.1f} |\n", v.name, r.optim, r.algo, r.params,
                        r.optimizer_state_per_param, r.sync_state_per_param, r.state_per_param);
  }
  if (rows.empty()) return "";
  return "\nState held between steps, measured from the optimizer's and the algorithm's tensors (the `memory` line of "
         "each run's metrics.jsonl), in bytes per parameter:\n\n| variant | optimizer | algorithm | parameters | optimizer "
         "state (B/param) | algorithm state (B/param) | total (B/param) |\n| --- | --- | --- | --- | --- | --- | --- |\n" +
         rows;
}

// Paper scale: the same rounds with messages priced as the papers' models.
std::string projection_md(const SweepSpec& spec, Group& grp) {
  std::string md;
  for (const auto& model : spec.project) {
    std::string rows;
    for (const auto& v : spec.variants) {
      const auto& rs = grp.finals[v.name];
      if (rs.empty()) continue;
      const Projection p = project_run(rs.front().run->dir, model);
      rows += fmt::format("| {} | {} | {:.0f} | {:.1f} | {:.1f} | {:.0f} | {:.0f} |\n", v.name, p.rounds, p.mb_per_round,
                          p.seconds_per_round, p.slowest_per_round, p.seconds_per_round * static_cast<double>(p.rounds),
                          p.compute_s);
    }
    if (rows.empty()) continue;
    md += fmt::format("\nAt paper scale ({}): these runs' rounds, topology and links, with every parameter message priced as "
                      "that model on the virtual clock's cost model:\n\n",
                      model);
    md += "| variant | rounds | MB sent per worker per round | comm s per round (mean worker) | comm s per round (slowest) "
          "| comm s in the run | compute s in the run (steps x network.step_time_s) |\n";
    md += "| --- | --- | --- | --- | --- | --- | --- |\n" + rows;
  }
  return md;
}

}  // namespace

SweepReport sweep_report(const SweepSpec& spec, const std::vector<SweepRun>& runs, const SweepOptions& opts) {
  const std::string id = spec.name + (opts.quick ? "-quick" : "");
  Groups groups = collect_groups(runs);
  std::string md = header_md(spec, opts, id, groups.started, groups.wall_s);
  std::vector<std::string> claim_lines;
  std::vector<GroupOutcomes> table;
  for (const auto& g : groups.order) {
    auto& grp = groups.by_name[g];
    add_outcomes(spec, grp, sweep_dir(spec, opts.quick, opts.runs_root));
    md += fmt::format("\n### {}\n\n", g.empty() ? spec.title : g);
    const double unigram = shared_unigram(grp.out);
    if (unigram >= 0)
      md += fmt::format("Unigram baseline of the data: {:.4f} (the validation loss of token frequencies alone).\n\n", unigram);
    const double target = group_target(spec, grp.out);
    if (target > 0)
      md += fmt::format("Target validation loss: {:.4f}{}.\n\n", target,
                        spec.target_from.empty() ? ""
                                                 : " (the highest final loss of " + spec.target_from +
                                                       "'s runs, which each of them reaches)");
    md += budget_md(spec, grp, time_budget(spec, grp.out));
    md += results_table(spec, grp, unigram, target);
    if (spec.memory) md += memory_md(spec, grp);
    md += tuning_table(spec, grp);
    md += plots_md(spec, grp, g, id, opts, unigram);
    md += projection_md(spec, grp);
    for (auto& line : judge_claims(spec, grp.out, g)) claim_lines.push_back(std::move(line));
    table.push_back(std::move(grp.out));
  }
  md += claims_md(claim_lines) + fmt::format("<!-- {}:end -->", id);
  return {md, runs_table_csv(spec, table)};
}

std::string sweep_section(const SweepSpec& spec, const std::vector<SweepRun>& runs, const SweepOptions& opts) {
  return sweep_report(spec, runs, opts).section;
}

std::string section_begin(const std::string& id, const std::string& command, int64_t version) {
  return fmt::format("<!-- {}:begin (generated by `{}`{}; edits here are overwritten) -->", id, command,
                     version > 1 ? fmt::format("; version {}", version) : "");
}

int64_t section_version(const std::string& section) {
  const std::string opening = section.substr(0, section.find('\n'));
  const std::string key = "; version ";
  const auto at = opening.rfind(key);
  if (at == std::string::npos) return 1;
  try {
    return std::stoll(opening.substr(at + key.size()));
  } catch (const std::exception&) {
    return 1;
  }
}

std::string find_doc_section(const std::string& text, const std::string& id) {
  const std::string begin = "<!-- " + id + ":begin", end = "<!-- " + id + ":end -->";
  for (auto b = text.find(begin); b != std::string::npos; b = text.find(begin, b + 1)) {
    if (b != 0 && text[b - 1] != '\n') continue;  // a marker opens its line
    const auto e = text.find(end, b);
    return e == std::string::npos ? "" : text.substr(b, e + end.size() - b);
  }
  return "";
}

namespace {

// What stays of a superseded version of a section: its heading, the line saying what made it
// (command, date, settings) and its verdict lines, as the block NAME@vOLD.
std::string superseded_block(const std::string& name, const std::string& old, int64_t new_version) {
  const int64_t v = section_version(old);
  std::string title, generated, claims;
  bool in_claims = false;
  for (size_t at = 0; at < old.size();) {
    const auto nl = old.find('\n', at);
    const std::string line = old.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    at = nl == std::string::npos ? old.size() : nl + 1;
    if (title.empty() && line.rfind("## ", 0) == 0) title = line.substr(3);
    else if (generated.empty() && line.rfind("Generated by ", 0) == 0) generated = line;
    else if (line == "Claims:") in_claims = true;
    else if (in_claims && line.rfind("- ", 0) == 0) claims += line + "\n";
  }
  return fmt::format("<!-- {}@v{}:begin (version {} of this study, superseded by version {}; kept by gasloc sweep, never "
                     "rewritten) -->\n### {}: version {} (superseded by version {})\n\nVersion {}'s verdicts as generated; its "
                     "tables and plots are in the git history of this file.\n\n{}\n\n{}<!-- {}@v{}:end -->",
                     name, v, v, new_version, title, v, new_version, v, generated.empty() ? "(no generation line)" : generated,
                     claims.empty() ? "(no claims)\n" : claims, name, v);
}

}  // namespace

void write_doc_section(const fs::path& doc, const std::string& name, const std::string& section) {
  std::string text = fs::exists(doc) ? read_file(doc)
                                     : std::string("# Results\n\nEvery section below is generated by the script or sweep it "
                                                   "names, from runs on this project's embedded data; rerun it to regenerate it.\n");
  const std::string old = find_doc_section(text, name);
  if (old.empty()) {
    text += (text.empty() || text.back() == '\n' ? "\n" : "\n\n") + section + "\n";
    write_file_atomic(doc, text);
    return;
  }
  std::string replacement = section;
  const int64_t was = section_version(old), now = section_version(section);
  if (was != now) {
    // The superseded version's verdicts go right after the new section; an older copy of them goes.
    const std::string block_id = fmt::format("{}@v{}", name, was);
    const std::string kept = find_doc_section(text, block_id);
    replacement += "\n\n" + superseded_block(name, old, now);
    if (!kept.empty()) {
      const auto k = text.find(kept);
      const auto tail = text.find_first_not_of('\n', k + kept.size());
      text.erase(k, (tail == std::string::npos ? text.size() : tail) - k);
    }
  }
  text.replace(text.find(old), old.size(), replacement);
  write_file_atomic(doc, text);
}

}  // namespace gasloc::study
