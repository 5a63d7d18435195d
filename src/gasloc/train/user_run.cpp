#include "gasloc/train/user_run.hpp"

#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>

#include "gasloc/algo/algo_config.hpp"
#include "gasloc/algo/registry.hpp"
#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/config.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/run.hpp"
#include "gasloc/train/run_start.hpp"

namespace gasloc::train {
namespace fs = std::filesystem;

namespace {

// What a user-owned run refuses, by section ("model") or by key ("train.steps"), and why.
struct Refusal {
  const char* key;
  const char* why;
};

constexpr const char* kLoopLength = "your loop decides how many steps run (for step in range(run.start_step, total_steps))";
constexpr const char* kThreads = "your process sets its own threads (torch.set_num_threads)";
constexpr const char* kNotBuilt = "not built yet in the Python API (docs/python.md lists what is)";

const std::vector<Refusal>& refusals() {
  static const std::vector<Refusal> table = {
      {"model", "the model is yours: build it in PyTorch and hand it to gasloc.Run"},
      {"data", "the data is yours: your loop draws each rank's batches"},
      {"optim", "the inner optimizer is yours: create it (e.g. torch.optim.AdamW) and hand it to gasloc.Run"},
      {"train.steps", kLoopLength},
      {"train.stop_at", kLoopLength},
      {"train.device", "your parameters stay on the device you put them on"},
      {"train.dtype", "your loop chooses its compute dtype (torch.autocast)"},
      {"train.threads", kThreads},
      {"train.blas_threads", kThreads},
      {"train.streams", kThreads},
      {"train.divergence_factor", "your loop owns its loss"},
      {"cluster.workers", "a Python process is one worker: start N of them with gasloc launch -n N"},
      {"cluster.compute_slots", "it schedules the in-process workers of the CLI trainer; a Python process is one worker"},
      {"train.eval_every", kNotBuilt},
      {"train.eval_model", kNotBuilt},
      {"train.checkpoint_every", kNotBuilt},
      {"cluster.elastic", kNotBuilt},
      {"cluster.join", kNotBuilt},
      {"cluster.heartbeat_timeout_s", kNotBuilt},
      {"faults", kNotBuilt},
  };
  return table;
}

void refuse_if_owned(const std::string& key, const std::string& where) {
  const std::string why = user_key_refusal(key);
  if (!why.empty())
    throw ConfigError("config key '" + key + "'" + where + " cannot be set for a Python run: " + why,
                      "remove it from the settings and the job file");
}

// Settings this API cannot run yet, whatever key set them.
void refuse_what_is_not_built(const JobConfig& job) {
  const algo::AlgorithmEntry& entry = algo::algorithm(job.algo.name);
  if (!entry.has_rounds && !entry.single_worker)
    throw ConfigError("config key 'algo.name': '" + job.algo.name.str() +
                          "' communicates between backward() and the optimizer step, which needs run.sync_gradients(): "
                          "not built yet in the Python API",
                      "choose one of " + algo::algorithm_names(&algo::AlgorithmEntry::has_rounds) + ", or none");
  if (job.algo.h_policy != "fixed")
    throw ConfigError("config key 'algo.h_policy': '" + job.algo.h_policy.str() +
                          "' skips steps' computation, which needs run.should_compute(): not built yet in the Python API",
                      "set algo.h_policy = \"fixed\"");
}

// The model's names and shapes, as the configuration the ranks agree on: a rank whose model
// differs is named with the first parameter that differs.
nlohmann::json model_shapes(const FlatParams& params) {
  nlohmann::json m = nlohmann::json::object();
  for (const auto& seg : params.segments()) m[seg.name] = seg.shape;
  return m;
}

void check_params(const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  if (params.empty())
    throw ConfigError("the model has no parameters to train", "hand gasloc.Run the model whose parameters the optimizer steps");
  const auto& [first_name, first] = params.front();
  for (const auto& [name, p] : params) {
    if (p.device() != first.device())
      throw ConfigError(fmt::format("parameter '{}' is on {} but '{}' is on {}: the parameters are on several devices", name,
                                    p.device().str(), first_name, first.device().str()),
                        "move the whole model to one device (model.to(device)) before gasloc.Run");
    if (p.scalar_type() != torch::kFloat32)
      throw ConfigError(fmt::format("parameter '{}' is {}: gasloc keeps the parameters in one fp32 buffer", name,
                                    c10::toString(p.scalar_type())),
                        "keep the parameters in fp32 (model.float()) and compute in lower precision with torch.autocast");
  }
}

}  // namespace

std::string user_key_refusal(const std::string& key) {
  const std::string section = key.substr(0, key.find('.'));
  for (const Refusal& r : refusals())
    if (key == r.key || section == r.key) return r.why;
  return "";
}

JobConfig user_job(const std::string& config_path, const std::vector<std::string>& overrides, bool launched) {
  const nlohmann::json doc = config_path.empty() ? nlohmann::json::object() : config::parse_toml_file(config_path);
  if (doc.is_object())
    for (const auto& [section, table] : doc.items()) {
      if (!table.is_object()) refuse_if_owned(section, " in " + config_path);
      else
        for (const auto& [key, value] : table.items()) refuse_if_owned(section + "." + key, " in " + config_path);
    }
  // Under a launcher every Python process is one rank of the job: it meets the others over gloo
  // unless the settings name another process backend.
  std::vector<std::string> sets;
  if (launched) sets.push_back("cluster.backend=gloo");
  for (const auto& ov : overrides) {
    refuse_if_owned(ov.substr(0, ov.find('=')), "");
    sets.push_back(ov);
  }
  JobConfig job = job_from_json(doc, sets);
  if (launched && job.cluster.backend == "inproc")
    throw ConfigError("config key 'cluster.backend': inproc trains this process alone, but a launcher started it as one "
                      "rank of WORLD_SIZE",
                      "leave cluster.backend out (gloo), or set gloo or nccl");
  refuse_what_is_not_built(job);
  return job;
}

std::unique_ptr<comm::Cluster> open_user_cluster(const JobConfig& job) {
  // No job token of gasloc launch's: under it a Python rank meets at the launcher's c10d store
  // (TORCHELASTIC_USE_AGENT_STORE), started by hand at the store its rank 0 hosts.
  return open_cluster(TrainRequest{}, job);
}

UserRun::UserRun(const JobConfig& job, const std::vector<std::pair<std::string, torch::Tensor>>& params,
                 comm::Cluster& cluster, int rank, const std::string& optimizer)
    : job_(job), cluster_(cluster), rank_(rank), dir_(job.train.run_dir) {
  check_params(params);
  lock_.emplace(dir_, std::vector<int>{rank_});
  params_ = FlatParams(params);
  nlohmann::json resolved = job_.to_json();
  resolved["model"] = model_shapes(params_);
  if (comm::Communicator* processes = cluster_.processes()) agree_on_config(*processes, resolved, "");
  {
    // Every rank starts from rank 0's parameters, so that ranks need not seed alike.
    torch::NoGradGuard no_grad;
    cluster_.control(rank_).broadcast(params_.data(), 0);
  }
  network_ = job_.network.model(world());
  sync_ = algo::make_synchronizer(job_.algo, world(), job_.train.seed, &network_, nullptr, job_.faults.poisons());
  sync_->init(params_);
  start_files(optimizer);
}

UserRun::~UserRun() = default;

void UserRun::start_files(const std::string& optimizer) {
  const fs::path file = dir_ / "metrics.jsonl";
  const bool leader = rank_ == 0;
  if (leader) {
    // The settings this run used; of what the user owns, only the optimizer's name (for readers of runs).
    nlohmann::json config = job_.to_json();
    for (auto& [section, table] : config.items())
      for (auto it = table.begin(); it != table.end();)
        it = user_key_refusal(section + "." + it.key()).empty() ? std::next(it) : table.erase(it);
    config["optim"] = {{"name", optimizer}};
    const nlohmann::json info = {{"config", config},
                                 {"model", {{"source", "python"}, {"params", params_.numel()}, {"shapes", model_shapes(params_)}}},
                                 {"world", world()},
                                 {"seed", job_.train.seed},
                                 {"versions", {{"gasloc", "0.1.0"}, {"torch", TORCH_VERSION}}}};
    write_file_atomic_shared(dir_ / "run.json", info.dump(2) + "\n");
    fs::remove(file);  // a new run: the previous run's lines go (as `gasloc train` does without checkpoints)
    metrics_ = std::make_unique<MetricsLog>(file);
  }
  cluster_.control(rank_).barrier();  // the leader's new file exists before anyone appends to it
  if (!metrics_) metrics_ = std::make_unique<MetricsLog>(file);
  if (leader) {
    int64_t sync_bytes = 0;
    for (const auto& [k, t] : sync_->state()) sync_bytes += t.numel() * static_cast<int64_t>(t.element_size());
    metrics_->write(MemoryEvent{.step = 0, .worker = rank_, .optim = optimizer, .algo = job_.algo.name.str(),
                                .params = params_.numel(), .param_bytes = params_.numel() * 4,
                                .optimizer_state_bytes = 0, .sync_state_bytes = sync_bytes});
  }
}

bool UserRun::step(std::optional<double> loss, double lr) {
  if (closed_) throw Error("run.step() after run.close()", "call run.step() inside the `with gasloc.Run(...)` block");
  const auto t = std::chrono::steady_clock::now();
  comm::Communicator& comm = cluster_.comm(rank_);
  ++step_;
  comm.compute(1);
  const bool round_done = sync_->after_step(step_, params_, comm);
  in_step_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  if (loss) last_loss_ = loss;
  last_lr_ = lr;
  if (step_ % job_.train.log_every == 0) write_train_line(round_done);
  return round_done;
}

void UserRun::write_train_line(bool round_done) {
  const comm::Communicator& comm = cluster_.comm(rank_);
  const comm::CommStats st = comm.stats();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const double compute = std::max(0.0, wall - in_step_s_);  // the user's loop: everything outside step()
  metrics_->write(TrainEvent{.step = step_,
                             .worker = rank_,
                             .train_loss = last_loss_.value_or(std::nan("")),
                             .lr = last_lr_,
                             .computed = true,
                             .grad_norm = std::nullopt,
                             .round_done = round_done,
                             .tokens_per_s = 0,
                             .wall_time_s = wall,
                             .virtual_time_s = wall,
                             .bytes_sent = st.bytes_sent,
                             .idle_s = st.idle_s,
                             .local_steps = step_,
                             .compute_s = compute,
                             .utilization = wall > 0 ? compute / wall : 0.0,
                             .codec_resends = sync_->codec_resends(),
                             .clipped_from = sync_->clipped_from()});
  logged_step_ = step_;
}

void UserRun::close() {
  if (closed_) return;
  closed_ = true;
  const bool landed = sync_->flush(params_, cluster_.comm(rank_));
  if (step_ > logged_step_) write_train_line(landed);
  metrics_.reset();
  lock_.reset();
}

}  // namespace gasloc::train
