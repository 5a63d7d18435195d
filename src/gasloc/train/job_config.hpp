// The job file: one typed section per component (see core/config.hpp for the mechanism).
// Every field has its default and a one-line doc; `gasloc train --help-config` prints them.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gasloc/algo/algo_config.hpp"
#include "gasloc/algo/membership.hpp"
#include "gasloc/comm/network_model.hpp"
#include "gasloc/core/choice.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/optim/schedule.hpp"
#include "gasloc/train/optimizers.hpp"

namespace gasloc::train {

// The values of the enumerated settings defined in this layer (job_config.cpp); the others come
// from the layer that gives them meaning (algo/registry.hpp, optimizers.hpp, model presets, ...).
const config::Choices& sampling_choices();
const config::Choices& device_choices();
const config::Choices& dtype_choices();
const config::Choices& decay_on_choices();
const config::Choices& backend_choices();
const config::Choices& scenario_choices();
const config::Choices& allreduce_pattern_choices();
const config::Choices& eval_model_choices();

struct ModelSection {
  config::Choice preset{model::LlamaConfig::preset_choices(), "tiny"};
  int64_t dim = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t multiple_of = 0;
  double ffn_dim_multiplier = 0.0;
  double rope_theta = 500000.0;
  double norm_eps = 0.0;
  int64_t max_seq_len = 0;
  bool tie_embeddings = false;
  double init_std = 0.02;
  bool fused = true;
  std::string init_from;

  template <class V>
  void visit(V&& v) {
    v("preset", preset, "model shape preset");
    v("dim", dim, "residual width C (0 = preset's)");
    v("n_layers", n_layers, "transformer blocks (0 = preset's)");
    v("n_heads", n_heads, "query heads (0 = preset's)");
    v("n_kv_heads", n_kv_heads, "key/value heads for GQA (0 = preset's)");
    v("multiple_of", multiple_of, "SwiGLU hidden size rounding (0 = preset's)");
    v("ffn_dim_multiplier", ffn_dim_multiplier, "SwiGLU hidden size factor (0 = preset's)");
    v("rope_theta", rope_theta, "rotary embedding base");
    v("norm_eps", norm_eps, "RMSNorm epsilon (0 = preset's, 1e-5)");
    v("max_seq_len", max_seq_len, "longest sequence the model accepts (0 = preset's)");
    v("tie_embeddings", tie_embeddings, "share the input embedding and the output head");
    v("init_std", init_std, "std of the normal init; residual outputs use init_std/sqrt(2*n_layers)");
    v("fused", fused, "fused fp32 CPU kernels (false: the reference ops; bf16 and CUDA always use those)");
    v("init_from", init_from, "start from these weights: a directory written by `gasloc export` (HF safetensors)");
  }
  // The preset with this section's overrides applied and the dataset's vocabulary.
  model::LlamaConfig resolve(int64_t vocab_size) const;
};

// `gasloc train --init-from DIR`: the settings that continue pretraining a Hugging Face Llama
// checkpoint (DIR/config.json and DIR/model.safetensors, as transformers' save_pretrained or
// `gasloc export` write them): its shape, norm epsilon, rotary base and vocabulary, and
// model.init_from = DIR, as `section.key=value` overrides. CheckpointError naming the file for a
// config the model cannot represent (model::read_hf_config).
std::vector<std::string> hf_init_settings(const std::filesystem::path& dir);

struct DataSection {
  std::string dir = "data/default";
  int64_t seq_len = 128;
  int64_t batch_size = 16;
  int64_t val_batches = 8;
  int64_t vocab_size = 0;
  config::Choice sampling{sampling_choices(), "shared"};
  bool verify_shards = false;

  template <class V>
  void visit(V&& v) {
    v("dir", dir, "prepared dataset directory (gasloc prepare) or a directory of llm.c shards");
    v("seq_len", seq_len, "tokens per training sequence T");
    v("batch_size", batch_size, "sequences per inner step and worker B");
    v("val_batches", val_batches, "batches in the fixed validation set");
    v("vocab_size", vocab_size, "vocabulary size override (0 = from dataset.json; llm.c shards: 50257)");
    v("sampling", sampling, "what each worker draws from");
    v("verify_shards", verify_shards,
      "check every shard's sha256 against dataset.json at start (reads all the data; sizes are always checked)");
  }
};

// optim.gpa_from_diloco = { H = 32, mu = 0.9 }: GPA settings equivalent to DiLoCo's averaging
// horizon, mu_x = mu^(1/H) and mu_y = mu. H = 0 leaves mu_x and mu_y as given.
struct GpaFromDiloco {
  int64_t H = 0;
  double mu = 0.9;
  bool operator==(const GpaFromDiloco&) const = default;
  template <class V>
  void visit(V&& v) {
    v("H", H, "DiLoCo's inner steps per round (0 = off)");
    v("mu", mu, "DiLoCo's outer momentum, in (0, 1)");
  }
};
// Inline tables of the job file (strict: unknown keys and mistyped values throw ConfigError).
void to_json(nlohmann::json& j, const GpaFromDiloco& g);
void from_json(const nlohmann::json& j, GpaFromDiloco& g);

struct OptimSection {
  config::Choice name{optimizer_choices(), "adamw"};
  double lr = 3e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  int64_t warmup_steps = 30;
  config::Choice decay{optim::decay_choices(), "cosine"};
  double min_lr_ratio = 0.1;
  double mu_y = 0.7;
  double mu_x = 0.9967;
  config::Choice decay_on{decay_on_choices(), "z"};
  GpaFromDiloco gpa_from_diloco;

  template <class V>
  void visit(V&& v) {
    const Docs& d = docs();
    v("name", name, "inner optimizer");
    v("lr", lr, "peak learning rate");
    v("beta1", beta1, "Adam first-moment decay; schedule_free keeps no first moment: y = beta1*x + (1-beta1)*z");
    v("beta2", beta2, "Adam second-moment decay");
    v("eps", eps, "Adam epsilon");
    v("weight_decay", weight_decay, "decoupled weight decay, applied to matrices only");
    v("grad_clip", grad_clip, "max global gradient L2 norm (0 = no clipping)");
    v("warmup_steps", warmup_steps, "linear warmup steps");
    v("decay", decay, "decay after warmup");
    v("min_lr_ratio", min_lr_ratio, "final lr as a fraction of lr");
    v("mu_y", mu_y, d.mu_y.c_str());
    v("mu_x", mu_x, d.mu_x.c_str());
    v("decay_on", decay_on, d.decay_on.c_str());
    v("gpa_from_diloco", gpa_from_diloco, d.gpa_from_diloco.c_str());
  }
  // Applies gpa_from_diloco to mu_x and mu_y; throws if they were also set to other values.
  void resolve();

 private:
  // The docs that name the optimizers a setting applies to, from the registry.
  struct Docs {
    std::string mu_y, mu_x, decay_on, gpa_from_diloco;
  };
  static const Docs& docs();
};

struct TrainSection {
  int64_t steps = 300;
  int64_t stop_at = 0;
  int64_t eval_every = 50;
  config::Choice eval_model{eval_model_choices(), "average"};
  int64_t checkpoint_every = 100;
  int64_t log_every = 10;
  uint64_t seed = 1337;
  config::Choice device{device_choices(), "cpu"};
  config::Choice dtype{dtype_choices(), "fp32"};
  int64_t threads = 0;
  int64_t blas_threads = 0;
  int64_t streams = 0;
  std::string run_dir = "runs/default";
  double divergence_factor = 2.0;

  template <class V>
  void visit(V&& v) {
    v("steps", steps, "total inner steps (sets the LR schedule)");
    v("stop_at", stop_at, "stop with a checkpoint after this step, to resume later (0 = run to steps)");
    v("eval_every", eval_every, "validation every N steps (0 = only at the end)");
    v("eval_model", eval_model, "which model an evaluation measures");
    v("checkpoint_every", checkpoint_every, "checkpoint every N steps (0 = only at the end)");
    v("log_every", log_every, "train metrics every N steps");
    v("seed", seed, "base seed: model init and data (worker r samples with seed + r)");
    v("device", device, "where the workers compute");
    v("dtype", dtype, "compute dtype");
    v("threads", threads, "LibTorch intra-op threads (0 = its default; OpenBLAS threads its matmuls itself)");
    v("blas_threads", blas_threads,
      "OpenBLAS threads per product (0 = 1 when workers are threads of one process, cores / LOCAL_WORLD_SIZE when "
      "processes of the job share a host, else its default)");
    v("streams", streams,
      "split each worker's batch into this many row groups computed on threads of their own, one BLAS thread each (CPU; "
      "must divide data.batch_size; other last bits than 1, deterministic); 0 = auto: one per core for a single worker "
      "training alone on a CPU, else 1");
    v("run_dir", run_dir, "where run.json, metrics.jsonl and checkpoints go");
    v("divergence_factor", divergence_factor,
      "stop the run when a worker's training loss exceeds this many times ln(vocab), the loss of a uniform guess (0 = never)");
  }
};


// cluster.timeout_s's (and gasloc launch --timeout's) largest value, a week: Gloo counts a timeout
// in int64 milliseconds, and 1e308 s passed the check and then failed deep in a collective.
inline constexpr double kMaxTimeoutS = 7 * 24 * 3600.0;

struct ClusterSection {
  int64_t workers = 1;
  config::Choice backend{backend_choices(), "inproc"};
  double timeout_s = 300.0;
  bool store_all_interfaces = false;
  bool elastic = false;
  double heartbeat_timeout_s = 10.0;
  bool join = false;
  std::string secret_file;
  int64_t compute_slots = 0;

  template <class V>
  void visit(V&& v) {
    v("workers", workers, "workers of the in-process cluster (gloo, nccl: the world size comes from WORLD_SIZE)");
    v("compute_slots", compute_slots,
      "inproc: at most this many workers compute at once, the one furthest behind on its clock first (0: the cores, "
      "from 65 workers up; below that every worker computes when it likes)");
    v("backend", backend, "how the workers talk");
    v("timeout_s", timeout_s,
      "seconds any rendezvous-store call or collective waits for a peer before failing with an error naming it");
    v("store_all_interfaces", store_all_interfaces,
      "ranks started by hand: rank 0's rendezvous store listens on every interface, not only MASTER_ADDR's");
    v("elastic", elastic,
      "a dead worker leaves the view and a restarted one rejoins, without stopping the others (inproc, or gloo under "
      "gasloc launch --elastic)");
    v("heartbeat_timeout_s", heartbeat_timeout_s,
      "elastic: seconds after a death until it is detected; a dead peer's partners wait this long (virtual clock)");
    v("join", join,
      "elastic gloo: this rank joins the running job with a running worker's state instead of starting or resuming "
      "one (gasloc launch --elastic sets it for ranks beyond the workers a resumed run was saved by)");
    v("secret_file", secret_file,
      "gloo, nccl: the job's secret (gasloc secret --out FILE; mode 0600): only its holders use the job's rendezvous "
      "store (empty = none)");
  }
};

// One scheduled failure: faults.kill = [{ id = 3, round = 4, restart_after_rounds = 2 }].
// Or by time: faults.kill = [{ id = 3, time_s = 120, restart_after_s = 60 }], in seconds of an
// unimpeded worker's virtual clock (docs/training.md, "Faults by time").
struct FaultKill {
  int64_t id = -1;
  int64_t round = -1;
  int64_t restart_after_rounds = 0;
  double time_s = -1;
  double restart_after_s = 0;
  bool operator==(const FaultKill&) const = default;
  template <class V>
  void visit(V&& v) {
    v("id", id, "the worker that dies (its launch rank)");
    v("round", round, "it dies at this round's merge (rounds count from 0), after computing its local steps");
    v("restart_after_rounds", restart_after_rounds, "it rejoins this many rounds later, healed from a donor (0 = never)");
    v("time_s", time_s, "instead of round: it dies at the merge of the round in progress at this virtual time");
    v("restart_after_s", restart_after_s, "instead of restart_after_rounds: it rejoins after this many seconds (0 = never)");
  }
};
void to_json(nlohmann::json& j, const FaultKill& k);
void from_json(const nlohmann::json& j, FaultKill& k);

// A poisoned worker: faults.poison = [{ worker = 2, round = 3, factor = 100.0 }]. At that round's
// exchange it sends its parameters times factor (its own copy stays as it is): a bug or an attack
// that algo.clip_peers bounds (docs/communication.md, "Poisoned peers").
struct FaultPoison {
  int64_t worker = -1;
  int64_t round = -1;
  double factor = 100.0;
  bool operator==(const FaultPoison&) const = default;
  template <class V>
  void visit(V&& v) {
    v("worker", worker, "the worker whose message is poisoned (its launch rank)");
    v("round", round, "the round whose message it is (rounds count from 0; a step for dadam)");
    v("factor", factor, "its sent parameters are multiplied by this (finite, not 1)");
  }
};
void to_json(nlohmann::json& j, const FaultPoison& p);
void from_json(const nlohmann::json& j, FaultPoison& p);

// Faults injected into an elastic in-process run (docs/training.md, Elastic runs): deterministic,
// given by round, so that a run with faults is as reproducible as one without.
struct FaultsSection {
  std::vector<FaultKill> kill;
  std::vector<FaultPoison> poison;
  double churn_mean_rounds = 0.0;
  int64_t churn_restart_rounds = 1;
  double churn_mtbf_s = 0.0;
  double churn_restart_s = 0.0;
  int64_t churn_seed = 0;
  bool restart_all = false;
  double restart_delay_s = 30.0;

  template <class V>
  void visit(V&& v) {
    v("kill", kill, "scheduled deaths: [{ id = 3, round = 4, restart_after_rounds = 2 }]");
    v("poison", poison, "poisoned messages (any run, no cluster.elastic needed): [{ worker = 2, round = 3, factor = 100.0 }]");
    v("churn_mean_rounds", churn_mean_rounds, "random churn: each worker dies after a mean of this many rounds (0 = none)");
    v("churn_restart_rounds", churn_restart_rounds, "random churn: a dead worker rejoins this many rounds later (0 = never)");
    v("churn_mtbf_s", churn_mtbf_s, "random churn by time: each worker's mean seconds between failures (instead of churn_mean_rounds)");
    v("churn_restart_s", churn_restart_s, "random churn by time: a dead worker rejoins after this many seconds (instead of churn_restart_rounds)");
    v("churn_seed", churn_seed, "random churn: the seed of the failure times");
    v("restart_all", restart_all,
      "instead of an elastic run: price stop-and-resume, every worker restarting from the last checkpoint at each failure");
    v("restart_delay_s", restart_delay_s, "restart_all: seconds to restart the job (processes, rendezvous, loading)");
  }
  // Failures that change the membership (faults.poison does not).
  bool any() const { return !kill.empty() || churn_mean_rounds > 0 || churn_mtbf_s > 0; }
  // faults.poison as the synchronizer takes it.
  std::vector<algo::Poison> poisons() const;
  // Whether a fault is given in seconds: the membership then needs the round's duration.
  bool by_time() const;
};

// One slow worker of a scenario: network.stragglers = [{ rank = 3, bandwidth = 0.1 }].
struct Straggler {
  int64_t rank = -1;
  double bandwidth = 1.0;
  double slowdown = 1.0;
  bool operator==(const Straggler&) const = default;
  template <class V>
  void visit(V&& v) {
    v("rank", rank, "the straggling worker");
    v("bandwidth", bandwidth, "its link as a fraction of network.bandwidth_gbit (> 0)");
    v("slowdown", slowdown, "factor on network.step_time_s for its inner steps (> 0; 2 = half speed)");
  }
};
void to_json(nlohmann::json& j, const Straggler& s);
void from_json(const nlohmann::json& j, Straggler& s);

// The cluster's compute and links (docs/design.md section 5): the in-process cluster's virtual clock
// prices every step and message with it, algo.h_policy = "time_budget" plans with it, and with
// throttle_gloo real Gloo links are held to it.
struct NetworkSection {
  config::Choice preset{scenario_choices(), "homogeneous"};
  double step_time_s = 0.1;
  double bandwidth_gbit = 1.0;
  double latency_s = 1e-3;
  config::Choice allreduce{allreduce_pattern_choices(), "ring"};
  std::vector<double> latencies_s;
  std::vector<int64_t> regions;
  double inter_region_latency_s = 0.0;
  double inter_region_bandwidth_gbit = 0.0;
  std::vector<Straggler> stragglers;
  std::string simulated_model;
  int64_t simulated_model_bytes = 0;
  bool throttle_gloo = false;
  // Not keys. The simulated model's bytes a parameter (resolve()); and, set by the trainer for
  // compressed rounds, this run's parameters times that, so that a message is priced by its size
  // (comm::NetworkModel::parameter_message_bytes).
  int64_t simulated_element_bytes = 4;
  int64_t parameter_message_bytes = 0;

  template <class V>
  void visit(V&& v) {
    v("preset", preset, "the scenario");
    v("step_time_s", step_time_s, "compute seconds of one inner step on an unimpeded worker");
    v("bandwidth_gbit", bandwidth_gbit, "each worker's link in Gbit/s, full duplex");
    v("latency_s", latency_s, "seconds per message");
    v("allreduce", allreduce, "how the virtual clock prices all-reduces: ring (2(n-1) latencies) or tree (2 ceil(log2 n)); the bytes are the same");
    v("latencies_s", latencies_s, "per-worker link latency in seconds, one entry per worker (empty: latency_s for all); a link takes the larger of its ends'");
    v("regions", regions, "region sizes: [256, 768] puts workers 0..255 in region 0 and 256..1023 in region 1 (empty: one region); they must add up to cluster.workers");
    v("inter_region_latency_s", inter_region_latency_s, "with regions: a link between regions has at least this latency");
    v("inter_region_bandwidth_gbit", inter_region_bandwidth_gbit, "with regions: a link between regions carries at most this many Gbit/s (0 = no cap beyond its ends')");
    v("stragglers", stragglers, "per-rank overrides: [{ rank = 3, bandwidth = 0.1, slowdown = 1.0 }] (win over the preset)");
    v("simulated_model", simulated_model, "price messages as this model: PRESET:DTYPE, e.g. \"134m:bf16\" (sets simulated_model_bytes)");
    v("simulated_model_bytes", simulated_model_bytes, "price every parameter message as this many bytes (0 = actual size)");
    v("throttle_gloo", throttle_gloo, "gloo and nccl backends: hold each rank's real link to its bandwidth here (token bucket)");
  }
  // simulated_model -> simulated_model_bytes; throws on a conflict or a bad spec.
  void resolve();
  // Throws ConfigError naming the key; world = 0 skips the checks that need the world size.
  void validate(int world) const;
  // The cost model for `world` workers: the preset, then the stragglers.
  comm::NetworkModel model(int world) const;
};

struct JobConfig {
  ModelSection model;
  DataSection data;
  OptimSection optim;
  TrainSection train;
  algo::AlgoConfig algo;
  ClusterSection cluster;
  NetworkSection network;
  FaultsSection faults;

  // Calls f(section_name, section) for every section.
  template <class F>
  void for_each_section(F&& f) {
    f("model", model);
    f("data", data);
    f("optim", optim);
    f("train", train);
    f("algo", algo);
    f("cluster", cluster);
    f("network", network);
    f("faults", faults);
  }
  template <class F>
  void for_each_section(F&& f) const { const_cast<JobConfig*>(this)->for_each_section(f); }

  // Throws ConfigError naming the first invalid key.
  void validate() const;
  nlohmann::json to_json() const;
  // cluster.elastic: the membership of `world` workers under [faults] (ConfigError naming the
  // entry that cannot happen); nullopt for a run that is not elastic.
  // `round_s`: the round time of an unimpeded worker on the virtual clock (round_seconds), which
  // turns faults given in seconds into rounds; unused when none is.
  // `arrivals`: ids beyond the workers a resumed run was saved by, and the round they join at.
  std::optional<algo::Membership> membership(int world, double round_s = 0, algo::Arrivals arrivals = {}) const;
};

// Builds a job from parsed JSON (from TOML), then applies "section.key=value" overrides, then
// validates. Unknown sections and keys are errors.
JobConfig job_from_json(const nlohmann::json& doc, const std::vector<std::string>& overrides);
// Loads a TOML job file (or only defaults when path is empty) with overrides.
JobConfig load_job(const std::string& path, const std::vector<std::string>& overrides);

// A training run's own check (run_training), not every job's: algo.H within train.steps for the
// algorithms of rounds. A consensus study's job trains nothing, so its steps do not bound H.
// ConfigError naming algo.H.
void check_rounds_fit(const JobConfig& job);
// A table of every key, its type, default and doc.
std::string describe_job();

// train.streams as a job runs it (its thread plan). A setting > 0 is kept. Auto (0) gives a
// single worker training alone (world 1) on a CPU one stream per core, the largest count <= cores
// that divides the batch: alone, OpenBLAS splitting each small product over the cores leaves them
// mostly waiting (docs/performance.md), while row groups keep every core on its own products and
// element-wise passes. Every other job gets 1: in-process workers are the threads, and processes
// sharing a host would oversubscribe it.
int64_t planned_streams(int64_t setting, const std::string& device, int64_t batch_size, int world, unsigned cores);

}  // namespace gasloc::train
