// Loss curves as PNG through gnuplot: what `gasloc report --plot` and the sweep sections draw.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "gasloc/study/run_summary.hpp"

namespace gasloc::study {

struct PlotStyle {
  std::string title;    // above the plot; empty: none
  double baseline = -1;  // a dashed line at this loss (the unigram baseline); < 0: none. Not for consensus
  std::string xlabel, ylabel;  // the axes' labels; empty: the default for x
  std::vector<bool> dashed;    // per run: drawn as a dashed line without points (a prediction); empty: none
  std::string key = "top right";  // where the legend goes (gnuplot's words): away from the curves
};

// Draws validation loss against x ("step", "time" or "bytes"), or with x = "consensus" the
// consensus distance against step on a log scale, for the runs, one line each titled by `titles`,
// into a PNG with gnuplot (the .dat and .gp files are kept beside it). gnuplot is started with an
// argument vector, no shell, and every path and title is quoted for gnuplot itself, so any file
// name works. Throws Error if gnuplot is missing or fails.
void plot_runs(const std::vector<RunSummary>& runs, const std::vector<std::string>& titles,
               const std::filesystem::path& png, const std::string& x, const PlotStyle& style = {});

}  // namespace gasloc::study
