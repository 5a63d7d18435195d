// The live view of runs (`gasloc dashboard`) and its frozen copy (`gasloc report --html`): the
// data of a page, read from each run's run.json and metrics.jsonl alone, and the page itself.
//
// A RunWatch follows one run directory while its run writes it: every refresh() reads only what
// was appended to metrics.jsonl since the last one, and only whole lines, so a line the trainer
// is still writing waits for its newline. The page polls the JSON of every watched run
// (dashboard_json) and draws it with uPlot, vendored at build time (dashboard_assets.hpp).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gasloc/train/metrics.hpp"

namespace gasloc::study {

// One worker's training lines as columns: one entry per line, in the file's order.
struct WorkerSeries {
  std::vector<double> step, time, train_loss, mb_sent, utilization;  // utilization: NaN before metrics version 4
};

// One worker's own model at each evaluation.
struct LossCurve {
  std::vector<double> step, time, loss;
};

// The evaluations as columns. `time` is the run's clock (virtual in-process, wall over processes).
struct EvalSeries {
  std::vector<double> step, time, val_loss, consensus;  // val_loss: the average model's
  std::map<int64_t, LossCurve> own;                     // worker id -> its own model's validation loss
};

class RunWatch {
 public:
  // `name`: how the page labels the run. Nothing is read until refresh().
  RunWatch(std::filesystem::path dir, std::string name);

  // Reads run.json when it appeared or changed, and the whole lines appended to metrics.jsonl
  // since the last call. A metrics.jsonl that shrank or was replaced (a resume drops the lines
  // after its checkpoint) is read again from its start. Never throws for a run that is not there
  // yet or a file being written; a line of a newer metrics version is kept as the run's error.
  void refresh();

  // What the page draws (the layout is documented at the top of dashboard.cpp).
  nlohmann::json to_json() const;

 private:
  void read_run_json();
  void read_new_lines();
  void reset_metrics();
  void add(const train::MetricsEvent& event);
  void add_eval(const train::EvalEvent& e);
  std::string state() const;

  std::filesystem::path dir_;
  std::string name_;
  nlohmann::json settings_;          // from run.json; null until it is read
  double unigram_ = -1;              // the data's unigram baseline; < 0: unknown
  std::filesystem::file_time_type run_json_mtime_{};
  // Where the next read of metrics.jsonl starts, and which file that offset belongs to.
  uintmax_t offset_ = 0, inode_ = 0;
  double metrics_mtime_ = 0;          // seconds since the epoch
  bool has_metrics_ = false;
  std::string error_;                // why lines stopped being read (a newer metrics version)
  std::map<int64_t, WorkerSeries> workers_;
  EvalSeries eval_;
  int64_t own_lines_at_last_eval_ = 0;  // one rank's own-model lines merged into the last mean point
  nlohmann::json views_ = nlohmann::json::array();
  int64_t last_step_ = 0;
};

// {"generated": ISO time, "runs": [run.to_json()...]} after refreshing every run.
nlohmann::json dashboard_json(std::vector<RunWatch>& runs);

// The JSON text of a document. Its strings may hold bytes that are not UTF-8 (a run directory
// named in Latin-1): each such byte becomes U+FFFD, where dump() would throw.
std::string json_text(const nlohmann::json& data);

// The JSON of a document, safe to embed in an HTML <script>: no '<' (so no "</script>") and
// no U+2028/U+2029 line separators inside strings.
std::string json_for_html(const nlohmann::json& data);

// The page. Live: it polls `data_url` every `refresh_s` seconds. Frozen (data_url empty): it
// draws `embedded` once, with uPlot inside the file, so it opens from disk without a server.
// Throws gasloc::Error when this build has no uPlot (it says how to get it).
struct DashboardPage {
  std::string title = "gasloc dashboard";
  std::string data_url;            // e.g. "data.json"; empty: frozen
  double refresh_s = 3;
  nlohmann::json embedded;         // dashboard_json(...) for a frozen page
};
std::string dashboard_html(const DashboardPage& page);

// Whether this build embedded uPlot, and the error to give when it did not.
bool dashboard_assets_available();
void require_dashboard_assets();

}  // namespace gasloc::study
