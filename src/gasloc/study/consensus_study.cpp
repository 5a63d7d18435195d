#include "gasloc/study/consensus_study.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "gasloc/study/plot.hpp"
#include "gasloc/study/section.hpp"
#include "gasloc/topology/spectral.hpp"
#include "gasloc/topology/topology.hpp"
#include "gasloc/train/job_config.hpp"

namespace gasloc::study {
namespace fs = std::filesystem;

ConsensusResult simulate_run(const SweepSpec& spec, const SweepRun& run) {
  const train::JobConfig job = train::load_job(spec.job, run.overrides);
  ConsensusResult r;
  r.workers = static_cast<int>(job.cluster.workers);
  r.topology = job.algo.topology.str();
  const auto seed = static_cast<uint64_t>(job.train.seed);
  const topology::Topology t(topology::parse_kind(r.topology), r.workers, seed);
  const algo::Form form = algo::parse_form(job.algo.form);
  const algo::OuterStep step{job.algo.outer_lr, job.algo.outer_momentum, form, job.algo.gossip_step};
  r.plain = form != algo::Form::accelerated && step.lr == 1.0 && step.momentum == 0.0;
  r.step = r.plain                           ? "plain averaging"
           : form == algo::Form::accelerated ? fmt::format("accelerated, alpha {}, gamma {}", step.gossip_step, step.momentum)
                                             : fmt::format("{}, lr {}, momentum {}", algo::to_string(form), step.lr, step.momentum);
  r.gap = topology::spectral_gap_closed_form(t);
  r.distance = algo::simulate_consensus(t, spec.rounds, spec.dim, seed, step);
  r.rate = algo::consensus_contraction(t, spec.rate_rounds, spec.dim, seed, step);
  return r;
}

Judgement judge_gap_rate(const ConsensusResult& a, double tolerance, int64_t rate_rounds) {
  const double predicted = 1.0 - a.gap;
  const double rel = predicted > 0 ? (a.rate.mean - predicted) / predicted : 0.0;
  Judgement j;
  j.verdict = std::abs(rel) <= tolerance ? "reproduced" : "not reproduced";
  j.numbers = fmt::format("mean per-round ratio {:.4f} over {} rounds against 1 - gap {:.4f} (closed form): {:+.1f}%, "
                          "tolerance {:.1f}%; one simulation, no seeds to spread over",
                          a.rate.mean, rate_rounds, predicted, 100 * rel, 100 * tolerance);
  return j;
}

Judgement judge_contraction_lower(const ConsensusResult& a, const ConsensusResult& b, int64_t rate_rounds) {
  Judgement j;
  j.verdict = a.rate.geometric < b.rate.geometric ? "reproduced" : "not reproduced";
  j.numbers = fmt::format("per-round contraction (geometric mean over {} rounds): a {:.4f}, b {:.4f}; one simulation, no "
                          "seeds to spread over",
                          rate_rounds, a.rate.geometric, b.rate.geometric);
  return j;
}

namespace {

struct Simulated {
  std::string variant;
  ConsensusResult result;
};

// The rounds the table shows: 1, 2, 5, 10 and the last, those within the simulation.
std::vector<int64_t> shown_rounds(int64_t rounds) {
  std::vector<int64_t> out;
  for (int64_t r : {1, 2, 5, 10})
    if (r < rounds) out.push_back(r);
  out.push_back(rounds);
  return out;
}

std::string table_md(const SweepSpec& spec, const std::vector<Simulated>& sims) {
  const auto shown = shown_rounds(spec.rounds);
  std::string md = "| variant | topology | workers | step | gap (closed form) |";
  for (auto r : shown) md += fmt::format(" round {} |", r);
  md += fmt::format(" mean ratio per round ({} rounds) | contraction per round (geometric mean) |\n|", spec.rate_rounds);
  for (size_t i = 0; i < 7 + shown.size(); ++i) md += " --- |";
  md += "\n";
  for (const auto& s : sims) {
    const auto& r = s.result;
    md += fmt::format("| {} | {} | {} | {} | {:.4f} |", s.variant, r.topology, r.workers, r.step, r.gap);
    for (auto t : shown) {
      const double predicted = std::pow(1.0 - r.gap, static_cast<double>(t));
      md += predicted > 0 ? fmt::format(" {:.4e} ({:.3f}) |", r.distance[t], r.distance[t] / predicted)
                          : fmt::format(" {:.4e} |", r.distance[t]);
    }
    md += fmt::format(" {:.4f} | {:.4f} |\n", r.rate.mean, r.rate.geometric);
  }
  return md;
}

// Every round of every variant, and (1 - gap)^t dashed beside each plain one.
std::string plot_md(const SweepSpec& spec, const std::vector<Simulated>& sims, const std::string& file, const SweepOptions& opts) {
  std::vector<RunSummary> curves;
  std::vector<std::string> titles;
  PlotStyle style;
  for (const auto& s : sims) {
    for (bool predicted : {false, true}) {
      if (predicted && !s.result.plain) continue;
      RunSummary c;
      for (size_t t = 0; t < s.result.distance.size(); ++t) {
        const double v = predicted ? std::pow(1.0 - s.result.gap, static_cast<double>(t)) : s.result.distance[t];
        c.curve.push_back({static_cast<int64_t>(t), 0, 0, 0, v});
      }
      curves.push_back(std::move(c));
      titles.push_back(predicted ? s.variant + ": (1-gap)^t" : s.variant);
      style.dashed.push_back(predicted);
    }
  }
  style.title = spec.title + (opts.quick ? " (quick mode)" : "");
  style.xlabel = "gossip round";
  style.ylabel = "consensus distance / initial";
  style.key = "bottom left";  // the curves fall from the top left
  const fs::path dir = plot_dir(opts);
  fs::create_directories(dir);
  plot_runs(curves, titles, dir / file, "consensus", style);
  return fmt::format("\n![consensus distance per round]({})\n", plot_link(opts, dir / file));
}

std::vector<std::string> claims_md(const SweepSpec& spec, const std::map<std::string, ConsensusResult>& by, const std::string& g) {
  std::vector<std::string> lines;
  for (const auto& c : spec.claims) {
    const Judgement j = c.kind == "gap_rate" ? judge_gap_rate(by.at(c.a), c.tolerance, spec.rate_rounds)
                                             : judge_contraction_lower(by.at(c.a), by.at(c.b), spec.rate_rounds);
    lines.push_back(fmt::format("- {}{}: **{}** (a = {}{}; {})", c.text, g.empty() ? "" : " [" + g + "]", j.verdict, c.a,
                                c.b.empty() ? "" : ", b = " + c.b, j.numbers));
  }
  return lines;
}

std::string header_md(const SweepSpec& spec, const SweepOptions& opts, const std::string& id) {
  std::string md = fmt::format("{}\n## {}{}\n\n", section_begin(id, opts.command, spec.version), spec.title,
                               opts.quick ? " (quick mode)" : "");
  md += fmt::format("Generated by `{}` on {} UTC{}. No training: each variant's workers start from independent standard "
                    "normal vectors of {} entries and gossip them on its graph with its GASLoC form (algo/consensus.hpp). "
                    "Base job `{}`; settings of every variant: {}",
                    opts.command, fmt::format("{:%Y-%m-%d}", fmt::gmtime(std::time(nullptr))), version_text(spec), spec.dim, spec.job,
                    settings_list(spec.settings));
  if (opts.quick) md += fmt::format("; quick mode adds {}", settings_list(spec.quick));
  md += ".\n\n| variant | settings |\n| --- | --- |\n";
  for (const auto& v : spec.variants) md += fmt::format("| {} | {} |\n", v.name, settings_list(v.settings));
  md += fmt::format("\nThe table gives the consensus distance mean_i ||x_i - xbar||^2 divided by its initial value after "
                    "a few of {} rounds, in brackets its ratio to (1 - gap)^t of plain averaging (the gap from the closed "
                    "form, docs/topology.md), then the per-round ratio d_t+1 / d_t over {} rounds: its mean (what 1 - gap "
                    "predicts for plain gossip on random graphs) and its geometric mean (the long-run contraction).\n",
                    spec.rounds, spec.rate_rounds);
  if (!spec.notes.empty()) md += "\n" + spec.notes + (spec.notes.back() == '\n' ? "" : "\n");
  return md;
}

}  // namespace

std::string consensus_section(const SweepSpec& spec, const std::vector<SweepRun>& runs, const SweepOptions& opts) {
  const std::string id = spec.name + (opts.quick ? "-quick" : "");
  std::string md = header_md(spec, opts, id);
  std::vector<std::string> order;
  std::map<std::string, std::vector<Simulated>> groups;
  for (const auto& r : runs) {
    const std::string g = point_name(r.point);
    if (!groups.count(g)) order.push_back(g);
    groups[g].push_back({r.variant, simulate_run(spec, r)});
  }
  std::vector<std::string> claim_lines;
  for (const auto& g : order) {
    const auto& sims = groups[g];
    if (!g.empty()) md += fmt::format("\n### {}\n", g);
    md += "\n" + table_md(spec, sims);
    std::string file = id + (g.empty() ? "" : "-" + g) + "-consensus.png";
    std::replace(file.begin(), file.end(), ',', '_');
    std::replace(file.begin(), file.end(), '=', '-');
    md += plot_md(spec, sims, file, opts);
    std::map<std::string, ConsensusResult> by;
    for (const auto& s : sims) by[s.variant] = s.result;
    for (auto& l : claims_md(spec, by, g)) claim_lines.push_back(std::move(l));
  }
  if (!claim_lines.empty()) {
    md += "\nClaims:\n\n";
    for (const auto& l : claim_lines) md += l + "\n";
  }
  return md + fmt::format("<!-- {}:end -->", id);
}

}  // namespace gasloc::study
