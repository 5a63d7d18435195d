// gasloc report: a table of runs (average-model validation loss, consensus distance, bytes sent
// per worker, virtual time, idle fraction, fewest local steps of any worker, state kept per
// parameter, and optionally the step and virtual time at which each first reaches a target loss)
// and a validation-loss plot through gnuplot. Reading runs is train/run_summary.hpp.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "commands.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/run_summary.hpp"

namespace gasloc::app {
namespace fs = std::filesystem;

Action add_report(CLI::App& app) {
  struct Opts {
    std::vector<std::string> runs;
    std::string plot, target_from, plot_x = "step";
    double target = NAN;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--run,runs", o->runs, "run directories to compare")->required();
  app.add_option("--plot", o->plot, "write a PNG of validation loss (needs gnuplot)");
  app.add_option("--plot-x", o->plot_x, "x axis of the plot: step, time (virtual seconds), bytes (MB sent by worker 0), "
                 "or consensus (consensus distance against step)")
      ->check(CLI::IsMember({"step", "time", "bytes", "consensus"}));
  auto* t = app.add_option("--target", o->target, "add the step and virtual time at which each run first reaches this validation loss");
  app.add_option("--target-from", o->target_from, "like --target, with the final validation loss of this run directory")
      ->excludes(t);
  return [o]() {
    std::vector<train::RunSummary> reports;
    for (const auto& d : o->runs) reports.push_back(train::read_run_summary(d));
    double target = o->target;
    if (!o->target_from.empty()) {
      const auto ref = train::read_run_summary(o->target_from);
      if (!ref.has_val_loss)
        throw DataError("'" + o->target_from + "' has no evaluation to take a target loss from", "is the run finished?");
      target = ref.val_loss;
    }
    const bool with_target = std::isfinite(target);
    if (with_target) fmt::print("target validation loss: {:.4f}\n", target);
    fmt::print("| run | algorithm | optimizer | workers | steps | fewest local steps | val_loss (average model) | consensus distance | MB sent per worker | virtual time (s) | idle | state B/param |{}\n",
               with_target ? " steps to target | virtual s to target |" : "");
    fmt::print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |{}\n", with_target ? " --- | --- |" : "");
    for (const auto& r : reports) {
      std::string cols;
      if (with_target) {
        const auto hit = train::reach_target(r.curve, target);
        cols = hit ? fmt::format(" {:.0f} | {:.1f} |", hit->first, hit->second) : std::string(" - | - |");
      }
      const std::string state = r.state_per_param >= 0 ? fmt::format("{:.1f}", r.state_per_param) : "-";
      const std::string loss = r.has_val_loss ? fmt::format("{:.4f}", r.val_loss) : "-";
      fmt::print("| {} | {} | {} | {} | {} | {} | {} | {:.3e} | {:.1f} | {:.1f} | {:.1f}% | {} |{}\n",
                 fs::path(r.dir).filename().string(), r.label, r.optim, r.workers, r.last_step, r.min_local_steps, loss,
                 r.consensus, r.mb_per_worker, r.virtual_s, 100 * r.idle_fraction, state, cols);
    }
    if (o->plot.empty()) return 0;
    std::vector<std::string> titles;
    for (const auto& r : reports) titles.push_back(fs::path(r.dir).filename().string());
    train::plot_runs(reports, titles, o->plot, o->plot_x);
    fmt::print("plot: {}\n", fs::absolute(o->plot).string());
    return 0;
  };
}

}  // namespace gasloc::app
