// RUN/metrics.jsonl: one JSON object per line and event (docs/design.md section 7), flushed at every
// line so a crash loses nothing already reported.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <mutex>

namespace gasloc::train {

class MetricsLog {
 public:
  // Opens for appending. With keep_until_step >= 0, first drops lines whose "step" is beyond
  // it (the tail of a run that crashed after its last checkpoint, about to be redone).
  MetricsLog(const std::filesystem::path& path, int64_t keep_until_step = -1);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  // Thread-safe: the workers of an in-process cluster share one log.
  void write(const nlohmann::json& event);

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
