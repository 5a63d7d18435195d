#include "gasloc/train/job_config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "gasloc/comm/heartbeat.hpp"
#include "gasloc/core/config.hpp"
#include "gasloc/model/hf_export.hpp"

namespace gasloc::train {
using config::require;

const config::Choices& sampling_choices() {
  static const config::Choices c("sampling", {{"shared", "every worker draws from the whole stream"},
                                              {"disjoint", "worker r from the r-th of n slices: heterogeneous data"}});
  return c;
}
const config::Choices& device_choices() {
  static const config::Choices c("device", {{"cpu", ""}, {"cuda", ""}});
  return c;
}
const config::Choices& dtype_choices() {
  static const config::Choices c("dtype", {{"fp32", ""}, {"bf16", "autocast, fp32 master weights"}});
  return c;
}
const config::Choices& decay_on_choices() {
  static const config::Choices c("decay point", {{"z", "weight decay shrinks z"},
                                                 {"y", "weight decay taken at y, the Schedule-Free reference's default"}});
  return c;
}
const config::Choices& backend_choices() {
  static const config::Choices c("backend", {{"inproc", "threads in one process, virtual clock"},
                                             {"gloo", "one process per worker, gasloc launch"},
                                             {"nccl", "one process and GPU per worker, gasloc launch (a CUDA LibTorch)"}});
  return c;
}
const config::Choices& eval_model_choices() {
  static const config::Choices c(
      "evaluated model", {{"average", "mean_i phi_i, all-reduced over the workers; also each worker's own and the consensus"},
                          {"local", "each worker's own model, no model leaves its worker; val_loss is their mean"}});
  return c;
}
const config::Choices& scenario_choices() {
  static const config::Choices c("scenario", {{"homogeneous", ""},
                                              {"straggler_bw10", "last rank's link at 10%"},
                                              {"straggler_bw20", "last rank's link at 20%"},
                                              {"slow_compute", "last rank at half speed"}});
  return c;
}

const config::Choices& allreduce_pattern_choices() {
  static const config::Choices c("all-reduce pattern", {{"ring", "2(n-1) latencies + 2(n-1)/n P/B"},
                                                        {"tree", "recursive halving-doubling: 2 ceil(log2 n) latencies + 2(n-1)/n P/B"}});
  return c;
}

const OptimSection::Docs& OptimSection::docs() {
  static const Docs d = [] {
    const std::string mu = optimizer_names(&OptimizerEntry::uses_mu), avg = optimizer_names(&OptimizerEntry::averages);
    Docs out;
    out.mu_y = mu + ": gradients at y = mu_y*x + (1-mu_y)*z, in (0, 1] (schedule_free uses beta1)";
    out.mu_x = mu + ": model average x <- mu_x*x + (1-mu_x)*z, in [0, 1] (0 = AdamW)";
    out.decay_on = "where weight decay applies (" + avg + ")";
    out.gpa_from_diloco = mu + ": { H = 32, mu = 0.9 } sets mu_x = mu^(1/H), mu_y = mu (H = 0: off)";
    return out;
  }();
  return d;
}

model::LlamaConfig ModelSection::resolve(int64_t vocab_size) const {
  model::LlamaConfig c = model::LlamaConfig::preset(preset);
  auto pick = [](auto& dst, auto v) {
    if (v > 0) dst = v;
  };
  pick(c.dim, dim);
  pick(c.n_layers, n_layers);
  pick(c.n_heads, n_heads);
  pick(c.n_kv_heads, n_kv_heads);
  pick(c.multiple_of, multiple_of);
  pick(c.ffn_dim_multiplier, ffn_dim_multiplier);
  pick(c.max_seq_len, max_seq_len);
  pick(c.norm_eps, norm_eps);
  pick(c.vocab_size, vocab_size);
  c.rope_theta = rope_theta;
  c.tie_embeddings = tie_embeddings;
  c.init_std = init_std;
  c.fused = fused;
  c.validate();
  return c;
}

std::vector<std::string> hf_init_settings(const std::filesystem::path& dir) {
  const model::LlamaConfig c = model::read_hf_config(dir / "config.json");
  // fmt's "{}" writes the shortest text that reads back as the same double.
  return {fmt::format("model.init_from={}", dir.string()),
          fmt::format("model.dim={}", c.dim),
          fmt::format("model.n_layers={}", c.n_layers),
          fmt::format("model.n_heads={}", c.n_heads),
          fmt::format("model.n_kv_heads={}", c.n_kv_heads),
          fmt::format("model.multiple_of={}", c.multiple_of),
          fmt::format("model.ffn_dim_multiplier={}", c.ffn_dim_multiplier),
          fmt::format("model.norm_eps={}", c.norm_eps),
          fmt::format("model.rope_theta={}", c.rope_theta),
          fmt::format("model.max_seq_len={}", c.max_seq_len),
          fmt::format("model.tie_embeddings={}", c.tie_embeddings),
          fmt::format("data.vocab_size={}", c.vocab_size)};
}

namespace {
// An inline table read with its section's visit(): unknown keys and mistyped values name the key.
template <class T>
void inline_table_from_json(const nlohmann::json& j, T& out, const std::string& key) {
  T fresh;
  config::apply_table(fresh, key, j);
  out = fresh;
}
}  // namespace

void to_json(nlohmann::json& j, const GpaFromDiloco& g) { j = config::to_json(g); }
void from_json(const nlohmann::json& j, GpaFromDiloco& g) { inline_table_from_json(j, g, "optim.gpa_from_diloco"); }
void to_json(nlohmann::json& j, const Straggler& s) { j = config::to_json(s); }
void to_json(nlohmann::json& j, const FaultKill& k) { j = config::to_json(k); }
void from_json(const nlohmann::json& j, FaultKill& k) { inline_table_from_json(j, k, "faults.kill"); }
void to_json(nlohmann::json& j, const FaultPoison& p) { j = config::to_json(p); }
void from_json(const nlohmann::json& j, FaultPoison& p) { inline_table_from_json(j, p, "faults.poison"); }

std::vector<algo::Poison> FaultsSection::poisons() const {
  std::vector<algo::Poison> out;
  for (const FaultPoison& p : poison) out.push_back({p.worker, p.round, p.factor});
  return out;
}
void from_json(const nlohmann::json& j, Straggler& s) { inline_table_from_json(j, s, "network.stragglers"); }

void NetworkSection::resolve() {
  if (simulated_model.empty()) return;
  const auto colon = simulated_model.find(':');
  const std::string preset_name = simulated_model.substr(0, colon);
  const std::string dtype = colon == std::string::npos ? "fp32" : simulated_model.substr(colon + 1);
  int64_t elem = 0;
  if (dtype == "fp32") elem = 4;
  else if (dtype == "bf16" || dtype == "fp16") elem = 2;
  require(elem > 0, "network.simulated_model", "dtype '" + dtype + "' is not fp32, bf16 or fp16 (write e.g. \"134m:bf16\")");
  int64_t params = 0;
  try {
    params = model::LlamaConfig::preset(preset_name).num_params();
  } catch (const ConfigError& e) {
    require(false, "network.simulated_model", e.what());
  }
  const int64_t bytes = params * elem;
  require(simulated_model_bytes == 0 || simulated_model_bytes == bytes, "network.simulated_model_bytes",
          fmt::format("{} conflicts with network.simulated_model = \"{}\" ({} bytes); set only one", simulated_model_bytes,
                      simulated_model, bytes));
  simulated_model_bytes = bytes;
  simulated_element_bytes = elem;
}

void NetworkSection::validate(int world) const {
  require(std::isfinite(step_time_s) && step_time_s > 0, "network.step_time_s", "must be > 0");
  require(std::isfinite(bandwidth_gbit) && bandwidth_gbit > 0, "network.bandwidth_gbit", "must be > 0");
  require(std::isfinite(latency_s) && latency_s >= 0, "network.latency_s", "must be >= 0");
  require(simulated_model_bytes >= 0, "network.simulated_model_bytes", "must be >= 0 (0 = actual size)");
  require(world <= 0 || latencies_s.empty() || static_cast<int>(latencies_s.size()) == world, "network.latencies_s",
          fmt::format("has {} entries; it needs one per worker ({}) or none", latencies_s.size(), world));
  for (size_t i = 0; i < latencies_s.size(); ++i)
    require(std::isfinite(latencies_s[i]) && latencies_s[i] >= 0, fmt::format("network.latencies_s[{}]", i), "must be >= 0");
  int64_t in_regions = 0;
  for (size_t i = 0; i < regions.size(); ++i) {
    require(regions[i] > 0, fmt::format("network.regions[{}]", i), "must be >= 1 (a region's number of workers)");
    in_regions += regions[i];
  }
  require(world <= 0 || regions.empty() || in_regions == world, "network.regions",
          fmt::format("adds up to {} workers but the cluster has {}", in_regions, world));
  require(std::isfinite(inter_region_latency_s) && inter_region_latency_s >= 0, "network.inter_region_latency_s", "must be >= 0");
  require(std::isfinite(inter_region_bandwidth_gbit) && inter_region_bandwidth_gbit >= 0, "network.inter_region_bandwidth_gbit",
          "must be >= 0 (0 = no cap)");
  require(!regions.empty() || (inter_region_latency_s == 0 && inter_region_bandwidth_gbit == 0),
          inter_region_latency_s != 0 ? "network.inter_region_latency_s" : "network.inter_region_bandwidth_gbit",
          "applies between regions, but network.regions is empty (e.g. regions = [4, 4])");
  for (size_t i = 0; i < stragglers.size(); ++i) {
    const auto& st = stragglers[i];
    const std::string key = fmt::format("network.stragglers[{}]", i);
    require(st.rank >= 0, key + ".rank", "must name a worker (>= 0)");
    require(world <= 0 || st.rank < world, key + ".rank",
            fmt::format("is {} but the cluster has {} worker(s), ranks 0..{}", st.rank, world, world - 1));
    require(std::isfinite(st.bandwidth) && st.bandwidth > 0, key + ".bandwidth", "must be > 0 (a fraction of bandwidth_gbit)");
    require(std::isfinite(st.slowdown) && st.slowdown > 0, key + ".slowdown", "must be > 0");
  }
}

comm::NetworkModel NetworkSection::model(int world) const {
  validate(world);
  comm::NetworkModel m;
  m.step_time_s = step_time_s;
  m.bandwidth_Bps = bandwidth_gbit * 1e9 / 8;
  m.latency_s = latency_s;
  m.latency_per_rank = latencies_s;
  for (size_t k = 0; k < regions.size(); ++k) m.region.insert(m.region.end(), static_cast<size_t>(regions[k]), static_cast<int>(k));
  m.inter_region_latency_s = inter_region_latency_s;
  m.inter_region_Bps = inter_region_bandwidth_gbit * 1e9 / 8;
  m.allreduce = allreduce == "tree" ? comm::AllReducePattern::tree : comm::AllReducePattern::ring;
  m.simulated_message_bytes = simulated_model_bytes;
  m.parameter_message_bytes = parameter_message_bytes;
  std::vector<Straggler> all;
  if (preset == "straggler_bw10") all.push_back({world - 1, 0.1, 1.0});
  if (preset == "straggler_bw20") all.push_back({world - 1, 0.2, 1.0});
  if (preset == "slow_compute") all.push_back({world - 1, 1.0, 2.0});
  all.insert(all.end(), stragglers.begin(), stragglers.end());  // later entries win
  if (!all.empty()) {
    m.bandwidth_scale.assign(world, 1.0);
    m.slowdown.assign(world, 1.0);
    for (const auto& st : all) {
      if (st.rank < 0 || st.rank >= world) continue;  // world 1 with a preset: nobody to slow
      m.bandwidth_scale[st.rank] = st.bandwidth;
      m.slowdown[st.rank] = st.slowdown;
    }
  }
  m.validate(world);
  return m;
}

void OptimSection::resolve() {
  if (gpa_from_diloco.H <= 0) return;
  require(gpa_from_diloco.mu > 0 && gpa_from_diloco.mu < 1, "optim.gpa_from_diloco.mu", "must be in (0, 1)");
  const OptimSection defaults;
  const double mx = std::pow(gpa_from_diloco.mu, 1.0 / static_cast<double>(gpa_from_diloco.H));
  const double my = gpa_from_diloco.mu;
  // A value equal to the default or to the derived one was not set against the helper.
  require(mu_x == defaults.mu_x || mu_x == mx, "optim.mu_x",
          fmt::format("{} conflicts with optim.gpa_from_diloco, which sets it to {}; set only one of them", mu_x, mx));
  require(mu_y == defaults.mu_y || mu_y == my, "optim.mu_y",
          fmt::format("{} conflicts with optim.gpa_from_diloco, which sets it to {}; set only one of them", mu_y, my));
  mu_x = mx;
  mu_y = my;
}

namespace {

// inf or nan is never a setting (optim.lr = inf used to train on NaN).
void require_finite_numbers(const JobConfig& job) {
  job.for_each_section([](const char* section, auto& s) {
    const_cast<std::decay_t<decltype(s)>&>(s).visit([&](const char* key, auto& value, const char*) {
      if constexpr (std::is_same_v<std::decay_t<decltype(value)>, double>)
        require(std::isfinite(value), std::string(section) + "." + key, "must be a finite number");
    });
  });
}

void validate_model(const ModelSection& model) {
  for (auto [k, v] : {std::pair{"dim", model.dim}, {"n_layers", model.n_layers}, {"n_heads", model.n_heads},
                      {"n_kv_heads", model.n_kv_heads}, {"max_seq_len", model.max_seq_len}})
    require(v >= 0, std::string("model.") + k, "must be >= 0 (0 = preset's)");
  require(model.rope_theta > 0, "model.rope_theta", "must be positive");
  require(model.norm_eps >= 0 && model.norm_eps < 1, "model.norm_eps", "must be in [0, 1) (0 = preset's)");
  require(model.init_std > 0, "model.init_std", "must be positive");
}

// `max_seq`: the model's max_seq_len, which a sample must fit in.
void validate_data(const DataSection& data, int64_t max_seq) {
  require(!data.dir.empty(), "data.dir", "must name a dataset directory");
  require(data.seq_len > 0, "data.seq_len", "must be positive");
  require(data.seq_len <= max_seq, "data.seq_len",
          fmt::format("{} exceeds the model's max_seq_len {} (raise model.max_seq_len or lower data.seq_len)",
                      data.seq_len, max_seq));
  require(data.batch_size > 0, "data.batch_size", "must be positive");
  require(data.val_batches > 0, "data.val_batches", "must be positive");
  require(data.vocab_size >= 0 && data.vocab_size <= 65536, "data.vocab_size", "must be in [0, 65536]");
}

void validate_optim(const OptimSection& optim) {
  gpa_options(optim).validate();  // mu_x, mu_y: whichever optimizer, as they are recorded in run.json
  require(optim.gpa_from_diloco.H >= 0, "optim.gpa_from_diloco.H", "must be >= 0 (0 = off)");
  require(optim.gpa_from_diloco.H == 0 || optimizer(optim.name).uses_mu, "optim.gpa_from_diloco",
          "applies to optim.name = " + optimizer_names(&OptimizerEntry::uses_mu) + " only, not '" + optim.name.str() + "'");
  require(optim.lr > 0, "optim.lr", "must be positive");
  require(optim.beta1 >= 0 && optim.beta1 < 1, "optim.beta1", "must be in [0, 1)");
  require(optim.beta2 >= 0 && optim.beta2 < 1, "optim.beta2", "must be in [0, 1)");
  require(optim.eps > 0, "optim.eps", "must be positive");
  require(optim.weight_decay >= 0, "optim.weight_decay", "must be >= 0");
  require(optim.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (0 disables clipping)");
  require(optim.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0");
  require(optim.min_lr_ratio >= 0 && optim.min_lr_ratio <= 1, "optim.min_lr_ratio", "must be in [0, 1]");
}

// `data`: train.streams splits its batches.
void validate_train(const TrainSection& train, const DataSection& data) {
  require(train.steps > 0, "train.steps", "must be positive");
  require(train.stop_at >= 0 && train.stop_at <= train.steps, "train.stop_at", "must be in [0, train.steps]");
  require(train.eval_every >= 0, "train.eval_every", "must be >= 0");
  require(train.checkpoint_every >= 0, "train.checkpoint_every", "must be >= 0");
  require(train.log_every > 0, "train.log_every", "must be positive");
  require(train.threads >= 0, "train.threads", "must be >= 0");
  require(train.blas_threads >= 0, "train.blas_threads", "must be >= 0");
  require(train.streams >= 0 && train.streams <= 64, "train.streams", "must be in [0, 64] (0 = auto)");
  require(train.streams == 0 || data.batch_size % train.streams == 0, "train.streams",
          fmt::format("must divide data.batch_size ({}) into equal row groups", data.batch_size));
  require(train.streams <= 1 || train.device == "cpu", "train.streams",
          "splits a batch over CPU threads: keep it 1 on a GPU, which parallelizes each operation itself");
  require(!train.run_dir.empty(), "train.run_dir", "must not be empty");
  require(train.divergence_factor == 0 || train.divergence_factor > 1, "train.divergence_factor",
          "must be 0 (never stop) or above 1 (a multiple of ln(vocab))");
}

// Which failures a run can carry out: [faults] and elastic runs against the cluster, the algorithm
// and the checkpoints.
void validate_faults_and_elastic(const JobConfig& job) {
  const FaultsSection& faults = job.faults;
  const ClusterSection& cluster = job.cluster;
  const algo::AlgoConfig& algo = job.algo;
  require(!faults.any() || cluster.elastic || faults.restart_all, "faults",
          "injects failures into elastic runs (cluster.elastic = true) or prices stop-and-resume (faults.restart_all = "
          "true); without either, one death stops every worker");
  require(algo.overlap_steps == 0 || (!cluster.elastic && !faults.any() && !faults.restart_all), "algo.overlap_steps",
          "overlapped rounds are built for a fixed membership without [faults]: set algo.overlap_steps = 0, or "
          "cluster.elastic = false and remove [faults]");
  // H_i is priced over the fixed graph of every worker (algo/local_steps.hpp), while an elastic
  // round mixes over its view's members: a dead partner would be priced as a live one.
  require(algo.h_policy != "time_budget" || (!cluster.elastic && !faults.any()), "algo.h_policy",
          "time_budget prices each worker's exchanges over the fixed graph of every worker; an elastic run's rounds "
          "follow its view, which that pricing does not see yet: set algo.h_policy = \"fixed\", or cluster.elastic = "
          "false and remove [faults]");
  require(!cluster.join || (cluster.elastic && cluster.backend == "gloo"), "cluster.join",
          "joins a rank to a running elastic Gloo job: set cluster.elastic = true and cluster.backend = \"gloo\" (an "
          "in-process run adds workers by resuming on more, cluster.workers)");
  require(!(faults.restart_all && cluster.elastic), "faults.restart_all",
          "prices the stop-and-resume an elastic run avoids: set cluster.elastic = false, or faults.restart_all = false");
  require(!faults.restart_all || cluster.backend == "inproc", "faults.restart_all",
          "prices restarts on the in-process cluster's virtual clock: set cluster.backend = \"inproc\"");
  require(faults.restart_delay_s >= 0, "faults.restart_delay_s", "must be >= 0");
  {
    const bool rounds = algo::algorithm(algo.name).has_rounds;
    require(!faults.restart_all || !rounds || job.train.checkpoint_every % algo.H == 0, "train.checkpoint_every",
            fmt::format("must be a multiple of algo.H ({}) with faults.restart_all: a checkpoint is taken at a round's end",
                        algo.H));
  }
  require(!cluster.elastic || cluster.backend != "nccl", "cluster.elastic",
          "is built for the in-process cluster and Gloo so far: set cluster.backend = \"gloo\" or \"inproc\"");
  require(!cluster.elastic || cluster.backend == "inproc" || !faults.any(), "faults",
          "are simulated on the in-process cluster's virtual clock; over Gloo, failures are real (kill a rank: gasloc "
          "launch --elastic restarts it)");
  require(!cluster.elastic || !algo::algorithm(algo.name).single_worker, "cluster.elastic",
          "needs several workers: algo.name = '" + algo.name.str() + "' trains one");
  require(faults.churn_mean_rounds >= 0, "faults.churn_mean_rounds", "must be >= 0 (0 = no churn)");
  require(faults.churn_restart_rounds >= 0, "faults.churn_restart_rounds", "must be >= 0 (0 = never rejoin)");
  require(faults.churn_seed >= 0, "faults.churn_seed", "must be >= 0");
  require(faults.churn_mtbf_s >= 0, "faults.churn_mtbf_s", "must be >= 0 (0 = no churn by time)");
  require(faults.churn_mtbf_s == 0 || faults.churn_mean_rounds == 0, "faults.churn_mtbf_s",
          "churn is given in rounds (churn_mean_rounds) or in seconds (churn_mtbf_s), not both");
  require(faults.churn_restart_s >= 0, "faults.churn_restart_s", "must be >= 0 (0 = never rejoin)");
  const int world = cluster.backend == "inproc" ? static_cast<int>(cluster.workers) : 0;
  for (size_t i = 0; i < faults.poison.size(); ++i) {
    const FaultPoison& p = faults.poison[i];
    const std::string key = fmt::format("faults.poison[{}]", i);
    require(p.worker >= 0 && (world == 0 || p.worker < world), key + ".worker",
            world > 0 ? fmt::format("must be a worker id in [0, {}), got {}", world, p.worker)
                      : fmt::format("must be a worker id >= 0, got {}", p.worker));
    require(p.round >= 0, key + ".round", fmt::format("must be a round >= 0, got {}", p.round));
    require(std::isfinite(p.factor) && p.factor != 1.0, key + ".factor",
            fmt::format("must be finite and not 1 (1 sends the message unchanged), got {}", p.factor));
    const algo::AlgorithmEntry& a = algo::algorithm(algo.name);
    require(a.sends_parameters && !a.sends_gradients, key,
            "poisons parameter messages (" + algo::algorithm_names(&algo::AlgorithmEntry::sends_parameters) + "); '" +
                algo.name.str() + "' sends none");
    require(algo.compression == "none", key, "compressed rounds are not poisoned: set algo.compression = none");
  }
  for (const auto& k : faults.kill) {
    require((k.round >= 0) != (k.time_s >= 0), "faults.kill",
            fmt::format("worker {}'s entry needs a round or a time_s (>= 0), not both", k.id));
    require(k.restart_after_s >= 0, "faults.kill", fmt::format("worker {}'s restart_after_s must be >= 0", k.id));
    require(k.restart_after_s == 0 || k.restart_after_rounds == 0, "faults.kill",
            fmt::format("worker {}'s restart is given in rounds or in seconds, not both", k.id));
  }
}

}  // namespace

void JobConfig::validate() const {
  require_finite_numbers(*this);
  const int64_t max_seq = model.resolve(0).max_seq_len;  // preset known and shape consistent
  validate_model(model);
  validate_data(data, max_seq);
  validate_optim(optim);
  validate_train(train, data);
  require(cluster.workers >= 1 && cluster.workers <= 4096, "cluster.workers", "must be in [1, 4096]");
  require(cluster.timeout_s > 0 && cluster.timeout_s <= kMaxTimeoutS, "cluster.timeout_s",
          fmt::format("must be in (0, {:.0f}] seconds (a week), got {}", kMaxTimeoutS, cluster.timeout_s));
  require(cluster.compute_slots >= 0, "cluster.compute_slots", "must be >= 0 (0: the cores, from 65 in-process workers up)");
  // Under gloo and nccl the world size is known only once the processes meet (WORLD_SIZE).
  const int world = cluster.backend == "inproc" ? static_cast<int>(cluster.workers) : 0;
  algo.validate(world);
  network.validate(world);
  require(cluster.heartbeat_timeout_s > 0, "cluster.heartbeat_timeout_s", "must be positive");
  // Over processes it is a real judge of real beats: at least four of them.
  if (cluster.elastic && cluster.backend != "inproc")
    comm::check_heartbeat_timeout(cluster.heartbeat_timeout_s, "config key 'cluster.heartbeat_timeout_s':");
  validate_faults_and_elastic(*this);
  // Ids inside the world, no impossible schedule. Faults in seconds become rounds only once the
  // model's size prices a round: checked at the run's start, before any step.
  if (world > 0 && !faults.by_time()) membership(world);
}

bool FaultsSection::by_time() const {
  return churn_mtbf_s > 0 || std::any_of(kill.begin(), kill.end(), [](const FaultKill& k) { return k.time_s >= 0; });
}

namespace {
// A time on an unimpeded worker's clock as rounds: the round in progress then (floor), and a
// delay as whole rounds, at least one (ceil).
int64_t round_at(double t, double round_s) { return static_cast<int64_t>(std::floor(t / round_s)); }
int64_t rounds_after(double delay_s, double round_s) {
  return delay_s <= 0 ? 0 : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(delay_s / round_s - 1e-9)));
}
}  // namespace

std::optional<algo::Membership> JobConfig::membership(int world, double round_s, algo::Arrivals arrivals) const {
  if (!cluster.elastic && !faults.restart_all) return std::nullopt;
  if (faults.by_time() && !(round_s > 0))
    throw ConfigError("faults: a fault given in seconds needs a round that takes virtual time",
                      "set network.step_time_s > 0, or give the faults in rounds (faults.kill round, churn_mean_rounds)");
  std::vector<algo::FaultEvent> events;
  for (const auto& k : faults.kill)
    events.push_back({static_cast<int>(k.id), k.time_s >= 0 ? round_at(k.time_s, round_s) : k.round,
                      k.restart_after_s > 0 ? rounds_after(k.restart_after_s, round_s) : k.restart_after_rounds});
  const algo::Churn churn = faults.churn_mtbf_s > 0
                                ? algo::Churn{faults.churn_mtbf_s / round_s, rounds_after(faults.churn_restart_s, round_s),
                                              static_cast<uint64_t>(faults.churn_seed)}
                                : algo::Churn{faults.churn_mean_rounds, faults.churn_restart_rounds,
                                              static_cast<uint64_t>(faults.churn_seed)};
  const bool rounds = algo::algorithm(algo.name).has_rounds;
  const int64_t steps_per_round = rounds ? std::max<int64_t>(algo.H, 1) : 1;
  std::optional<algo::RestartAll> restart;
  if (faults.restart_all) restart = algo::RestartAll{faults.restart_delay_s, train.checkpoint_every / steps_per_round};
  return algo::Membership(world, std::move(events), churn, train.steps / steps_per_round + 1, restart, std::move(arrivals));
}

nlohmann::json JobConfig::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for_each_section([&](const char* name, const auto& s) { j[name] = config::to_json(s); });
  return j;
}

JobConfig job_from_json(const nlohmann::json& doc, const std::vector<std::string>& overrides) {
  JobConfig job;
  if (!doc.is_object()) throw ConfigError("the job file must be a TOML document of [sections]");
  std::string names;
  job.for_each_section([&](const char* name, auto&) { names += (names.empty() ? "" : ", ") + std::string(name); });
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    bool found = false;
    job.for_each_section([&](const char* name, auto& s) {
      if (it.key() != name) return;
      config::apply_table(s, name, it.value());
      found = true;
    });
    if (!found) throw ConfigError("unknown config section '" + it.key() + "'", "valid sections: " + names);
  }
  for (const auto& ov : overrides) {
    const auto eq = ov.find('=');
    const auto dot = ov.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot > eq)
      throw ConfigError("bad override '" + ov + "'", "write --set section.key=value, e.g. --set optim.lr=1e-3");
    const std::string section = ov.substr(0, dot), key = ov.substr(dot + 1, eq - dot - 1), value = ov.substr(eq + 1);
    bool section_found = false, key_found = false;
    job.for_each_section([&](const char* name, auto& s) {
      if (section != name) return;
      section_found = true;
      key_found = config::apply_override(s, section, key, value);
    });
    if (!section_found) throw ConfigError("unknown config section '" + section + "' in --set " + ov, "valid sections: " + names);
    if (!key_found) {
      std::string keys;
      job.for_each_section([&](const char* name, auto& s) {
        if (section == name)
          for (const auto& f : config::describe(s, name)) keys += (keys.empty() ? "" : ", ") + f.key;
      });
      throw ConfigError("unknown config key '" + section + "." + key + "' in --set " + ov, "valid keys: " + keys);
    }
  }
  job.optim.resolve();
  job.network.resolve();
  job.validate();
  return job;
}

void check_rounds_fit(const JobConfig& job) {
  // A round needs H local steps: with fewer steps in the whole run it would end, with exit 0, before
  // its first round, having trained its workers apart and never communicated.
  require(!algo::algorithm(job.algo.name).has_rounds || job.algo.H <= job.train.steps, "algo.H",
          fmt::format("{} local steps per round exceed train.steps = {}: the run would end before its first round, "
                      "without any communication; lower algo.H or raise train.steps",
                      job.algo.H, job.train.steps));
}

JobConfig load_job(const std::string& path, const std::vector<std::string>& overrides) {
  return job_from_json(path.empty() ? nlohmann::json::object() : config::parse_toml_file(path), overrides);
}

int64_t planned_streams(int64_t setting, const std::string& device, int64_t batch_size, int world, unsigned cores) {
  if (setting > 0) return setting;
  if (world != 1 || device != "cpu") return 1;
  for (int64_t n = std::min<int64_t>({static_cast<int64_t>(cores), batch_size, 64}); n > 1; --n)
    if (batch_size % n == 0) return n;
  return 1;
}

std::string describe_job() {
  JobConfig job;
  std::string out;
  job.for_each_section([&](const char* name, auto& s) {
    out += fmt::format("[{}]\n", name);
    for (const auto& f : config::describe(s, name))
      out += fmt::format("  {:<30} {:<7} {:<16} {}\n", f.key, f.type, f.value.dump(), f.doc);
  });
  return out;
}

}  // namespace gasloc::train
