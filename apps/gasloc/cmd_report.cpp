// gasloc report: a table of runs (average-model validation loss beside the data's unigram
// baseline, consensus distance, bytes sent per worker, virtual time, idle fraction, fewest local
// steps of any worker, state kept per parameter, and optionally the step and virtual time at
// which each first reaches a target loss; the messages clipped per sender under algo.clip_peers), a validation-loss plot through gnuplot, and every
// metric line as one CSV, and (--html) the dashboard page with the runs inside, as one file. Reading
// runs is study/run_summary.hpp; the page is study/dashboard.hpp.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include <cmath>
#include <filesystem>

#include "commands.hpp"
#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/study/dashboard.hpp"
#include "gasloc/study/plot.hpp"
#include "gasloc/study/run_summary.hpp"
#include "gasloc/study/runs_csv.hpp"

namespace gasloc::app {
namespace fs = std::filesystem;

namespace {

struct ReportOptions {
  std::vector<std::string> runs;
  std::string plot, target_from, plot_x = "step", csv, title, html;
  double target = NAN;
};

void add_report_options(CLI::App& app, ReportOptions& o) {
  app.add_option("--run,runs", o.runs, "run directories to compare")->required();
  app.add_option("--plot", o.plot, "write a PNG of validation loss (needs gnuplot)");
  app.add_option("--plot-x", o.plot_x, "x axis of the plot: step, time (virtual seconds), bytes (MB sent by worker 0), "
                 "or consensus (consensus distance against step)")
      ->check(CLI::IsMember({"step", "time", "bytes", "consensus"}));
  app.add_option("--title", o.title, "title of the plot (default: what it shows)");
  app.add_option("--csv", o.csv,
                 "write every run's train and eval lines to this CSV file (run, event, worker, step, metrics); '-': print "
                 "only the CSV, on stdout (how scripts read metrics)");
  app.add_option("--html", o.html,
                 "write the dashboard page of these runs (the charts of `gasloc dashboard`) as one self-contained HTML "
                 "file: data and chart code inside, opens from disk");
  auto* t = app.add_option("--target", o.target, "add the step and virtual time at which each run first reaches this validation loss");
  app.add_option("--target-from", o.target_from, "like --target, with the final validation loss of this run directory")
      ->excludes(t);
}

// --target, or --target-from's final validation loss; NaN for neither.
double target_loss(const ReportOptions& o) {
  double target = o.target;
  if (!o.target_from.empty()) {
    const auto ref = study::read_run_summary(o.target_from);
    if (!ref.has_val_loss)
      throw DataError("'" + o.target_from + "' has no evaluation to take a target loss from", "is the run finished?");
    target = ref.val_loss;
  }
  return target;
}

// Some runs evaluated each worker's own model instead of the average (RunSummary::own_models).
bool any_own_models(const std::vector<study::RunSummary>& reports) {
  return std::any_of(reports.begin(), reports.end(), [](const auto& r) { return r.own_models; });
}

// "2: 7, 3: 1" (senders with clipped messages), "0" for a run that clips nothing, "-" for one that
// does not clip; then the non-finite messages dropped, "(dropped 2: 1)", when there were any.
std::string clipped_cell(const study::RunSummary& r) {
  if (r.clipped_from.empty()) return "-";
  auto by_sender = [](const std::vector<int64_t>& counts) {
    std::string out;
    for (size_t j = 0; j < counts.size(); ++j)
      if (counts[j] > 0) out += fmt::format("{}{}: {}", out.empty() ? "" : ", ", j, counts[j]);
    return out;
  };
  const std::string clipped = by_sender(r.clipped_from), dropped = by_sender(r.dropped_from);
  return (clipped.empty() ? "0" : clipped) + (dropped.empty() ? "" : " (dropped " + dropped + ")");
}

void print_table(const std::vector<study::RunSummary>& reports, const std::vector<std::string>& names, double target) {
  const bool with_target = std::isfinite(target);
  // Elastic runs: deaths, restarts (new incarnations) and heals (state transfers to a joiner; a
  // joiner listed by a view pinned ahead of its heal is healed again), only where some happened.
  const bool churn = std::any_of(reports.begin(), reports.end(), [](const auto& r) { return r.deaths > 0 || r.rejoins > 0; });
  const bool own = any_own_models(reports);
  // algo.clip_peers: the messages clipped, by sender, only where some run clips.
  const bool clips = std::any_of(reports.begin(), reports.end(), [](const auto& r) { return !r.clipped_from.empty(); });
  if (with_target) fmt::print("target validation loss: {:.4f}\n", target);
  fmt::print("| run | algorithm | optimizer | workers | steps | fewest local steps | {} | unigram baseline | consensus distance | MB sent per worker | bits/param/round | virtual time (s) | idle | compute utilization | state B/param |{}\n",
             study::val_loss_header(own),
             std::string(with_target ? " steps to target | virtual s to target |" : "") + (churn ? " deaths | restarts | heals |" : "") +
                 (clips ? " clipped messages (sender: count) |" : ""));
  fmt::print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |{}\n",
             std::string(with_target ? " --- | --- |" : "") + (churn ? " --- | --- | --- |" : "") + (clips ? " --- |" : ""));
  for (size_t i = 0; i < reports.size(); ++i) {
    const auto& r = reports[i];
    std::string cols;
    if (with_target) {
      const auto hit = study::reach_target(r.curve, target);
      cols = hit ? fmt::format(" {:.0f} | {:.1f} |", hit->first, hit->second) : std::string(" - | - |");
    }
    if (churn) cols += fmt::format(" {} | {} | {} |", r.deaths, r.restarts, r.rejoins);
    if (clips) cols += " " + clipped_cell(r) + " |";
    const std::string state = r.state_per_param >= 0 ? fmt::format("{:.1f}", r.state_per_param) : "-";
    const std::string loss = r.has_val_loss ? fmt::format("{:.4f}{}", r.val_loss, r.own_models ? " own" : "") : "-";
    const std::string unigram = r.unigram >= 0 ? fmt::format("{:.4f}", r.unigram) : "-";
    const std::string util = r.utilization >= 0 ? fmt::format("{:.1f}%", 100 * r.utilization) : "-";
    const std::string bits = r.bits_per_param_round >= 0 ? fmt::format("{:.2f}", r.bits_per_param_round) : "-";
    fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} | {:.3e} | {:.1f} | {} | {:.1f} | {:.1f}% | {} | {} |{}\n", names[i],
               r.label, r.optim, r.workers, r.last_step, r.min_local_steps, loss, unigram, r.consensus,
               r.mb_per_worker, bits, r.virtual_s, 100 * r.idle_fraction, util, state, cols);
  }
}

study::PlotStyle plot_style(const ReportOptions& o, const std::vector<study::RunSummary>& reports) {
  study::PlotStyle style;
  style.title = o.title;
  if (style.title.empty()) {
    const bool own = any_own_models(reports);
  // algo.clip_peers: the messages clipped, by sender, only where some run clips.
  const bool clips = std::any_of(reports.begin(), reports.end(), [](const auto& r) { return !r.clipped_from.empty(); });
    const std::string what = o.plot_x == "consensus" ? "Consensus distance"
                             : own                   ? "Validation loss (average model, or the mean of own models)"
                                                     : "Validation loss (average model)";
    const std::string against = o.plot_x == "time" ? "virtual time" : o.plot_x == "bytes" ? "data sent" : "step";
    style.title = fmt::format("{} against {}, {} run{}", what, against, reports.size(), reports.size() == 1 ? "" : "s");
  }
  // One baseline line when the runs share it (they trained on the same data).
  bool shared = true;
  for (const auto& r : reports) {
    if (r.unigram < 0) continue;
    if (style.baseline < 0) style.baseline = r.unigram;
    shared = shared && std::abs(style.baseline - r.unigram) < 1e-9;
  }
  if (!shared) style.baseline = -1;  // different data: no one line is right for all
  return style;
}

// The dashboard's page with the runs' data inside (study/dashboard.hpp).
void write_html(const std::vector<std::string>& dirs, const std::vector<std::string>& names, const std::string& file) {
  std::vector<study::RunWatch> runs;
  for (size_t i = 0; i < dirs.size(); ++i) runs.emplace_back(dirs[i], names[i]);
  study::DashboardPage page;
  page.title = "gasloc report: " + fmt::format("{}", fmt::join(names, ", "));
  page.embedded = study::dashboard_json(runs);
  write_file_atomic(file, study::dashboard_html(page));
  fmt::print("html: {}\n", fs::absolute(file).string());
}

int run_report(const ReportOptions& o) {
  if (o.csv == "-") {  // the CSV alone, for a pipe
    if (!o.plot.empty() || !o.html.empty())
      throw Error("report --csv - prints only the CSV", "run --plot or --html as a separate command");
    fmt::print("{}", study::runs_csv(o.runs, study::run_labels(o.runs)));
    return 0;
  }
  if (!o.html.empty()) study::require_dashboard_assets();  // before any work
  std::vector<study::RunSummary> reports;
  for (const auto& d : o.runs) reports.push_back(study::read_run_summary(d));
  const std::vector<std::string> names = study::run_labels(o.runs);
  print_table(reports, names, target_loss(o));
  if (!o.csv.empty()) {
    write_file_atomic(o.csv, study::runs_csv(o.runs, names));
    fmt::print("csv: {}\n", fs::absolute(o.csv).string());
  }
  if (!o.html.empty()) write_html(o.runs, names, o.html);
  if (o.plot.empty()) return 0;
  study::plot_runs(reports, names, o.plot, o.plot_x, plot_style(o, reports));
  fmt::print("plot: {}\n", fs::absolute(o.plot).string());
  return 0;
}

}  // namespace

Action add_report(CLI::App& app) {
  auto o = std::make_shared<ReportOptions>();
  add_report_options(app, *o);
  return [o]() { return run_report(*o); };
}

}  // namespace gasloc::app
