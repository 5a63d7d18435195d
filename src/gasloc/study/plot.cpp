// gnuplot is started with an argument vector and no shell: paths and titles reach it as data.
#include "gasloc/study/plot.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"

extern char** environ;

namespace gasloc::study {
namespace fs = std::filesystem;

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
  // The script names its files relative to its own directory, so that a plot shipped in the
  // repository refers to nothing outside it and redraws wherever the checkout is.
  const std::string dir = script.parent_path().string();
  posix_spawn_file_actions_addchdir_np(&fa, dir.c_str());
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  if (quiet) posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  const std::string path = script.filename().string();
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

// Elastic runs' view changes as ticks along the bottom of a loss plot against step or time: red
// where workers died, green where they rejoined, with one key entry each.
std::string view_marks(const std::vector<RunSummary>& runs, const std::string& x, std::string& plot) {
  if (x != "step" && x != "time") return "";
  std::string arrows;
  bool died = false, joined = false;
  for (const auto& r : runs)
    for (const auto& v : r.views) {
      const double at = x == "time" ? v.virtual_s : static_cast<double>(v.step);
      if (v.died > 0) arrows += fmt::format("set arrow from {0}, graph 0 to {0}, graph 0.05 nohead linecolor 'red'\n", at);
      if (v.joined > 0)
        arrows += fmt::format("set arrow from {0}, graph 0.05 to {0}, graph 0.1 nohead linecolor 'forest-green'\n", at);
      died = died || v.died > 0;
      joined = joined || v.joined > 0;
    }
  if (died) plot += ", NaN with lines linecolor 'red' title 'a worker died (tick)'";
  if (joined) plot += ", NaN with lines linecolor 'forest-green' title 'a worker rejoined (tick)'";
  return arrows;
}

}  // namespace

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
    const bool dashed = i < style.dashed.size() && style.dashed[i];
    plot += fmt::format("{}{} index {} with {} title {}", i ? ", " : "", gp_quote(dat.filename().string()), i,
                        dashed ? "lines dashtype 2" : "linespoints", gp_quote(titles[i]));
  }
  const bool baseline = style.baseline >= 0 && x != "consensus";
  if (baseline)
    plot += fmt::format(", {} with lines dashtype 2 linecolor 'gray40' title {}", style.baseline,
                        gp_quote(fmt::format("unigram baseline ({:.3f})", style.baseline)));
  const std::string xlabel = !style.xlabel.empty() ? style.xlabel
                             : x == "time"          ? "virtual time (s)"
                             : x == "bytes"         ? "data sent by worker 0 (MB)"
                                                    : "training step (inner steps)";
  // Consensus distance decays geometrically under gossip: a log scale shows the rate. Exact zeros
  // (all-reduce methods) have no place on it and gnuplot leaves them out.
  std::string ylabel = "set ylabel 'validation loss (nats per token, average model)'";
  if (x == "consensus")
    ylabel = "set ylabel " +
             gp_quote(style.ylabel.empty() ? "consensus distance (mean squared distance to the average)" : style.ylabel) +
             (any_positive ? "\nset logscale y" : "");
  if (x != "consensus" && !style.ylabel.empty()) ylabel = "set ylabel " + gp_quote(style.ylabel);
  const std::string title = style.title.empty() ? "" : "set title " + gp_quote(style.title) + "\n";
  const std::string marks = view_marks(runs, x, plot);
  write_file_atomic(dat, data);
  write_file_atomic(gp, fmt::format("set terminal pngcairo size 900,560 noenhanced\nset output {}\n{}set xlabel '{}'\n"
                                    "{}\nset grid\nset key {}\n{}{}\n",
                                    gp_quote(png.filename().string()), title, xlabel, ylabel, style.key, marks, plot));
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

}  // namespace gasloc::study
