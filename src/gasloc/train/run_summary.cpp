#include "gasloc/train/run_summary.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::train {
namespace fs = std::filesystem;
using nlohmann::json;

RunSummary read_run_summary(const fs::path& dir) {
  RunSummary r;
  r.dir = dir.string();
  if (!fs::exists(dir / "run.json")) throw DataError("no run.json in '" + r.dir + "'", "is it a gasloc run directory?");
  auto info = json::parse(read_file(dir / "run.json"), nullptr, false);
  if (info.is_discarded() || !info.contains("config")) throw DataError("corrupt run.json in '" + r.dir + "'");
  const auto& algo = info["config"]["algo"];
  const std::string name = algo.value("name", "none");
  r.workers = info.value("world", int64_t{1});
  r.planned_steps = info["config"]["train"].value("steps", int64_t{0});
  r.label = name;
  if (name == "gasloc" || name == "dadam" || name == "local_dadam") {
    r.label += '-';
    r.label += algo.value("topology", std::string());
  }
  r.optim = info["config"]["optim"].value("name", "adamw");
  std::ifstream in(dir / "metrics.jsonl");
  if (!in) throw DataError("no metrics.jsonl in '" + r.dir + "'", "is it a gasloc run directory?");
  struct Last {
    int64_t step = -1, bytes = 0, local_steps = -1;
    double idle_s = 0, virtual_s = 0;
  };
  std::map<int64_t, Last> last;  // worker -> its latest train line
  double segment_wall = 0;       // each process (a resume is a new one) starts its wall clock at 0
  std::string line;
  while (std::getline(in, line)) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    const int64_t step = j.value("step", int64_t{0});
    const std::string event = j.value("event", "");
    if (event == "memory") {
      const double n = static_cast<double>(std::max<int64_t>(1, j.value("params", int64_t{1})));
      r.state_per_param =
          static_cast<double>(j.value("optimizer_state_bytes", int64_t{0}) + j.value("sync_state_bytes", int64_t{0})) / n;
    } else if (event == "eval") {
      r.curve.push_back({step, j.value("val_loss", 0.0), j.value("virtual_time_s", 0.0),
                         static_cast<double>(j.value("bytes_sent", int64_t{0})) / 1e6,
                         j.value("consensus_distance", 0.0)});
      r.val_loss = j.value("val_loss", 0.0);
      r.has_val_loss = true;
      r.consensus = j.value("consensus_distance", 0.0);
      r.last_step = step;
      // Evaluations come from one writer in step order, so a smaller wall time starts a new segment.
      const double wall = j.value("wall_time_s", 0.0);
      if (wall < segment_wall) r.wall_s += segment_wall;
      segment_wall = wall;
    } else if (event == "train") {
      auto& w = last[j.value("worker", int64_t{0})];
      if (step >= w.step)
        w = {step, j.value("bytes_sent", int64_t{0}), j.value("local_steps", step), j.value("idle_s", 0.0),
             j.value("virtual_time_s", 0.0)};
      r.virtual_s = std::max(r.virtual_s, j.value("virtual_time_s", 0.0));
    }
  }
  r.wall_s += segment_wall;
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

std::optional<std::pair<double, double>> reach_target(const std::vector<EvalPoint>& curve, double target) {
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

void plot_runs(const std::vector<RunSummary>& runs, const std::vector<std::string>& titles, const fs::path& png_in,
               const std::string& x) {
  const fs::path png = fs::absolute(png_in);
  const fs::path dat = png.parent_path() / (png.stem().string() + ".dat");
  const fs::path gp = png.parent_path() / (png.stem().string() + ".gp");
  std::string data, plot = "plot ";
  bool any_positive = false;  // a log scale needs one positive value to draw at all
  for (const auto& r : runs)
    for (const auto& e : r.curve) any_positive = any_positive || e.consensus > 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    data += "# " + titles[i] + "\n";
    for (const auto& e : runs[i].curve) {
      const double v = x == "time" ? e.virtual_s : x == "bytes" ? e.mb_sent : static_cast<double>(e.step);
      data += fmt::format("{} {}\n", v, x == "consensus" ? e.consensus : e.val_loss);
    }
    data += "\n\n";
    plot += fmt::format("{}'{}' index {} with linespoints title '{}'", i ? ", " : "", dat.string(), i, titles[i]);
  }
  const std::string xlabel = x == "time" ? "virtual time (s)" : x == "bytes" ? "MB sent (worker 0)" : "step";
  // Consensus distance decays geometrically under gossip: a log scale shows the rate. Exact zeros
  // (all-reduce methods) have no place on it and gnuplot leaves them out.
  std::string ylabel = "set ylabel 'validation loss (average model)'";
  if (x == "consensus")
    ylabel = std::string("set ylabel 'consensus distance (mean squared, to the average)'") + (any_positive ? "\nset logscale y" : "");
  write_file_atomic(dat, data);
  write_file_atomic(gp, fmt::format("set terminal pngcairo size 900,560 noenhanced\nset output '{}'\nset xlabel '{}'\n"
                                    "{}\nset grid\nset key top right\n{}\n",
                                    png.string(), xlabel, ylabel, plot));
  if (std::system(fmt::format("gnuplot '{}' 2>/dev/null", gp.string()).c_str()) != 0) {
    // pngcairo is missing from some gnuplot builds; the plain png terminal always exists.
    std::string script = read_file(gp);
    if (const auto at = script.find("pngcairo"); at != std::string::npos) script.replace(at, 8, "png");
    write_file_atomic(gp, script);
    if (std::system(fmt::format("gnuplot '{}'", gp.string()).c_str()) != 0)
      throw Error("gnuplot failed to draw " + png.string(), "install gnuplot-nox (scripts/setup.sh does)");
  }
}

}  // namespace gasloc::train
