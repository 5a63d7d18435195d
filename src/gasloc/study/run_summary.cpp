#include "gasloc/study/run_summary.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>

#include "gasloc/algo/registry.hpp"
#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/train/metrics.hpp"

extern char** environ;

namespace gasloc::study {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// What run.json tells: what ran, on how many workers, for how many steps, and the data's unigram baseline.
void read_run_info(const fs::path& dir, RunSummary& r) {
  if (!fs::exists(dir / "run.json")) throw DataError("no run.json in '" + r.dir + "'", "is it a gasloc run directory?");
  auto info = json::parse(read_file(dir / "run.json"), nullptr, false);
  if (info.is_discarded() || !info.contains("config")) throw DataError("corrupt run.json in '" + r.dir + "'");
  const auto& algo_cfg = info["config"]["algo"];
  const std::string name = algo_cfg.value("name", "none");
  r.workers = info.value("world", int64_t{1});
  r.planned_steps = info["config"]["train"].value("steps", int64_t{0});
  r.label = name;
  r.algo = name;
  // Gossip algorithms are labelled with their graph; a name this build does not know, without.
  if (algo::algorithm_choices().contains(name) && algo::algorithm(name).needs_topology) {
    r.label += '-';
    r.label += algo_cfg.value("topology", std::string());
  }
  r.H = algo_cfg.value("H", int64_t{0});
  // With network.simulated_model the counted bytes are that model's, priced: bits a parameter are of its parameters.
  const auto& net = info["config"].value("network", json::object());
  const std::string simulated = net.value("simulated_model", std::string());
  if (!simulated.empty()) {
    try {
      r.priced_params = model::LlamaConfig::preset(simulated.substr(0, simulated.find(':'))).num_params();
    } catch (const Error&) {
      r.priced_params = -1;  // a preset this build does not know: bits a parameter are unknown
    }
  } else if (net.value("simulated_model_bytes", int64_t{0}) > 0) {
    r.priced_params = net.value("simulated_model_bytes", int64_t{0}) / 4;  // bytes of fp32 parameters
  }
  r.compression = algo_cfg.value("compression", std::string("none"));
  if (r.compression != "none") r.label += "+" + r.compression;
  r.optim = info["config"]["optim"].value("name", "adamw");
  r.unigram = unigram_baseline(info.value("dataset", json::object()).value("dir", std::string()));
}

// The metrics lines of a run folded into its summary, in the file's order.
class MetricsFold {
 public:
  explicit MetricsFold(RunSummary& r) : r_(r) {}

  void add(const train::MetricsEvent& event) {
    if (const auto* m = std::get_if<train::MemoryEvent>(&event)) {
      add_memory(*m);
    } else if (const auto* v = std::get_if<train::ViewEvent>(&event)) {
      r_.deaths += static_cast<int64_t>(v->died.size());
      r_.rejoins += static_cast<int64_t>(v->joined.size());
      // A joiner listed again by a view pinned ahead of its heal is healed again, not restarted.
      for (size_t k = 0; k < v->joined.size(); ++k)
        if (k >= v->joined_incarnations.size() || restarted_.insert({v->joined[k], v->joined_incarnations[k]}).second)
          ++r_.restarts;
      r_.views.push_back({v->step, v->virtual_time_s, static_cast<int64_t>(v->died.size()),
                          static_cast<int64_t>(v->joined.size())});
    } else if (const auto* e = std::get_if<train::EvalEvent>(&event)) {
      add_eval(*e);
    } else if (const auto* t = std::get_if<train::TrainEvent>(&event)) {
      add_train(*t);
    }
  }

  // What needs every line: the last segment's wall time and the means over the workers.
  void finish() {
    r_.wall_s += segment_wall_;
    double total = 0, idle = 0, util = 0;
    bool all_util = !last_.empty();
    for (auto& [w, l] : last_) {
      total += static_cast<double>(l.bytes);
      idle += l.virtual_s > 0 ? l.idle_s / l.virtual_s : 0.0;
      all_util = all_util && l.utilization.has_value();
      util += l.utilization.value_or(0.0);
      r_.min_local_steps = r_.min_local_steps < 0 ? l.local_steps : std::min(r_.min_local_steps, l.local_steps);
      if (l.resends) r_.resends = std::max<int64_t>(r_.resends, 0) + *l.resends;
      add_by_sender(r_.clipped_from, l.clipped_from);
      add_by_sender(r_.dropped_from, l.dropped_from);
    }
    if (!last_.empty()) {
      r_.mb_per_worker = total / static_cast<double>(last_.size()) / 1e6;
      int64_t step = 0;
      for (auto& [w, l] : last_) step = std::max(step, l.step);
      const int64_t rounds = algo::algorithm_choices().contains(r_.algo) && r_.H > 0
                                 ? algo::algorithm(r_.algo).rounds_in(step, r_.H) : 0;
      const int64_t params = r_.priced_params != 0 ? r_.priced_params : r_.params;
      if (rounds > 0 && params > 0)
        r_.bits_per_param_round = 8e6 * r_.mb_per_worker / static_cast<double>(params) / static_cast<double>(rounds);
      r_.idle_fraction = idle / static_cast<double>(last_.size());
      if (all_util) r_.utilization = util / static_cast<double>(last_.size());
    }
  }

 private:
  std::set<std::pair<int64_t, int64_t>> restarted_;  // (id, incarnation) seen healed
  struct Last {
    int64_t step = -1, bytes = 0, local_steps = -1;
    double idle_s = 0, virtual_s = 0;
    std::optional<double> utilization;
    std::optional<int64_t> resends;
    std::optional<std::vector<int64_t>> clipped_from, dropped_from;
  };

  // sum[j] += counts[j] for each sender j (clip_peers' counts of one worker's last line).
  static void add_by_sender(std::vector<int64_t>& sum, const std::optional<std::vector<int64_t>>& counts) {
    if (!counts) return;
    if (sum.size() < counts->size()) sum.resize(counts->size(), 0);
    for (size_t j = 0; j < counts->size(); ++j) sum[j] += (*counts)[j];
  }

  void add_memory(const train::MemoryEvent& m) {
    const double n = static_cast<double>(std::max<int64_t>(1, m.params));
    r_.state_per_param = static_cast<double>(m.optimizer_state_bytes + m.sync_state_bytes) / n;
    r_.optimizer_state_per_param = static_cast<double>(m.optimizer_state_bytes) / n;
    r_.sync_state_per_param = static_cast<double>(m.sync_state_bytes) / n;
    r_.params = m.params;
  }

  void add_eval(const train::EvalEvent& e) {
    // Over processes without an average model (train.eval_model = local, elastic Gloo runs)
    // each rank writes a line of its own model: together they are one point, their mean.
    const bool own = r_.workers > 1 && e.worker_val_loss.size() == 1;
    // One process's local evaluation writes the workers' mean with no consensus (it needs the average).
    r_.own_models = r_.own_models || own || std::isnan(e.consensus_distance);
    if (own) {
      const auto at =
          std::find_if(r_.curve.rbegin(), r_.curve.rend(), [&](const EvalPoint& p) { return p.step == e.step; });
      if (at != r_.curve.rend()) {
        int64_t& n = own_lines_[e.step];
        at->val_loss = (at->val_loss * static_cast<double>(n) + e.val_loss) / static_cast<double>(n + 1);
        ++n;
        at->virtual_s = std::max(at->virtual_s, e.virtual_time_s);
        if (e.step == r_.last_step) r_.val_loss = at->val_loss;
        return;
      }
      own_lines_[e.step] = 1;
    }
    r_.curve.push_back({e.step, e.val_loss, e.virtual_time_s, static_cast<double>(e.bytes_sent) / 1e6,
                        e.consensus_distance});
    r_.val_loss = e.val_loss;
    r_.has_val_loss = true;
    r_.consensus = e.consensus_distance;
    r_.last_step = e.step;
    // Evaluations come from one writer in step order, so a smaller wall time starts a new segment.
    if (e.wall_time_s < segment_wall_) r_.wall_s += segment_wall_;
    segment_wall_ = e.wall_time_s;
  }

  void add_train(const train::TrainEvent& t) {
    auto& w = last_[t.worker];
    if (t.step >= w.step)
      w = {t.step, t.bytes_sent, t.local_steps.value_or(t.step), t.idle_s, t.virtual_time_s, t.utilization, t.codec_resends,
           t.clipped_from, t.dropped_from};
    if (t.virtual_time_s >= r_.virtual_s) r_.eval_s = t.eval_time_s;
    r_.virtual_s = std::max(r_.virtual_s, t.virtual_time_s);
    if (t.step > r_.last_train_step || (t.step == r_.last_train_step && t.wall_time_s > r_.train_wall_s)) {
      r_.last_train_step = t.step;
      r_.train_wall_s = t.wall_time_s;
    }
  }

  RunSummary& r_;
  std::map<int64_t, Last> last_;          // worker -> its latest train line
  double segment_wall_ = 0;               // each process (a resume is a new one) starts its wall clock at 0
  std::map<int64_t, int64_t> own_lines_;  // step -> lines of one rank's own model merged into its point
};

}  // namespace

std::string val_loss_header(bool any_own_models) {
  return any_own_models ? "val_loss (average model; \"own\": the mean of the workers' own models)"
                        : "val_loss (average model)";
}

RunSummary read_run_summary(const fs::path& dir) {
  RunSummary r;
  r.dir = dir.string();
  read_run_info(dir, r);
  const std::vector<train::MetricsEvent> events = train::read_metrics(dir);
  MetricsFold fold(r);
  for (const auto& event : events) fold.add(event);
  fold.finish();
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

}  // namespace gasloc::study
