#include "gasloc/train/metrics.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::train {

MetricsLog::MetricsLog(const std::filesystem::path& path, int64_t keep_until_step) : path_(path) {
  if (keep_until_step >= 0 && std::filesystem::exists(path)) {
    std::ifstream in(path);
    std::string line, kept;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || j.value("step", int64_t{0}) <= keep_until_step) kept += line + "\n";
    }
    write_file_atomic(path, kept);
  }
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw Error("cannot open '" + path.string() + "' for appending", "check that the run directory is writable");
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const nlohmann::json& event) {
  const std::string line = event.dump() + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    throw Error("cannot write to '" + path_.string() + "'", "the disk may be full");
}

std::string format_duration(double s) {
  if (s < 0 || s != s) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

Progress::Progress(int64_t total_steps) : total_(total_steps), tty_(::isatty(STDOUT_FILENO) != 0) {}

void Progress::update(int64_t step, double loss, double tokens_per_s, double lr, double eta_s) {
  const std::string line = fmt::format("step {:>6}/{} | loss {:.4f} | lr {:.2e} | {:.0f} tok/s | ETA {}", step, total_,
                                       loss, lr, tokens_per_s, format_duration(eta_s));
  if (tty_) {
    fmt::print("\r\033[K{}", line);
    std::fflush(stdout);
    dirty_ = true;
  } else {
    fmt::print("{}\n", line);
    std::fflush(stdout);
  }
}

void Progress::println(const std::string& line) {
  if (dirty_) fmt::print("\r\033[K");
  dirty_ = false;
  fmt::print("{}\n", line);
  std::fflush(stdout);
}

void Progress::finish() {
  if (dirty_) fmt::print("\n");
  dirty_ = false;
  std::fflush(stdout);
}

}  // namespace gasloc::train
