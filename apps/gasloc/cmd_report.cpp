// gasloc report: a table of finished runs (average-model validation loss, consensus distance,
// bytes sent per worker, virtual time, idle fraction, fewest local steps of any worker, state
// kept per parameter, and optionally the step and
// virtual time at which each first reaches a target loss) and a validation-loss-versus-step
// plot through gnuplot.
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <map>
#include <optional>

#include "commands.hpp"
#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::app {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
struct EvalPoint {
  int64_t step = 0;
  double val_loss = NAN, virtual_s = 0, mb_sent = 0;
};

struct RunReport {
  std::string dir, label, optim;
  int64_t workers = 1, last_step = 0;
  double val_loss = NAN, consensus = NAN, mb_per_worker = 0, virtual_s = 0;
  double state_per_param = NAN;  // optimizer + algorithm bytes per parameter (memory event)
  double idle_fraction = 0;      // mean over workers of idle / virtual time at their last line
  int64_t min_local_steps = -1;  // fewest steps any worker computed (time_budget skips some)
  std::vector<EvalPoint> curve;  // average-model validation loss
};

// Where the curve first reaches `target`, interpolated linearly between the two evaluations
// around the crossing: (step, virtual seconds), or nothing if it never does.
std::optional<std::pair<double, double>> reach(const std::vector<EvalPoint>& curve, double target) {
  for (size_t i = 0; i < curve.size(); ++i) {
    if (!(curve[i].val_loss <= target)) continue;
    if (i == 0) return std::pair{static_cast<double>(curve[0].step), curve[0].virtual_s};
    const auto& a = curve[i - 1];
    const auto& b = curve[i];
    const double f = (a.val_loss - target) / (a.val_loss - b.val_loss);
    return std::pair{static_cast<double>(a.step) + f * static_cast<double>(b.step - a.step),
                     a.virtual_s + f * (b.virtual_s - a.virtual_s)};
  }
  return std::nullopt;
}

RunReport read_run(const std::string& dir) {
  RunReport r;
  r.dir = dir;
  auto info = json::parse(read_file(fs::path(dir) / "run.json"), nullptr, false);
  if (info.is_discarded()) throw DataError("corrupt run.json in '" + dir + "'");
  const auto& algo = info["config"]["algo"];
  const std::string name = algo.value("name", "none");
  r.workers = info.value("world", int64_t{1});
  r.label = name;
  if (name == "gasloc" || name == "dadam" || name == "local_dadam") r.label += "-" + algo.value("topology", "");
  r.optim = info["config"]["optim"].value("name", "adamw");
  std::ifstream in(fs::path(dir) / "metrics.jsonl");
  if (!in) throw DataError("no metrics.jsonl in '" + dir + "'", "is it a gasloc run directory?");
  struct Last {
    int64_t step = -1, bytes = 0, local_steps = -1;
    double idle_s = 0, virtual_s = 0;
  };
  std::map<int64_t, Last> last;  // worker -> its latest train line
  std::string line;
  while (std::getline(in, line)) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    const int64_t step = j.value("step", int64_t{0});
    if (j.value("event", "") == "memory") {
      const double n = static_cast<double>(j.value("params", int64_t{1}));
      r.state_per_param = static_cast<double>(j.value("optimizer_state_bytes", int64_t{0}) +
                                              j.value("sync_state_bytes", int64_t{0})) / n;
    } else if (j.value("event", "") == "eval") {
      r.curve.push_back({step, j.value("val_loss", NAN), j.value("virtual_time_s", 0.0),
                         static_cast<double>(j.value("bytes_sent", int64_t{0})) / 1e6});
      r.val_loss = j.value("val_loss", NAN);
      r.consensus = j.value("consensus_distance", 0.0);
      r.last_step = step;
    } else if (j.value("event", "") == "train") {
      auto& w = last[j.value("worker", int64_t{0})];
      if (step >= w.step)
        w = {step, j.value("bytes_sent", int64_t{0}), j.value("local_steps", step), j.value("idle_s", 0.0),
             j.value("virtual_time_s", 0.0)};
      r.virtual_s = std::max(r.virtual_s, j.value("virtual_time_s", 0.0));
    }
  }
  double total = 0, idle = 0;
  for (auto& [w, l] : last) {
    total += static_cast<double>(l.bytes);
    idle += l.virtual_s > 0 ? l.idle_s / l.virtual_s : 0.0;
    r.min_local_steps = r.min_local_steps < 0 ? l.local_steps : std::min(r.min_local_steps, l.local_steps);
  }
  if (!last.empty()) {
    r.mb_per_worker = total / static_cast<double>(last.size()) / 1e6;
    r.idle_fraction = idle / static_cast<double>(last.size());
  }
  return r;
}
}  // namespace

Action add_report(CLI::App& app) {
  struct Opts {
    std::vector<std::string> runs;
    std::string plot, target_from, plot_x = "step";
    double target = NAN;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--run,runs", o->runs, "run directories to compare")->required();
  app.add_option("--plot", o->plot, "write a PNG of validation loss (needs gnuplot)");
  app.add_option("--plot-x", o->plot_x, "x axis of the plot: step, time (virtual seconds) or bytes (MB sent by worker 0)")
      ->check(CLI::IsMember({"step", "time", "bytes"}));
  auto* t = app.add_option("--target", o->target, "add the step and virtual time at which each run first reaches this validation loss");
  app.add_option("--target-from", o->target_from, "like --target, with the final validation loss of this run directory")
      ->excludes(t);
  return [o]() {
    std::vector<RunReport> reports;
    for (const auto& d : o->runs) reports.push_back(read_run(d));
    double target = o->target;
    if (!o->target_from.empty()) target = read_run(o->target_from).val_loss;
    if (!o->target_from.empty() && !std::isfinite(target))
      throw DataError("'" + o->target_from + "' has no evaluation to take a target loss from", "is the run finished?");
    const bool with_target = std::isfinite(target);
    if (with_target) fmt::print("target validation loss: {:.4f}\n", target);
    fmt::print("| run | algorithm | optimizer | workers | steps | fewest local steps | val_loss (average model) | consensus distance | MB sent per worker | virtual time (s) | idle | state B/param |{}\n",
               with_target ? " steps to target | virtual s to target |" : "");
    fmt::print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |{}\n", with_target ? " --- | --- |" : "");
    for (const auto& r : reports) {
      std::string cols;
      if (with_target) {
        const auto hit = reach(r.curve, target);
        cols = hit ? fmt::format(" {:.0f} | {:.1f} |", hit->first, hit->second) : std::string(" - | - |");
      }
      const std::string state = std::isfinite(r.state_per_param) ? fmt::format("{:.1f}", r.state_per_param) : "-";
      fmt::print("| {} | {} | {} | {} | {} | {} | {:.4f} | {:.3e} | {:.1f} | {:.1f} | {:.1f}% | {} |{}\n",
                 fs::path(r.dir).filename().string(), r.label, r.optim, r.workers, r.last_step, r.min_local_steps, r.val_loss,
                 r.consensus, r.mb_per_worker, r.virtual_s, 100 * r.idle_fraction, state, cols);
    }
    if (o->plot.empty()) return 0;
    const fs::path png = fs::absolute(o->plot);
    const fs::path dat = png.parent_path() / (png.stem().string() + ".dat");
    const fs::path gp = png.parent_path() / (png.stem().string() + ".gp");
    std::string data, plot = "plot ";
    for (size_t i = 0; i < reports.size(); ++i) {
      data += "# " + reports[i].label + "\n";
      for (const auto& e : reports[i].curve) {
        const double x = o->plot_x == "time" ? e.virtual_s : o->plot_x == "bytes" ? e.mb_sent : static_cast<double>(e.step);
        data += fmt::format("{} {}\n", x, e.val_loss);
      }
      data += "\n\n";
      plot += fmt::format("{}'{}' index {} with linespoints title '{}'", i ? ", " : "", dat.string(), i,
                          fs::path(reports[i].dir).filename().string());
    }
    write_file_atomic(dat, data);
    const std::string xlabel = o->plot_x == "time" ? "virtual time (s)" : o->plot_x == "bytes" ? "MB sent (worker 0)" : "step";
    write_file_atomic(gp, fmt::format("set terminal pngcairo size 900,560\nset output '{}'\nset xlabel '{}'\n"
                                      "set ylabel 'validation loss (average model)'\nset grid\nset key top right\n{}\n",
                                      png.string(), xlabel, plot));
    if (std::system(fmt::format("gnuplot '{}' 2>/dev/null", gp.string()).c_str()) != 0) {
      // pngcairo is missing from some gnuplot builds; the plain png terminal always exists.
      std::string script = read_file(gp);
      script.replace(script.find("pngcairo"), 8, "png");
      write_file_atomic(gp, script);
      if (std::system(fmt::format("gnuplot '{}'", gp.string()).c_str()) != 0)
        throw Error("gnuplot failed to draw " + png.string(), "install gnuplot-nox (scripts/setup.sh does)");
    }
    fmt::print("plot: {}\n", png.string());
    return 0;
  };
}

}  // namespace gasloc::app
