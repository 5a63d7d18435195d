#include "gasloc/train/run_summary.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/data/dataset.hpp"

extern char** environ;

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
  r.unigram = unigram_baseline(info.value("dataset", json::object()).value("dir", std::string()));
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

namespace {
// A gnuplot single-quoted string: inside one, a quote is written twice; nothing else is special.
std::string gp_quote(const std::string& text) {
  std::string q = "'";
  for (char c : text) {
    if (c == '\'') q += "''";
    else if (c == '\n') q += ' ';
    else q += c;
  }
  return q + "'";
}

// Runs `gnuplot SCRIPT` with an argument vector (no shell); its stdout, and with quiet its
// stderr, go to /dev/null. The exit status, 127 when gnuplot cannot be started.
int run_gnuplot(const fs::path& script, bool quiet) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  if (quiet) posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  const std::string path = script.string();
  char arg0[] = "gnuplot";
  std::vector<char> arg1(path.begin(), path.end());
  arg1.push_back('\0');
  char* argv[] = {arg0, arg1.data(), nullptr};
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, "gnuplot", &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (err != 0) return 127;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}
}  // namespace

double unigram_baseline(const fs::path& data_dir) {
  static std::mutex mu;
  static std::map<std::string, double> cache;
  std::error_code ec;
  if (data_dir.empty() || !fs::is_directory(data_dir, ec)) return -1;
  const std::string key = fs::weakly_canonical(data_dir, ec).string();
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  double u = -1;
  try {
    // dataset.json alone when it records the baseline: no need to map the shards.
    if (fs::exists(data_dir / "dataset.json", ec)) {
      const json meta = json::parse(read_file(data_dir / "dataset.json"), nullptr, false);
      if (meta.is_object() && meta.contains("unigram_val_loss") && meta["unigram_val_loss"].is_number())
        return cache[key] = meta["unigram_val_loss"].get<double>();
    }
    const data::Dataset ds = data::Dataset::open(data_dir);
    u = ds.unigram_val_loss >= 0 ? ds.unigram_val_loss : data::unigram_cross_entropy(*ds.train, *ds.val, ds.vocab_size);
  } catch (const Error&) {
    u = -1;  // a damaged or partial dataset has no baseline; the report goes on without it
  }
  cache[key] = u;
  return u;
}

std::vector<std::string> run_labels(const std::vector<std::string>& dirs) {
  auto name = [](const std::string& d, int level) {
    const fs::path p = fs::path(d).lexically_normal();
    fs::path q = p.has_filename() ? p : p.parent_path();  // "runs/a/" -> "runs/a"
    if (level == 0) return q.filename().string();
    if (level == 1) return (q.parent_path().filename() / q.filename()).string();
    return q.string();
  };
  std::vector<std::string> out(dirs.size());
  for (size_t i = 0; i < dirs.size(); ++i) {
    int level = 0;
    for (; level < 2; ++level) {
      bool clash = false;
      for (size_t j = 0; j < dirs.size() && !clash; ++j)
        clash = j != i && name(dirs[j], level) == name(dirs[i], level);
      if (!clash) break;
    }
    out[i] = name(dirs[i], level);
  }
  return out;
}

void plot_runs(const std::vector<RunSummary>& runs, const std::vector<std::string>& titles, const fs::path& png_in,
               const std::string& x, const PlotStyle& style) {
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
    plot += fmt::format("{}{} index {} with linespoints title {}", i ? ", " : "", gp_quote(dat.string()), i,
                        gp_quote(titles[i]));
  }
  const bool baseline = style.baseline >= 0 && x != "consensus";
  if (baseline)
    plot += fmt::format(", {} with lines dashtype 2 linecolor 'gray40' title {}", style.baseline,
                        gp_quote(fmt::format("unigram baseline ({:.3f})", style.baseline)));
  const std::string xlabel = x == "time"    ? "virtual time (s)"
                             : x == "bytes" ? "data sent by worker 0 (MB)"
                                            : "training step (inner steps)";
  // Consensus distance decays geometrically under gossip: a log scale shows the rate. Exact zeros
  // (all-reduce methods) have no place on it and gnuplot leaves them out.
  std::string ylabel = "set ylabel 'validation loss (nats per token, average model)'";
  if (x == "consensus")
    ylabel = std::string("set ylabel 'consensus distance (mean squared distance to the average)'") +
             (any_positive ? "\nset logscale y" : "");
  const std::string title = style.title.empty() ? "" : "set title " + gp_quote(style.title) + "\n";
  write_file_atomic(dat, data);
  write_file_atomic(gp, fmt::format("set terminal pngcairo size 900,560 noenhanced\nset output {}\n{}set xlabel '{}'\n"
                                    "{}\nset grid\nset key top right\n{}\n",
                                    gp_quote(png.string()), title, xlabel, ylabel, plot));
  const int first = run_gnuplot(gp, /*quiet=*/true);
  if (first == 127) throw Error("gnuplot not found: cannot draw " + png.string(), "install gnuplot-nox (scripts/setup.sh does)");
  if (first != 0) {
    // pngcairo is missing from some gnuplot builds; the plain png terminal always exists.
    std::string script = read_file(gp);
    if (const auto at = script.find("pngcairo"); at != std::string::npos) script.replace(at, 8, "png");
    write_file_atomic(gp, script);
    if (run_gnuplot(gp, /*quiet=*/false) != 0)
      throw Error("gnuplot failed to draw " + png.string() + " (its messages are above; the script is " + gp.string() + ")",
                  "check that the directory is writable; reinstall gnuplot-nox if the script is right");
  }
}

const std::vector<std::string> kCsvColumns = {"train_loss", "val_loss",   "consensus_distance", "lr",
                                              "grad_norm",  "computed",   "round_done",         "tokens_per_s",
                                              "local_steps", "wall_time_s", "virtual_time_s",   "bytes_sent",
                                              "idle_s"};

namespace {
std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}
std::string csv_value(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return csv_cell(v.get<std::string>());
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return std::isfinite(d) ? fmt::format("{}", d) : std::string();  // fmt: shortest round-trip form
  }
  return v.dump();  // integers, true/false
}
}  // namespace

std::string runs_csv(const std::vector<std::string>& dirs, const std::vector<std::string>& labels) {
  std::string out = "run,event,worker,step";
  for (const auto& c : kCsvColumns) out += "," + c;
  out += "\n";
  for (size_t i = 0; i < dirs.size(); ++i) {
    std::ifstream in(fs::path(dirs[i]) / "metrics.jsonl");
    if (!in) throw DataError("no metrics.jsonl in '" + dirs[i] + "'", "is it a gasloc run directory?");
    const std::string run = csv_cell(labels.at(i));
    std::string line;
    while (std::getline(in, line)) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) continue;
      const std::string event = j.value("event", "");
      if (event != "train" && event != "eval") continue;
      auto row = [&](const std::string& ev, const std::string& worker, const json& values) {
        out += run + "," + ev + "," + worker + "," + csv_value(j.value("step", json(nullptr)));
        for (const auto& c : kCsvColumns) out += "," + (values.contains(c) ? csv_value(values[c]) : std::string());
        out += "\n";
      };
      if (event == "train") {
        row("train", csv_value(j.value("worker", json(nullptr))), j);
        continue;
      }
      row("eval", "", j);
      const json own = j.value("worker_val_loss", json::array());
      for (size_t w = 0; own.is_array() && w < own.size(); ++w)
        row("eval_worker", std::to_string(w), {{"val_loss", own[w]}});
    }
  }
  return out;
}

}  // namespace gasloc::train
