#include "gasloc/train/metrics.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <limits>
#include <type_traits>
#include <sstream>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::train {

MetricsLog::MetricsLog(const std::filesystem::path& path, int64_t keep_until_step) : path_(path) {
  // Appending to a FIFO would wait for a reader: anything but a regular file is refused, naming it.
  if (std::filesystem::exists(path)) ::close(open_regular_file(path));
  if (keep_until_step >= 0 && std::filesystem::exists(path)) {
    std::istringstream in(read_file(path));
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

void MetricsLog::write(const MetricsEvent& event) {
  const std::string line = to_json(event).dump() + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    throw Error("cannot write to '" + path_.string() + "'", "the disk may be full");
}

namespace {
using nlohmann::json;

json of(const TrainEvent& e) {
  json j = {{"event", "train"}, {"step", e.step}, {"worker", e.worker}, {"train_loss", e.train_loss}, {"lr", e.lr},
          {"computed", e.computed}, {"grad_norm", e.grad_norm ? json(*e.grad_norm) : json(nullptr)},
          {"round_done", e.round_done}, {"tokens_per_s", e.tokens_per_s}, {"wall_time_s", e.wall_time_s},
          {"virtual_time_s", e.virtual_time_s}, {"bytes_sent", e.bytes_sent}, {"idle_s", e.idle_s},
          {"local_steps", e.local_steps ? json(*e.local_steps) : json(nullptr)}, {"eval_time_s", e.eval_time_s},
          {"compute_s", e.compute_s ? json(*e.compute_s) : json(nullptr)},
          {"utilization", e.utilization ? json(*e.utilization) : json(nullptr)}};
  if (e.codec_resends) j["codec_resends"] = *e.codec_resends;
  if (e.clipped_from) j["clipped_from"] = *e.clipped_from;
  if (e.dropped_from) j["dropped_from"] = *e.dropped_from;
  return j;
}
json of(const EvalEvent& e) {
  json j = {{"event", "eval"}, {"step", e.step}, {"worker", e.worker}, {"val_loss", e.val_loss},
            {"worker_val_loss", e.worker_val_loss}, {"consensus_distance", e.consensus_distance},
            {"wall_time_s", e.wall_time_s}, {"virtual_time_s", e.virtual_time_s}, {"bytes_sent", e.bytes_sent},
            {"eval_time_s", e.eval_time_s}};
  if (!e.members.empty()) j["members"] = e.members;
  return j;
}
json of(const ViewEvent& e) {
  json j = {{"event", "view"}, {"step", e.step}, {"worker", e.worker}, {"round", e.round}, {"members", e.members},
            {"died", e.died}, {"joined", e.joined}, {"virtual_time_s", e.virtual_time_s}};
  if (!e.joined_incarnations.empty()) j["joined_incarnations"] = e.joined_incarnations;
  if (!e.left.empty()) j["left"] = e.left;
  return j;
}
json of(const MemoryEvent& e) {
  return {{"event", "memory"}, {"step", e.step}, {"worker", e.worker}, {"optim", e.optim}, {"algo", e.algo},
          {"params", e.params}, {"param_bytes", e.param_bytes}, {"optimizer_state_bytes", e.optimizer_state_bytes},
          {"sync_state_bytes", e.sync_state_bytes}};
}
json of(const ConfigChangeEvent& e) {
  return {{"event", "config_change"}, {"step", e.step}, {"worker", e.worker}, {"key", e.key}, {"old", e.old_value},
          {"new", e.new_value}};
}

// A field of a line, or `fallback` when it is absent, null or of another type: readers have
// always taken what a line holds and defaulted the rest.
// A double written as null was not finite (JSON has no NaN): it reads back as NaN.
template <class T>
T field(const json& j, const char* key, T fallback) {
  const auto it = j.find(key);
  if constexpr (std::is_same_v<T, double>)
    if (it != j.end() && it->is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    return fallback;
  }
}
template <class T>
std::optional<T> optional_field(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<T>();
}
std::vector<int64_t> ids(const json& j, const char* key) {
  std::vector<int64_t> v;
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return v;
  for (const auto& x : *it)
    if (x.is_number_integer()) v.push_back(x.get<int64_t>());
  return v;
}
std::optional<std::vector<int64_t>> optional_ids(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return std::nullopt;
  return ids(j, key);
}
std::vector<double> doubles(const json& j, const char* key) {
  std::vector<double> v;
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return v;
  for (const auto& x : *it) v.push_back(x.is_number() ? x.get<double>() : std::numeric_limits<double>::quiet_NaN());
  return v;
}
}  // namespace

json to_json(const MetricsEvent& e) {
  json j = std::visit([](const auto& x) { return of(x); }, e);
  j["version"] = kMetricsVersion;
  return j;
}

std::optional<MetricsEvent> parse_metrics_line(const std::string& line) {
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  const int64_t version = field<int64_t>(j, "version", 1);
  if (version > kMetricsVersion)
    throw DataError(fmt::format("a metrics line of version {}; this gasloc reads up to version {}", version, kMetricsVersion),
                    "read the run with the gasloc that wrote it, or a newer one");
  const std::string event = field<std::string>(j, "event", "");
  const int64_t step = field<int64_t>(j, "step", 0), worker = field<int64_t>(j, "worker", 0);
  if (event == "train")
    return TrainEvent{step,
                      worker,
                      field(j, "train_loss", 0.0),
                      field(j, "lr", 0.0),
                      field(j, "computed", true),
                      optional_field<double>(j, "grad_norm"),
                      field(j, "round_done", false),
                      field(j, "tokens_per_s", 0.0),
                      field(j, "wall_time_s", 0.0),
                      field(j, "virtual_time_s", 0.0),
                      field<int64_t>(j, "bytes_sent", 0),
                      field(j, "idle_s", 0.0),
                      optional_field<int64_t>(j, "local_steps"),
                      field(j, "eval_time_s", 0.0),
                      optional_field<double>(j, "compute_s"),
                      optional_field<double>(j, "utilization"),
                      optional_field<int64_t>(j, "codec_resends"),
                      optional_ids(j, "clipped_from"),
                      optional_ids(j, "dropped_from")};
  if (event == "eval")
    return EvalEvent{step,
                     worker,
                     field(j, "val_loss", 0.0),
                     doubles(j, "worker_val_loss"),
                     field(j, "consensus_distance", 0.0),
                     field(j, "wall_time_s", 0.0),
                     field(j, "virtual_time_s", 0.0),
                     field<int64_t>(j, "bytes_sent", 0),
                     ids(j, "members"),
                     field(j, "eval_time_s", 0.0)};
  if (event == "view")
    return ViewEvent{step, worker, field<int64_t>(j, "round", 0), ids(j, "members"), ids(j, "died"), ids(j, "joined"),
                     field(j, "virtual_time_s", 0.0), ids(j, "joined_incarnations"), ids(j, "left")};
  if (event == "config_change")
    return ConfigChangeEvent{step, worker, field<std::string>(j, "key", ""), j.value("old", json()), j.value("new", json())};
  if (event == "memory")
    return MemoryEvent{step,
                       worker,
                       field<std::string>(j, "optim", ""),
                       field<std::string>(j, "algo", ""),
                       field<int64_t>(j, "params", 0),
                       field<int64_t>(j, "param_bytes", 0),
                       field<int64_t>(j, "optimizer_state_bytes", 0),
                       field<int64_t>(j, "sync_state_bytes", 0)};
  return std::nullopt;
}

std::vector<MetricsEvent> read_metrics(const std::filesystem::path& run_dir) {
  const std::filesystem::path file = run_dir / "metrics.jsonl";
  if (!std::filesystem::exists(file)) throw DataError("no metrics.jsonl in '" + run_dir.string() + "'", "is it a gasloc run directory?");
  std::istringstream in(read_file(file));  // a FIFO is refused, naming it, instead of waited on
  std::vector<MetricsEvent> out;
  std::string line;
  while (std::getline(in, line))
    if (auto e = parse_metrics_line(line)) out.push_back(std::move(*e));
  return out;
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
