#include "gasloc/train/user_run.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>

#include "gasloc/algo/algo_config.hpp"
#include "gasloc/algo/registry.hpp"
#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/config.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/train/elastic_process.hpp"
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
      {"faults", "it schedules deaths and poisoned messages of the CLI trainer's in-process workers; a Python rank is a "
                 "process: kill it, and gasloc launch --elastic restarts it and heals it from a donor"},
  };
  return table;
}

void refuse_if_owned(const std::string& key, const std::string& where) {
  const std::string why = user_key_refusal(key);
  if (!why.empty())
    throw ConfigError("config key '" + key + "'" + where + " cannot be set for a Python run: " + why,
                      "remove it from the settings and the job file");
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
  if (job.cluster.elastic && job.cluster.backend == "inproc")
    throw ConfigError("config key 'cluster.elastic': an elastic Python run is one of processes, and this one runs alone",
                      "start it under gasloc launch --elastic -n N -- python3 train.py (which sets it)");
  if (launched && job.cluster.backend == "inproc")
    throw ConfigError("config key 'cluster.backend': inproc trains this process alone, but a launcher started it as one "
                      "rank of WORLD_SIZE",
                      "leave cluster.backend out (gloo), or set gloo or nccl");
  return job;
}

std::unique_ptr<comm::Cluster> open_user_cluster(const JobConfig& job, const std::string& job_id, int64_t incarnation) {
  TrainRequest req;
  req.job_id = job_id;
  req.incarnation = incarnation;
  return open_cluster(req, job);
}

UserRun::UserRun(const JobConfig& job, const std::vector<std::pair<std::string, torch::Tensor>>& params,
                 comm::Cluster& cluster, int rank, const std::string& optimizer, std::optional<int64_t> resume)
    : job_(job), cluster_(cluster), rank_(rank), dir_(job.train.run_dir), checkpoints_(dir_, cluster.world()),
      optimizer_(optimizer), grads_mixed_(!algo::algorithm(job.algo.name).has_rounds &&
                                         !algo::algorithm(job.algo.name).single_worker) {
  check_params(params);
  for (const auto& [name, p] : params) by_name_.emplace(name, p);
  lock_.emplace(dir_, std::vector<int>{rank_});
  params_ = FlatParams(params);
  nlohmann::json resolved = job_.to_json();
  resolved["model"] = model_shapes(params_);
  comm::Communicator* processes = cluster_.processes();
  if (comm::ElasticRoster* roster = cluster_.elastic_roster()) {
    if (resume)
      throw ConfigError("resume= of an elastic Python run is not built yet (its ranks commit their checkpoints on their own)",
                        "resume it without --elastic (gasloc launch -n N), or start a new run");
    const int64_t steps_per_round = algo::algorithm(job_.algo.name).has_rounds ? job_.algo.H : 1;
    elastic_ = std::make_unique<ElasticProcess>(*roster, world(), steps_per_round, job_.cluster.timeout_s);
    elastic_->agree(shared_config(resolved, ""));
  } else if (processes) {
    agree_on_config(*processes, resolved, "");
  }
  network_ = job_.network.model(world());
  sync_ = algo::make_synchronizer(job_.algo, world(), job_.train.seed, &network_, elastic_ ? &elastic_->views() : nullptr,
                                  job_.faults.poisons());
  const std::vector<int> mine{rank_};
  if (elastic_ && elastic_->joiner()) {
    sync_->init(params_);  // replaced by the donor's at the heal (join_running_job, after the files)
  } else if (elastic_) {
    if (checkpoints_.any(&mine))
      throw CheckpointError("run directory '" + dir_.string() + "' already holds checkpoints of rank " +
                                std::to_string(rank_),
                            "set another train.run_dir (resume= of an elastic Python run is not built yet)");
    agree_initial_params();
    sync_->init(params_);
  } else if (resume) {
    sync_->init(params_);
    const int64_t step = agreed_resume_step(*resume);
    resume_from(step, checkpoints_.committed(rank_));
  } else {
    if (checkpoints_.any(&mine))
      throw CheckpointError("run directory '" + dir_.string() + "' already holds checkpoints",
                            "continue that run with gasloc.Run(..., resume=True), or set another train.run_dir");
    // Every rank starts from rank 0's parameters, so that ranks need not seed alike.
    torch::NoGradGuard no_grad;
    cluster_.control(rank_).broadcast(params_.data(), 0);
    sync_->init(params_);  // anchors start at the agreed parameters
  }
  start_files(optimizer, resume.has_value());
  signals_.emplace();
  if (elastic_ && elastic_->joiner()) join_running_job();
}

CheckpointMeta UserRun::meta() const { return {model_shapes(params_), optimizer_, job_.algo.name.str(), world()}; }

// The step every rank resumes: the newest any rank committed, or `asked` when some rank committed
// it. A run saved by another world is refused first, from its run.json, on every rank alike.
int64_t UserRun::agreed_resume_step(int64_t asked) {
  const fs::path run_json = dir_ / "run.json";
  const auto info = fs::exists(run_json) ? nlohmann::json::parse(read_file(run_json), nullptr, false) : nlohmann::json();
  if (info.is_object() && info.value("world", world()) != world())
    throw CheckpointError(fmt::format("run '{}' was saved by {} workers, and this job has {}", dir_.string(),
                                      info.value("world", 0), world()),
                          fmt::format("resume it with {} ranks (gasloc launch -n {})", info.value("world", 0),
                                      info.value("world", 0)));
  const std::vector<int> mine{rank_};
  const auto committed = committed_by_rank(checkpoints_, world(), mine, cluster_.processes());
  try {
    if (asked == kResumeNewest) return checkpoints_.resume_step(committed, mine);
  } catch (const CheckpointError& e) {
    if (std::string(e.what()).find("holds no committed checkpoint") == std::string::npos) throw;
    throw CheckpointError(e.what(), "leave resume=True out to start a new run in " + dir_.string());
  }
  for (const auto& steps : committed)
    if (std::find(steps.begin(), steps.end(), asked) != steps.end()) return asked;
  throw CheckpointError(fmt::format("resume={} is not a committed checkpoint of run '{}' (this rank committed: {})",
                                    asked, dir_.string(), fmt::join(checkpoints_.committed(rank_), ", ")),
                        "give resume=True (the newest) or one of the committed steps");
}

// This rank's file of `step`: the parameters, the synchronizer's state, the step, the counters,
// the process's CPU random generator (a loop that draws from it continues bit-exactly), and the
// user's share, kept for the caller. A committed step after `step` is a branch this resume
// abandons: forgotten on disk, so that a later resume cannot take it.
void UserRun::resume_from(int64_t step, const std::vector<int64_t>& committed) {
  const fs::path path = checkpoints_.file(step, rank_);
  Checkpoint c;
  try {
    c = load_checkpoint(path);
  } catch (const CheckpointError& e) {
    std::string hint = e.hint();
    for (int64_t prev : committed)
      if (prev < step) {
        hint = fmt::format("resume the previous committed step: gasloc.Run(..., resume={})", prev);
        break;
      }
    throw CheckpointError(e.what(), hint);
  }
  if (!committed.empty() && committed.front() > step) checkpoints_.rewind(rank_, step);
  check_checkpoint_meta(path, CheckpointMeta::from_json(c.meta), meta());
  auto take = [&](const std::string& key) {
    auto it = c.tensors.find(key);
    if (it == c.tensors.end())
      throw CheckpointError("checkpoint '" + path.string() + "' has no '" + key + "'", "it was not written by gasloc.Run");
    return it->second;
  };
  {
    torch::NoGradGuard no_grad;
    params_.data().copy_(take("params"));
  }
  algo::StateDict sync_state;
  UserState user{{}, c.meta.value("user", nlohmann::json())};
  for (const auto& [k, v] : c.tensors) {
    if (k.rfind("sync.", 0) == 0) sync_state[k.substr(5)] = v;
    if (k.rfind("user.", 0) == 0) user.tensors[k.substr(5)] = v;
  }
  sync_->load_state(sync_state);
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(take("rng.cpu"));
  step_ = logged_step_ = checkpointed_ = step;
  base_ = Counters::from_json(c.meta.value("counters", nlohmann::json::object()));
  resumed_ = std::move(user);
}

bool UserRun::eval_due() const {
  return job_.train.eval_every > 0 && step_ % job_.train.eval_every == 0 && step_ != evaluated_;
}

bool UserRun::begin_evaluation() {
  consensus_ = 0;
  if (world() == 1 || elastic_) return false;  // elastic: each rank evaluates its own model, no collective
  torch::NoGradGuard no_grad;
  comm::Communicator& control = cluster_.control(rank_);
  torch::Tensor mean = params_.data().clone();
  control.all_reduce_mean(mean);
  auto distance = (params_.data() - mean).pow(2).sum().to(torch::kFloat64).reshape({1});
  control.all_reduce_mean(distance);
  consensus_ = distance.item<double>();
  if (job_.train.eval_model != "average") return false;
  own_params_ = params_.data().clone();
  params_.data().copy_(mean);
  return true;
}

void UserRun::end_evaluation(double own_loss, std::optional<double> average_loss) {
  if (own_params_.defined()) {
    torch::NoGradGuard no_grad;
    params_.data().copy_(own_params_);
    own_params_ = torch::Tensor();
  }
  // Row r holds rank r's loss, the others zeros: the mean times the world is every row.
  evaluated_ = step_;
  std::vector<double> by_rank{own_loss};
  if (elastic_) {  // every elastic rank writes its own line, as gasloc train's do
    const Counters c = counters();
    metrics_->write(EvalEvent{.step = step_, .worker = rank_, .val_loss = own_loss, .worker_val_loss = by_rank,
                              .consensus_distance = 0, .wall_time_s = c.wall_time_s, .virtual_time_s = c.virtual_time_s,
                              .bytes_sent = c.bytes_sent, .members = {rank_}, .eval_time_s = 0});
    return;
  }
  auto losses = torch::zeros({world()}, torch::kFloat64);
  losses[rank_] = own_loss;
  if (world() > 1) cluster_.control(rank_).all_reduce_mean(losses);
  losses.mul_(world());
  by_rank.assign(losses.data_ptr<double>(), losses.data_ptr<double>() + world());
  if (rank_ != 0) return;
  const Counters c = counters();
  metrics_->write(EvalEvent{.step = step_,
                            .worker = rank_,
                            .val_loss = average_loss.value_or(losses.mean().item<double>()),
                            .worker_val_loss = by_rank,
                            .consensus_distance = consensus_,
                            .wall_time_s = c.wall_time_s,
                            .virtual_time_s = c.virtual_time_s,
                            .bytes_sent = c.bytes_sent,
                            .members = {},
                            .eval_time_s = 0});
}

bool UserRun::checkpoint_due() const {
  return job_.train.checkpoint_every > 0 && step_ % job_.train.checkpoint_every == 0 && step_ != checkpointed_;
}

void UserRun::checkpoint(const UserState& user) {
  comm::Communicator& comm = cluster_.comm(rank_);
  sync_->settle(comm);  // an overlapped exchange in flight: its result goes into the state
  Checkpoint c;
  c.meta = meta().to_json();
  c.meta["step"] = step_;
  c.meta["source"] = "python";
  c.meta["user"] = user.json;
  c.meta["counters"] = counters().to_json();
  c.tensors["params"] = params_.data().clone();
  for (const auto& [k, v] : sync_->state()) c.tensors["sync." + k] = v;
  for (const auto& [k, v] : user.tensors) c.tensors["user." + k] = v;
  c.tensors["rng.cpu"] = at::detail::getDefaultCPUGenerator().get_state();
  checkpoints_.write(step_, rank_, c);
  // Every rank wrote this step before any commits it; an elastic rank commits its own (no collective).
  if (!elastic_) cluster_.control(rank_).barrier();
  checkpoints_.commit(step_, rank_);
  checkpointed_ = step_;
}

UserRun::~UserRun() = default;

// The settings this run used; of what the user owns, only the optimizer's name (for readers of runs).
void UserRun::write_run_json(const std::string& optimizer) {
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
}

void UserRun::start_files(const std::string& optimizer, bool resumed) {
  const fs::path file = dir_ / "metrics.jsonl";
  // Elastic: the first rank to claim the files opens them (any id: rank 0 may have died starting);
  // every other rank, and every incarnation restarted later, appends once they are open.
  const bool leader = elastic_ ? elastic_->claim_files() : rank_ == 0;
  if (leader && resumed) {
    metrics_ = std::make_unique<MetricsLog>(file, step_);  // drops the lines after the checkpoint (a crash's tail)
  } else if (leader) {
    write_run_json(optimizer);
    fs::remove(file);  // a new run: the previous run's lines go (as `gasloc train` does without checkpoints)
    metrics_ = std::make_unique<MetricsLog>(file);
  }
  if (elastic_ && leader) elastic_->files_ready();
  if (!elastic_) cluster_.control(rank_).barrier();  // the leader's new file exists before anyone appends to it
  if (!metrics_) metrics_ = std::make_unique<MetricsLog>(file);
  if (leader && !resumed) {
    int64_t sync_bytes = 0;
    for (const auto& [k, t] : sync_->state()) sync_bytes += t.numel() * static_cast<int64_t>(t.element_size());
    metrics_->write(MemoryEvent{.step = 0, .worker = rank_, .optim = optimizer, .algo = job_.algo.name.str(),
                                .params = params_.numel(), .param_bytes = params_.numel() * 4,
                                .optimizer_state_bytes = 0, .sync_state_bytes = sync_bytes});
  }
}

bool UserRun::should_compute() {
  if (!computes_) computes_ = sync_->wants_compute(step_ + 1, cluster_.comm(rank_));
  return *computes_;
}

bool UserRun::sync_gradients() {
  if (!grads_mixed_) return false;
  if (grads_synced_) throw Error("run.sync_gradients() twice in one step", "call it once, between backward() and opt.step()");
  const auto t = std::chrono::steady_clock::now();
  gather_grads();
  sync_->after_backward(step_ + 1, params_, cluster_.comm(rank_));
  grads_synced_ = true;
  in_step_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  return true;
}

void UserRun::gather_grads() {
  torch::NoGradGuard no_grad;
  for (const auto& seg : params_.segments()) {
    torch::Tensor& p = by_name_.at(seg.name);
    torch::Tensor view = params_.view(params_.grad(), seg);
    const torch::Tensor g = p.grad();
    if (g.defined() && g.data_ptr() == view.data_ptr()) continue;  // autograd accumulated into the view
    if (g.defined()) view.copy_(g);
    else view.zero_();  // a parameter the loss did not reach
    p.mutable_grad() = view;
  }
}

bool UserRun::step(std::optional<double> loss, double lr) {
  if (closed_) throw Error("run.step() after run.close()", "call run.step() inside the `with gasloc.Run(...)` block");
  if (job_.algo.h_policy == "time_budget" && !computes_)
    throw ConfigError("algo.h_policy = 'time_budget' skips some steps' computation: run.should_compute() was not asked "
                          "before this step",
                      "begin each step with `if run.should_compute():` around the batch, backward() and opt.step()");
  if (grads_mixed_ && !grads_synced_ && should_compute())
    throw ConfigError("algo.name = '" + job_.algo.name.str() +
                          "' exchanges gradients between backward() and the optimizer step: run.sync_gradients() was not "
                          "called in this step",
                      "call run.sync_gradients() after loss.backward() and before opt.step()");
  const auto t = std::chrono::steady_clock::now();
  comm::Communicator& comm = cluster_.comm(rank_);
  const bool computed = should_compute();
  computes_.reset();
  grads_synced_ = false;
  ++step_;
  if (computed) comm.compute(1);
  const bool round_done = sync_->after_step(step_, params_, comm);
  if (elastic_) after_round_elastic();
  in_step_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  if (loss) last_loss_ = loss;
  last_lr_ = lr;
  if (step_ % job_.train.log_every == 0) {
    write_train_line(round_done);
    if (!elastic_) stop_agreed_ = agree_stop();
  }
  // Elastic: Ctrl+C or SIGTERM at this rank is this member's leave (Run.step calls leave()).
  if (elastic_) stop_agreed_ = stop_requested();
  return round_done;
}

bool UserRun::agree_stop() {
  auto asked = torch::tensor({stop_requested() ? 1.0 : 0.0}, torch::kFloat64);
  if (world() > 1) cluster_.control(rank_).all_reduce_mean(asked);
  return asked.item<double>() > 0;
}

// This run's counters: this invocation's on top of what its checkpoint carried.
Counters UserRun::counters() const {
  const comm::CommStats st = cluster_.comm(rank_).stats();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  Counters c = base_;
  c.bytes_sent += st.bytes_sent;
  c.idle_s += st.idle_s;
  c.wall_time_s += wall;
  c.virtual_time_s += wall;
  c.compute_s += std::max(0.0, wall - in_step_s_);  // the user's loop: everything outside step()
  return c;
}

void UserRun::write_train_line(bool round_done) {
  const Counters c = counters();
  metrics_->write(TrainEvent{.step = step_,
                             .worker = rank_,
                             .train_loss = last_loss_.value_or(std::nan("")),
                             .lr = last_lr_,
                             .computed = true,
                             .grad_norm = std::nullopt,
                             .round_done = round_done,
                             .tokens_per_s = 0,
                             .wall_time_s = c.wall_time_s,
                             .virtual_time_s = c.virtual_time_s,
                             .bytes_sent = c.bytes_sent,
                             .idle_s = c.idle_s,
                             .local_steps = step_,
                             .compute_s = c.compute_s,
                             .utilization = c.wall_time_s > 0 ? c.compute_s / c.wall_time_s : 0.0,
                             .codec_resends = sync_->codec_resends(),
                             .clipped_from = sync_->clipped_from(),
                             .dropped_from = sync_->dropped_from()});
  logged_step_ = step_;
}

bool UserRun::land() {
  if (closed_) return false;
  const bool landed = sync_->flush(params_, cluster_.comm(rank_));
  landed_ = landed_ || landed;
  return landed;
}

void UserRun::close() {
  if (closed_) return;
  land();
  closed_ = true;
  if (step_ > logged_step_) write_train_line(landed_);
  if (elastic_) elastic_->finished(step_);  // a rank still waiting to join learns the job ended
  metrics_.reset();
  lock_.reset();
  signals_.reset();
}

}  // namespace gasloc::train
