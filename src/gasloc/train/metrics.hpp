// RUN/metrics.jsonl: one JSON object per line and event (docs/design.md section 7), flushed at every
// line so a crash loses nothing already reported.
//
// Every line is one of the events below, written and read through the same code (to_json,
// parse_metrics_line): the trainer writes them, and `gasloc report`, `gasloc sweep`, run
// summaries, plots and CSV read them. Each line carries "version" (kMetricsVersion); a line
// without one is version 1, written before the field existed, with the same keys.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace gasloc::train {

// 2: the version field added to version 1's keys. 3: elastic runs (an eval's "members", the
// "view" event). 4: the priced evaluations ("eval_time_s"), compute time and utilization of a
// train line. 5: a train line's "codec_resends", "clipped_from" and "dropped_from", a view's
// "joined_incarnations", the "config_change" event (each written only where it applies). A reader
// refuses lines of a newer version; older lines read with those at 0 or absent.
inline constexpr int64_t kMetricsVersion = 5;

// One worker's training, every train.log_every steps ("train").
struct TrainEvent {
  int64_t step = 0, worker = 0;
  double train_loss = 0, lr = 0;
  bool computed = true;                 // false: skipped by its local-step budget
  std::optional<double> grad_norm;      // none for a skipped step (no gradient), not 0
  bool round_done = false;              // a communication round ended at this step
  double tokens_per_s = 0;              // this worker's, over the steps since its last line
  double wall_time_s = 0, virtual_time_s = 0;
  int64_t bytes_sent = 0;               // by this worker so far, as priced by the network model
  double idle_s = 0;                    // virtual time spent waiting for peers
  std::optional<int64_t> local_steps;   // steps this worker computed so far
  double eval_time_s = 0;               // evaluations of the average model so far, priced on the network (not in virtual_time_s)
  std::optional<double> compute_s;      // time this worker computed so far: virtual in-process, wall in processes
  std::optional<double> utilization;    // compute_s over virtual_time_s (in-process) or wall_time_s (processes); none before version 4
  std::optional<int64_t> codec_resends; // compressed gossip (modulo): chunks resent in fp32 after a wrap so far; absent otherwise
  std::optional<std::vector<int64_t>> clipped_from;  // algo.clip_peers: messages this worker clipped so far, by sender id; absent otherwise
  std::optional<std::vector<int64_t>> dropped_from;  // algo.clip_peers: non-finite messages it dropped so far, by sender id; absent otherwise
};

// An evaluation of the average model and of each worker's own ("eval"), written by worker 0 (in
// an elastic run, by the lowest worker holding a model).
struct EvalEvent {
  int64_t step = 0, worker = 0;
  double val_loss = 0;                  // the average model
  std::vector<double> worker_val_loss;  // each worker's own model, by rank (elastic: by members' order)
  double consensus_distance = 0;        // mean_i ||phi_i - mean phi||^2
  double wall_time_s = 0, virtual_time_s = 0;
  int64_t bytes_sent = 0;               // by worker 0 so far
  std::vector<int64_t> members;         // elastic: the workers holding a model, ascending; empty: all
  double eval_time_s = 0;               // the writer's evaluations so far, priced (train.eval_model = average)
};

// A round of an elastic run whose membership changed ("view"): who died at its merge and who
// joined (healed from a donor), written by the lowest survivor.
struct ViewEvent {
  int64_t step = 0, worker = 0;
  int64_t round = 0;
  std::vector<int64_t> members, died, joined;  // ids ascending
  double virtual_time_s = 0;                   // the writer's clock after the round
  // Process runs: the incarnation of each id in `joined`, in its order (a restart is a new
  // incarnation; the same one listed again is another heal, not another restart). Empty in-process.
  std::vector<int64_t> joined_incarnations;
  // Ids that left the job on purpose since the round before (they announced it, with their
  // checkpoint: a Python rank's Ctrl+C or exception); never in `died`. Written when not empty.
  std::vector<int64_t> left;
};

// What one worker holds besides its model ("memory"), once per run.
struct MemoryEvent {
  int64_t step = 0, worker = 0;
  std::string optim, algo;
  int64_t params = 0, param_bytes = 0, optimizer_state_bytes = 0, sync_state_bytes = 0;
};

// A setting the run's state depends on, changed by a resume at `step` (gasloc train --resume RUN
// --allow-change KEY): the run trained with `old_value` up to it and `new_value` from it on
// ("config_change", written by the leader; run.json's "changes" lists the same).
struct ConfigChangeEvent {
  int64_t step = 0, worker = 0;
  std::string key;
  nlohmann::json old_value, new_value;
};

using MetricsEvent = std::variant<TrainEvent, EvalEvent, MemoryEvent, ViewEvent, ConfigChangeEvent>;

// The line of an event: its fields, "event" and "version".
nlohmann::json to_json(const MetricsEvent& e);
// A line back: nothing for a malformed line (a crash mid-write) or an event this build does not
// know. Throws DataError for a line of a newer version than kMetricsVersion.
std::optional<MetricsEvent> parse_metrics_line(const std::string& line);
// Every event of RUN/metrics.jsonl, in file order. Throws DataError when the file is missing.
std::vector<MetricsEvent> read_metrics(const std::filesystem::path& run_dir);

class MetricsLog {
 public:
  // Opens for appending. With keep_until_step >= 0, first drops lines whose "step" is beyond
  // it (the tail of a run that crashed after its last checkpoint, about to be redone).
  MetricsLog(const std::filesystem::path& path, int64_t keep_until_step = -1);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  // Thread-safe: the workers of an in-process cluster share one log.
  void write(const MetricsEvent& event);

 private:
  std::mutex mu_;
  std::FILE* file_ = nullptr;
  std::filesystem::path path_;
};

// A one-line progress display on a terminal (rewritten in place), plain lines otherwise.
class Progress {
 public:
  explicit Progress(int64_t total_steps);
  void update(int64_t step, double loss, double tokens_per_s, double lr, double eta_s);
  // Prints a line that must stay visible (evaluation, checkpoint), keeping the progress line.
  void println(const std::string& line);
  void finish();

 private:
  int64_t total_;
  bool tty_;
  bool dirty_ = false;
};

std::string format_duration(double seconds);

}  // namespace gasloc::train
