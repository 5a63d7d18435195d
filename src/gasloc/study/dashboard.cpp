// The data of the dashboard page. One run's JSON (RunWatch::to_json):
//   {"name", "dir", "state": "waiting" (no run.json yet) | "no metrics yet" | "training" | "finished",
//    "error" (only when lines stopped being read), "settings": {"label", "algo", "optim", "workers",
//    "steps", "preset", "backend", "elastic"} or null, "unigram": the data's baseline or null,
//    "last_step", "seconds_since_update": since metrics.jsonl last changed, or null,
//    "workers": {"<id>": {"step", "time", "train_loss", "mb_sent", "utilization"}},
//    "eval": {"step", "time", "val_loss", "consensus", "own": {"<id>": {"step", "time", "val_loss"}}},
//    "views": [{"step", "time", "round", "members", "died", "joined"}]}
// Series are columns (one array per field, one entry per line) so that the page hands them to
// uPlot as they are. "time" is a line's virtual_time_s: the virtual clock in-process, the
// wall clock over processes. A number JSON cannot hold (NaN) is null: a gap in the chart.
#include "gasloc/study/dashboard.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <ctime>

#include "gasloc/algo/registry.hpp"
#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/study/run_summary.hpp"

namespace gasloc::study {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr size_t kMaxRunJsonBytes = 4 << 20;

// A file descriptor closed on every path out.
struct Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// The bytes of `fd` from `offset` to `end`; fewer if the file is shorter by then.
std::string read_range(int fd, uintmax_t offset, uintmax_t end) {
  std::string bytes(end - offset, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::pread(fd, bytes.data() + got, bytes.size() - got, static_cast<off_t>(offset + got));
    if (n <= 0) break;  // end of file or an error: what was read is kept, the rest is read next time
    got += static_cast<size_t>(n);
  }
  bytes.resize(got);
  return bytes;
}

json worker_json(const WorkerSeries& w) {
  return {{"step", w.step}, {"time", w.time}, {"train_loss", w.train_loss}, {"mb_sent", w.mb_sent},
          {"utilization", w.utilization}};
}

json eval_json(const EvalSeries& e) {
  json own = json::object();
  for (const auto& [id, c] : e.own) own[std::to_string(id)] = {{"step", c.step}, {"time", c.time}, {"val_loss", c.loss}};
  return {{"step", e.step}, {"time", e.time}, {"val_loss", e.val_loss}, {"consensus", e.consensus}, {"own", own}};
}

// The settings the page shows, from run.json's resolved configuration.
json settings_of(const json& info) {
  const json& config = info["config"];
  const json algo = config.value("algo", json::object());
  const std::string name = algo.value("name", "none");
  std::string label = name;
  // Gossip algorithms are named with their graph, as in `gasloc report`.
  if (algo::algorithm_choices().contains(name) && algo::algorithm(name).needs_topology)
    label += "-" + algo.value("topology", std::string());
  const json cluster = config.value("cluster", json::object());
  return {{"label", label},
          {"algo", name},
          {"optim", config.value("optim", json::object()).value("name", "adamw")},
          {"workers", info.value("world", int64_t{1})},
          {"steps", config.value("train", json::object()).value("steps", int64_t{0})},
          {"preset", config.value("model", json::object()).value("preset", std::string())},
          {"backend", cluster.value("backend", std::string("inproc"))},
          {"elastic", cluster.value("elastic", false)}};
}

}  // namespace

RunWatch::RunWatch(fs::path dir, std::string name) : dir_(std::move(dir)), name_(std::move(name)) {}

void RunWatch::refresh() {
  read_run_json();
  if (error_.empty()) read_new_lines();
}

void RunWatch::read_run_json() {
  std::error_code ec;
  const fs::path path = dir_ / "run.json";
  const auto mtime = fs::last_write_time(path, ec);
  if (ec || (!settings_.is_null() && mtime == run_json_mtime_)) return;
  try {
    const json info = json::parse(read_file(path, kMaxRunJsonBytes), nullptr, /*allow_exceptions=*/false);
    if (!info.is_object() || !info.contains("config") || !info["config"].is_object()) return;  // being written: next time
    settings_ = settings_of(info);
    unigram_ = unigram_baseline(info.value("dataset", json::object()).value("dir", std::string()));
    run_json_mtime_ = mtime;
  } catch (const std::exception&) {
    // Replaced or half-written while read (or a setting of an unexpected type): read it on the next refresh.
  }
}

void RunWatch::reset_metrics() {
  offset_ = 0;
  workers_.clear();
  eval_ = {};
  own_lines_at_last_eval_ = 0;
  views_ = json::array();
  last_step_ = 0;
}

void RunWatch::read_new_lines() {
  // O_NONBLOCK: a FIFO in metrics.jsonl's place is the run's error, not a page that never answers.
  const Fd file(::open((dir_ / "metrics.jsonl").c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  struct stat st {};
  if (file.fd < 0 || ::fstat(file.fd, &st) != 0) {
    if (has_metrics_) reset_metrics();  // removed: the run directory was cleared
    has_metrics_ = false;
    return;
  }
  if (!S_ISREG(st.st_mode)) {
    error_ = "'" + (dir_ / "metrics.jsonl").string() + "' is not a regular file (a FIFO, socket or device); the run "
             "writes a regular one: remove it";
    return;
  }
  const auto size = static_cast<uintmax_t>(st.st_size);
  // A resume rewrites the file without the lines after its checkpoint (a new inode, often shorter).
  if (has_metrics_ && (st.st_ino != inode_ || size < offset_)) reset_metrics();
  has_metrics_ = true;
  inode_ = st.st_ino;
  metrics_mtime_ = static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec);
  if (size == offset_) return;
  const std::string bytes = read_range(file.fd, offset_, size);
  const size_t end = bytes.rfind('\n');
  if (end == std::string::npos) return;  // only part of a line so far
  size_t begin = 0;
  while (begin <= end) {
    const size_t nl = bytes.find('\n', begin);
    const std::string line = bytes.substr(begin, nl - begin);
    try {
      if (auto event = train::parse_metrics_line(line)) add(*event);
    } catch (const Error& e) {  // a newer metrics version: nothing after it can be read either
      error_ = std::string(e.what()) + "; " + e.hint();
      break;
    }
    begin = nl + 1;
  }
  offset_ += begin;
}

void RunWatch::add(const train::MetricsEvent& event) {
  if (const auto* t = std::get_if<train::TrainEvent>(&event)) {
    WorkerSeries& w = workers_[t->worker];
    w.step.push_back(static_cast<double>(t->step));
    w.time.push_back(t->virtual_time_s);
    // A line of a step this worker did not compute (dead, or skipped by its local-step budget)
    // repeats its last loss: a gap, not a flat stretch that looks like training.
    w.train_loss.push_back(t->computed ? t->train_loss : std::numeric_limits<double>::quiet_NaN());
    w.mb_sent.push_back(static_cast<double>(t->bytes_sent) / 1e6);
    w.utilization.push_back(t->utilization.value_or(std::numeric_limits<double>::quiet_NaN()));
    last_step_ = std::max(last_step_, t->step);
  } else if (const auto* e = std::get_if<train::EvalEvent>(&event)) {
    add_eval(*e);
    last_step_ = std::max(last_step_, e->step);
  } else if (const auto* v = std::get_if<train::ViewEvent>(&event)) {
    views_.push_back({{"step", v->step}, {"time", v->virtual_time_s}, {"round", v->round},
                      {"members", v->members}, {"died", v->died}, {"joined", v->joined}});
  }
}

void RunWatch::add_eval(const train::EvalEvent& e) {
  const int64_t world = settings_.is_object() ? settings_.value("workers", int64_t{1}) : 1;
  // Over processes without an average model (train.eval_model = local, elastic Gloo) each rank
  // writes a line of its own model: its worker's own point, and together one mean point.
  const bool one_rank_own = world > 1 && e.worker_val_loss.size() == 1;
  for (size_t i = 0; i < e.worker_val_loss.size(); ++i) {
    // By rank, or in an elastic run by the members' order.
    const int64_t id = one_rank_own ? e.worker : i < e.members.size() ? e.members[i] : static_cast<int64_t>(i);
    LossCurve& own = eval_.own[id];
    own.step.push_back(static_cast<double>(e.step));
    own.time.push_back(e.virtual_time_s);
    own.loss.push_back(e.worker_val_loss[i]);
  }
  if (one_rank_own && !eval_.step.empty() && eval_.step.back() == static_cast<double>(e.step)) {
    const auto n = static_cast<double>(own_lines_at_last_eval_++);
    eval_.val_loss.back() = (eval_.val_loss.back() * n + e.val_loss) / (n + 1);
    eval_.time.back() = std::max(eval_.time.back(), e.virtual_time_s);
    return;
  }
  own_lines_at_last_eval_ = 1;
  eval_.step.push_back(static_cast<double>(e.step));
  eval_.time.push_back(e.virtual_time_s);
  eval_.val_loss.push_back(e.val_loss);
  eval_.consensus.push_back(e.consensus_distance);
}

std::string RunWatch::state() const {
  if (settings_.is_null()) return "waiting";
  if (!has_metrics_ || (workers_.empty() && eval_.step.empty())) return "no metrics yet";
  const int64_t steps = settings_.value("steps", int64_t{0});
  const bool evaluated_last = !eval_.step.empty() && eval_.step.back() >= static_cast<double>(steps);
  return steps > 0 && evaluated_last ? "finished" : "training";
}

json RunWatch::to_json() const {
  json workers = json::object();
  for (const auto& [id, w] : workers_) workers[std::to_string(id)] = worker_json(w);
  json j = {{"name", name_},
            {"dir", dir_.string()},
            {"state", state()},
            {"settings", settings_},
            {"unigram", unigram_ >= 0 ? json(unigram_) : json(nullptr)},
            {"last_step", last_step_},
            {"seconds_since_update", nullptr},
            {"workers", workers},
            {"eval", eval_json(eval_)},
            {"views", views_}};
  if (has_metrics_) {
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    j["seconds_since_update"] = std::max(0.0, now - metrics_mtime_);
  }
  if (!error_.empty()) j["error"] = error_;
  return j;
}

json dashboard_json(std::vector<RunWatch>& runs) {
  json out = json::array();
  for (auto& run : runs) {
    run.refresh();
    out.push_back(run.to_json());
  }
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return {{"generated", stamp}, {"runs", out}};
}

std::string json_text(const json& data) {
  return data.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

std::string json_for_html(const json& data) {
  // '<' occurs only inside JSON strings, where \u003c means the same; U+2028/U+2029 end a line
  // in older JavaScript parsers.
  const std::string text = json_text(data);
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '<') {
      out += "\\u003c";
    } else if (text.compare(i, 3, "\xE2\x80\xA8") == 0 || text.compare(i, 3, "\xE2\x80\xA9") == 0) {
      out += text[i + 2] == '\xA8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

}  // namespace gasloc::study
