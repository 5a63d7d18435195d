#include "gasloc/train/trainer.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <unistd.h>

#include "gasloc/core/atomic_file.hpp"
#include "gasloc/core/blas_threads.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/comm/gloo.hpp"
#include "gasloc/comm/inproc.hpp"
#include "gasloc/comm/rendezvous.hpp"
#include "gasloc/train/meeting.hpp"
#include "gasloc/train/metrics.hpp"
#include "gasloc/train/worker.hpp"

namespace gasloc::train {
namespace fs = std::filesystem;

namespace {
std::atomic<bool> g_stop{false};

extern "C" void on_signal(int) {
  if (g_stop.exchange(true)) {
    // A second Ctrl+C: say why the process ends without its checkpoint, then end it.
    static const char msg[] = "\ngasloc train: second interrupt: exiting now without a checkpoint\n";
    [[maybe_unused]] auto n = ::write(2, msg, sizeof msg - 1);
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    std::raise(SIGINT);
  }
}

// Installs the stop handler for the duration of a run and restores the previous one.
struct SignalScope {
  void (*prev_int)(int);
  void (*prev_term)(int);
  SignalScope() {
    g_stop.store(false);
    prev_int = std::signal(SIGINT, on_signal);
    prev_term = std::signal(SIGTERM, on_signal);
  }
  ~SignalScope() {
    std::signal(SIGINT, prev_int);
    std::signal(SIGTERM, prev_term);
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

JobConfig resolve_job(const TrainRequest& req) {
  if (req.resume_dir.empty()) {
    if (req.resume_step >= 0) throw ConfigError("--resume-step needs --resume RUN");
    return load_job(req.config_path, req.overrides);
  }
  if (!req.config_path.empty())
    throw ConfigError("--resume takes the configuration from RUN/run.json; do not pass --config too",
                      "use --resume RUN [--set key=value ...] to change settings such as train.steps");
  const fs::path run_json = fs::path(req.resume_dir) / "run.json";
  if (!fs::exists(run_json))
    throw CheckpointError("'" + req.resume_dir + "' is not a gasloc run directory (no run.json)",
                          "pass the run_dir of an earlier `gasloc train`");
  auto doc = nlohmann::json::parse(read_file(run_json), nullptr, false);
  if (doc.is_discarded() || !doc.contains("config")) throw CheckpointError("corrupt '" + run_json.string() + "'");
  // A resumed run goes on to train.steps unless told again; the user's --set come last and win.
  std::vector<std::string> overrides = {"train.run_dir=" + req.resume_dir, "train.stop_at=0"};
  overrides.insert(overrides.end(), req.overrides.begin(), req.overrides.end());
  return job_from_json(doc["config"], overrides);
}

// The job as it runs: the world it really has (gloo: WORLD_SIZE, not cluster.workers).
nlohmann::json resolved_json(const JobConfig& job, int world) {
  nlohmann::json j = job.to_json();
  j["cluster"]["workers"] = world;
  return j;
}

void print_config(const JobConfig& job, const model::LlamaConfig& mc, int world) {
  fmt::print("gasloc train: resolved configuration ({} worker{}{})\n", world, world == 1 ? "" : "s",
             job.cluster.backend == "inproc" ? "" : fmt::format(", {} processes", world));
  const nlohmann::json resolved = resolved_json(job, world);
  // A model field left at 0 takes the preset's value: show which.
  const nlohmann::json shape = {{"dim", mc.dim},         {"n_layers", mc.n_layers},       {"n_heads", mc.n_heads},
                                {"n_kv_heads", mc.n_kv_heads}, {"multiple_of", mc.multiple_of}, {"max_seq_len", mc.max_seq_len},
                                {"ffn_dim_multiplier", mc.ffn_dim_multiplier}};
  for (auto& [section, values] : resolved.items()) {
    fmt::print("  [{}]\n", section);
    for (auto& [k, v] : values.items()) {
      const bool from_preset = section == "model" && shape.contains(k) && v.is_number() && v.get<double>() == 0;
      fmt::print("    {} = {}{}\n", k, v.dump(), from_preset ? fmt::format("  (preset {}: {})", job.model.preset, shape[k].dump()) : "");
    }
  }
  fmt::print("  model: dim {} layers {} heads {}/{} ffn {} vocab {} max_seq_len {} -> {:.2f}M parameters\n", mc.dim,
             mc.n_layers, mc.n_heads, mc.n_kv_heads, mc.ffn_hidden(), mc.vocab_size, mc.max_seq_len,
             static_cast<double>(mc.num_params()) / 1e6);
  std::fflush(stdout);
}

nlohmann::json model_json(const model::LlamaConfig& c) {
  return {{"dim", c.dim},           {"n_layers", c.n_layers},       {"n_heads", c.n_heads},
          {"n_kv_heads", c.n_kv_heads}, {"vocab_size", c.vocab_size}, {"ffn_hidden", c.ffn_hidden()},
          {"rope_theta", c.rope_theta}, {"max_seq_len", c.max_seq_len}, {"tie_embeddings", c.tie_embeddings},
          {"norm_eps", c.norm_eps},   {"num_params", c.num_params()}};
}

// What a checkpoint must agree on with the job that resumes it.
struct CheckpointMeta {
  nlohmann::json model;
  std::string optim, algo;
  int world = 1;
  bool operator==(const CheckpointMeta&) const = default;
  nlohmann::json to_json() const { return {{"model", model}, {"optim", optim}, {"algo", algo}, {"world", world}}; }
  static CheckpointMeta from_json(const nlohmann::json& m) {
    return {m.value("model", nlohmann::json{}), m.value("optim", std::string("?")), m.value("algo", std::string("?")),
            m.value("world", 0)};
  }
};

// Cumulative counters of one rank. They live in its checkpoints, so that a resumed run reports
// the traffic, times and idle time of the whole run, not of its last part.
struct Counters {
  int64_t bytes_sent = 0;
  double virtual_time_s = 0, wall_time_s = 0, idle_s = 0;
  nlohmann::json to_json() const {
    return {{"bytes_sent", bytes_sent}, {"virtual_time_s", virtual_time_s}, {"wall_time_s", wall_time_s}, {"idle_s", idle_s}};
  }
  static Counters from_json(const nlohmann::json& j) {
    return {j.value("bytes_sent", int64_t{0}), j.value("virtual_time_s", 0.0), j.value("wall_time_s", 0.0),
            j.value("idle_s", 0.0)};
  }
};

// Keys that may differ between ranks (paths and thread counts of each host).
const std::vector<std::pair<std::string, std::string>> kRankLocal = {
    {"train", "run_dir"}, {"train", "threads"}, {"train", "blas_threads"}, {"data", "dir"}, {"cluster", "timeout_s"},
    {"cluster", "workers"}};

// Every rank of a process group must train the same job: ranks with different optim.lr used to
// train together silently. Each rank broadcasts its configuration in turn, so that every rank
// computes the same list of differences and stops with the same message.
void agree_on_config(comm::Communicator& c, const nlohmann::json& resolved) {
  nlohmann::json mine = resolved;
  for (const auto& [sec, key] : kRankLocal)
    if (mine.contains(sec)) mine[sec].erase(key);
  const std::string text = mine.dump();
  std::vector<nlohmann::json> all(static_cast<size_t>(c.world()));
  for (int root = 0; root < c.world(); ++root) {
    auto len = torch::tensor({static_cast<int64_t>(root == c.rank() ? text.size() : 0)}, torch::kInt64);
    c.broadcast(len, root);
    auto bytes = torch::empty({len.item<int64_t>()}, torch::kUInt8);
    if (root == c.rank()) std::memcpy(bytes.data_ptr(), text.data(), text.size());
    c.broadcast(bytes, root);
    all[root] = nlohmann::json::parse(std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()));
  }
  std::string diffs;
  for (int r = 1; r < c.world(); ++r)
    for (auto& [sec, values] : all[0].items())
      for (auto& [key, v0] : values.items()) {
        const nlohmann::json vr = all[r][sec].value(key, nlohmann::json());
        if (vr != v0) diffs += fmt::format("{}{}.{} is {} on rank {} but {} on rank 0", diffs.empty() ? "" : "; ", sec, key, vr.dump(), r, v0.dump());
      }
  if (!diffs.empty())
    throw ConfigError("the ranks were started with different configurations: " + diffs,
                      "start every rank with the same job file and --set options");
}

// Every rank's committed checkpoint steps, wherever its files are: ranks of other processes
// (or hosts) tell theirs through the communicator.
std::vector<std::vector<int64_t>> committed_by_rank(const RunCheckpoints& ckpts, int world, const std::vector<int>& local,
                                                    comm::Communicator* process_comm) {
  std::vector<std::vector<int64_t>> all(static_cast<size_t>(world));
  for (int r : local) all[r] = ckpts.committed(r);
  if (process_comm == nullptr || world == 1) return all;
  // Row r holds rank r's steps + 1 (0 = none); other ranks contribute zeros, so the mean times
  // world is each row exactly (integers far below 2^53).
  auto t = torch::zeros({world, 2}, torch::kFloat64);
  for (int r : local)
    for (size_t k = 0; k < all[r].size() && k < 2; ++k) t[r][static_cast<int64_t>(k)] = static_cast<double>(all[r][k] + 1);
  process_comm->all_reduce_mean(t);
  t.mul_(world).round_();
  for (int r = 0; r < world; ++r) {
    all[r].clear();
    for (int k = 0; k < 2; ++k)
      if (const auto v = static_cast<int64_t>(t[r][k].item<double>()); v > 0) all[r].push_back(v - 1);
  }
  return all;
}

// What the ranks of this process share during a run.
struct RunState {
  const JobConfig& job;
  model::LlamaConfig mc;
  fs::path run_dir;
  RunCheckpoints checkpoints;
  int world = 1;
  bool quiet = false;
  int64_t start_step = 0, end_step = 0;
  MetricsLog* metrics = nullptr;
  Progress* progress = nullptr;
  Meeting* meeting = nullptr;
  std::chrono::steady_clock::time_point t0;
  int reporter = 0;                     // the rank that fills `summary` (the lowest rank in this process)
  std::map<int, Counters> base;         // each local rank's counters at the start of this invocation
  std::map<int, comm::CommStats> stats0;  // and its communicator's stats then
  std::map<int, double> clock0;
  std::map<int, int64_t> committed;     // each local rank's last committed step (-1: none)
  TrainSummary summary;

  Counters counters(int rank, const comm::Communicator& comm) const {
    const auto st = comm.stats();
    const Counters& b = base.at(rank);
    return {b.bytes_sent + st.bytes_sent - stats0.at(rank).bytes_sent - meeting->own_bytes(rank),
            b.virtual_time_s + comm.now() - clock0.at(rank), b.wall_time_s + seconds_since(t0),
            b.idle_s + st.idle_s - stats0.at(rank).idle_s};
  }
  std::string last_checkpoint(int rank) const {
    const int64_t s = committed.at(rank);
    return s < 0 ? std::string("no checkpoint was committed yet")
                 : fmt::format("the last committed checkpoint is step {} (resume with `gasloc train --resume {}`)", s,
                               run_dir.string());
  }
};

// Two-phase save (checkpoint.hpp): write, meet, commit.
void save(RunState& s, int rank, int64_t step, Worker& worker, comm::Communicator& comm) {
  Checkpoint c;
  c.meta = CheckpointMeta{model_json(s.mc), s.job.optim.name, s.job.algo.name, s.world}.to_json();
  c.meta["step"] = step;
  c.meta["counters"] = s.counters(rank, comm).to_json();
  c.tensors = worker.state();
  s.checkpoints.write(step, rank, c);
  s.meeting->barrier(rank);  // every rank has written `step`
  s.checkpoints.commit(step, rank);
  s.committed[rank] = step;
}

// The worker loop of one rank: steps, metrics, evaluation, checkpoints, stopping.
void rank_loop(RunState& s, int rank, Worker& worker, comm::Communicator& comm) {
  const auto& job = s.job;
  const double tokens_per_step = static_cast<double>(job.data.batch_size * job.data.seq_len);
  auto say = [&](const std::string& line) {
    if (rank == 0 && !s.quiet) s.progress->println(line);
  };
  auto t_window = std::chrono::steady_clock::now();
  int64_t window_steps = 0, window_computed = 0;
  bool evaluated_last = false;
  int64_t step = s.start_step;
  while (step < s.end_step) {
    StepResult r;
    try {
      r = worker.step();
    } catch (const TrainingDiverged& e) {
      throw TrainingDiverged(e.what(), e.hint() + "; " + s.last_checkpoint(rank));
    }
    ++step;
    ++window_steps;
    window_computed += r.computed ? 1 : 0;
    if (rank == s.reporter) s.summary.train_losses.push_back(r.loss);
    if (step % job.train.log_every == 0 || step == s.end_step) {
      const double dt = seconds_since(t_window);
      const double tps = tokens_per_step * static_cast<double>(window_computed) / std::max(dt, 1e-9);
      const double eta = dt / static_cast<double>(window_steps) * static_cast<double>(s.end_step - step);
      const Counters c = s.counters(rank, comm);
      s.metrics->write({{"event", "train"}, {"step", step}, {"worker", rank}, {"train_loss", r.loss},
                        {"lr", r.lr}, {"computed", r.computed},
                        // A step skipped by its local-step budget had no gradient: null, not 0.
                        {"grad_norm", r.computed ? nlohmann::json(r.grad_norm) : nlohmann::json(nullptr)},
                        {"round_done", r.round_done}, {"tokens_per_s", tps},
                        {"wall_time_s", c.wall_time_s}, {"virtual_time_s", c.virtual_time_s},
                        {"bytes_sent", c.bytes_sent}, {"idle_s", c.idle_s},
                        {"local_steps", worker.local_steps_done()}});
      if (rank == 0 && !s.quiet) s.progress->update(step, r.loss, tps * s.world, r.lr, eta);
      t_window = std::chrono::steady_clock::now();
      window_steps = 0;
      window_computed = 0;
    }
    evaluated_last = false;
    // Evaluation and checkpoint see the model x (GPA); one switch serves both, so that a resumed
    // run, which starts from the checkpoint's x, continues exactly as this one does.
    std::optional<optim::EvalScope> at_x;
    if ((job.train.eval_every > 0 && step % job.train.eval_every == 0) || step == job.train.steps) {
      at_x.emplace(&worker.optimizer());
      const EvalResult e = s.meeting->evaluate(rank, worker, step);
      evaluated_last = true;
      if (rank == s.reporter) s.summary.final_val_loss = e.val_loss;
      if (rank == 0) {
        const Counters c = s.counters(rank, comm);
        // The average model exists at the latest worker clock (in-process: every worker's).
        const double vt = e.virtual_time_s - comm.now() + c.virtual_time_s;
        s.metrics->write({{"event", "eval"}, {"step", step}, {"worker", rank}, {"val_loss", e.val_loss},
                          {"worker_val_loss", e.worker_val_loss}, {"consensus_distance", e.consensus_distance},
                          {"wall_time_s", c.wall_time_s}, {"virtual_time_s", vt}, {"bytes_sent", c.bytes_sent}});
        say(s.world == 1 ? fmt::format("step {:>6} | val_loss {:.4f}", step, e.val_loss)
                         : fmt::format("step {:>6} | val_loss {:.4f} (average model) | consensus {:.3e}", step,
                                       e.val_loss, e.consensus_distance));
      }
    }
    const bool interrupted = s.meeting->should_stop(rank, step, g_stop.load()) && step < s.end_step;
    const bool stopping = interrupted || step == s.end_step;
    if ((job.train.checkpoint_every > 0 && step % job.train.checkpoint_every == 0) || stopping) {
      if (!at_x) at_x.emplace(&worker.optimizer());
      save(s, rank, step, worker, comm);
    }
    at_x.reset();
    if (interrupted) {
      say(fmt::format("interrupted: checkpoint written at step {}; continue with `gasloc train --resume {}`{}", step,
                      s.run_dir.string(), job.cluster.backend == "inproc" ? "" : " under the same launcher"));
      if (rank == s.reporter) s.summary.interrupted = true;
      break;
    }
  }
  if (rank == s.reporter) s.summary.steps_done = step;
  if (step == s.end_step && !evaluated_last) {  // stopped by train.stop_at between evaluations
    optim::EvalScope at_x(&worker.optimizer());
    const EvalResult e = s.meeting->evaluate(rank, worker, step);
    if (rank == s.reporter) s.summary.final_val_loss = e.val_loss;
  }
}

// A new run may not land in a directory that holds another one: its checkpoints would be
// refused at best, its metrics mixed with the new run's at worst.
void check_fresh_run_dir(const fs::path& run_dir, const RunCheckpoints& ckpts, const nlohmann::json& resolved) {
  if (ckpts.any())
    throw CheckpointError("run directory '" + run_dir.string() + "' already holds checkpoints",
                          "continue it with --resume " + run_dir.string() + ", or choose another train.run_dir");
  const fs::path run_json = run_dir / "run.json";
  if (fs::exists(run_json)) {
    auto doc = nlohmann::json::parse(read_file(run_json), nullptr, false);
    if (doc.is_discarded() || doc.value("config", nlohmann::json()) != resolved)
      throw CheckpointError("run directory '" + run_dir.string() + "' holds another run (its run.json has another "
                            "configuration)",
                            "choose another train.run_dir, or remove that directory if the run is not needed");
  } else if (fs::exists(run_dir / "metrics.jsonl")) {
    throw CheckpointError("run directory '" + run_dir.string() + "' holds metrics of an unknown run",
                          "choose another train.run_dir, or remove that directory");
  }
}
}  // namespace

void request_stop() { g_stop.store(true); }

TrainSummary run_training(const TrainRequest& req) {
  // From the start: a Ctrl+C during set-up must stop the run cleanly too, not kill it.
  SignalScope signals;
  const JobConfig job = resolve_job(req);
  const fs::path run_dir = job.train.run_dir;
  if (job.train.threads > 0) torch::set_num_threads(static_cast<int>(job.train.threads));

  const data::Dataset dataset = data::Dataset::open(job.data.dir, job.data.vocab_size, job.data.verify_shards);
  const model::LlamaConfig mc = job.model.resolve(dataset.vocab_size);  // data.seq_len fits: JobConfig::validate

  // Which ranks live in this process: all of them in-process, one under gloo. cluster.timeout_s
  // governs the rendezvous and every operation (gasloc launch --timeout sets it).
  std::unique_ptr<comm::GlooCommunicator> gloo;
  if (job.cluster.backend == "gloo") {
    auto o = comm::gloo_options_from_env();
    o.timeout_s = job.cluster.timeout_s;
    if (job.network.throttle_gloo) {  // the scenario's links, for real: a token bucket per rank
      job.network.validate(o.world);
      o.bandwidth_limit_Bps = job.network.model(o.world).bandwidth(o.rank);
    }
    gloo = std::make_unique<comm::GlooCommunicator>(o);
    job.algo.validate(gloo->world());
  }
  const int world = gloo ? gloo->world() : static_cast<int>(job.cluster.workers);
  const nlohmann::json resolved = resolved_json(job, world);
  if (gloo) agree_on_config(*gloo, resolved);
  const comm::NetworkModel network = job.network.model(world);
  std::vector<int> ranks;
  if (gloo) ranks = {gloo->rank()};
  else for (int r = 0; r < world; ++r) ranks.push_back(r);
  const bool leader = ranks.front() == 0;

  // Load checkpoints before touching the run directory, so a bad resume changes nothing.
  RunCheckpoints ckpts(run_dir, world);
  std::map<int, Checkpoint> loaded;
  int64_t start_step = 0;
  const auto committed = committed_by_rank(ckpts, world, ranks, gloo.get());
  if (!req.resume_dir.empty()) {
    start_step = req.resume_step >= 0 ? req.resume_step : ckpts.resume_step(committed, ranks);
    const CheckpointMeta expected{model_json(mc), job.optim.name, job.algo.name, world};
    for (int r : ranks) {
      const fs::path path = ckpts.file(start_step, r);
      Checkpoint c;
      try {
        c = load_checkpoint(path);
      } catch (const CheckpointError& e) {
        // The previous committed step of this rank is kept for this case.
        std::string hint = e.hint();
        for (int64_t prev : committed[r])
          if (prev < start_step) {
            hint = fmt::format("resume from the previous committed step with `gasloc train --resume {} --resume-step {}`",
                               run_dir.string(), prev);
            break;
          }
        throw CheckpointError(e.what(), hint);
      }
      const auto got = CheckpointMeta::from_json(c.meta);
      if (!(got == expected)) {
        std::string diffs;
        const auto flat_got = got.to_json().flatten(), flat_want = expected.to_json().flatten();
        for (auto& [k, v] : flat_want.items())
          if (flat_got.value(k, nlohmann::json()) != v)
            diffs += fmt::format("{}{} is {} in the checkpoint, {} in this job", diffs.empty() ? "" : "; ",
                                 k.substr(1), flat_got.value(k, nlohmann::json()).dump(), v.dump());
        std::replace(diffs.begin(), diffs.end(), '/', '.');
        throw CheckpointError(fmt::format("checkpoint '{}' differs from this job: {}", path.string(), diffs),
                              "resume with the model, optimizer, algorithm and cluster the run was started with");
      }
      loaded.emplace(r, std::move(c));
    }
  } else {
    check_fresh_run_dir(run_dir, ckpts, resolved);
  }

  if (leader) {
    nlohmann::json run_info = {{"config", resolved},
                               {"model", model_json(mc)},
                               {"world", world},
                               {"seed", job.train.seed},
                               {"dataset", {{"dir", dataset.dir.string()}, {"tokenizer", dataset.tokenizer_kind},
                                            {"train_tokens", dataset.train->size()}, {"val_tokens", dataset.val->size()}}},
                               {"versions", {{"gasloc", "0.1.0"}, {"torch", TORCH_VERSION}}}};
    write_file_atomic(run_dir / "run.json", run_info.dump(2) + "\n");
    if (!req.quiet) print_config(job, mc, world);
  }
  // Every rank's host needs the directory (under Gloo over several hosts each writes its own).
  fs::create_directories(run_dir);
  // Only the leader drops the tail of a crashed run (or all of a run that never reached a
  // checkpoint); the others append after it has.
  std::unique_ptr<MetricsLog> metrics;
  if (leader) {
    if (loaded.empty()) fs::remove(run_dir / "metrics.jsonl");
    metrics = std::make_unique<MetricsLog>(run_dir / "metrics.jsonl", loaded.empty() ? -1 : start_step);
  }
  if (gloo) gloo->barrier();
  if (!leader) metrics = std::make_unique<MetricsLog>(run_dir / "metrics.jsonl");
  const auto val_batches = data::validation_batches(*dataset.val, job.data.batch_size, job.data.seq_len, job.data.val_batches);

  // Communicators and workers.
  std::unique_ptr<comm::SingleRank> single;
  std::unique_ptr<comm::InProcCluster> cluster;
  std::vector<comm::Communicator*> comms;
  if (gloo) {
    comms = {gloo.get()};
  } else if (world == 1) {
    single = std::make_unique<comm::SingleRank>();
    comms = {single.get()};
  } else {
    cluster = std::make_unique<comm::InProcCluster>(world, network, job.cluster.timeout_s);
    for (int r = 0; r < world; ++r) comms.push_back(&cluster->comm(r));
  }
  // Each local rank's counters where its checkpoint left them (zero for a new run). A resumed
  // in-process cluster continues its virtual clocks and counters itself: later prices depend on
  // the clocks, so only the wall time is left to add on top of them.
  std::map<int, Counters> base;
  for (int r : ranks) {
    Counters k = loaded.empty() ? Counters{} : Counters::from_json(loaded.at(r).meta.value("counters", nlohmann::json::object()));
    if (cluster) {
      cluster->restore(r, k.virtual_time_s, {k.bytes_sent, cluster->stats(r).bytes_received, k.idle_s});
      k = {0, 0, k.wall_time_s, 0};
    }
    base[r] = k;
  }
  // Workers that are threads of this process keep the cores busy themselves: by default one BLAS
  // thread each (core/blas_threads.hpp explains the spin this avoids).
  const BlasThreads blas(job.train.blas_threads > 0 ? static_cast<int>(job.train.blas_threads) : ranks.size() > 1 ? 1 : 0);
  if (blas.active() && !req.quiet)
    fmt::print("{} worker thread(s) in this process, {} BLAS thread(s) per product (train.blas_threads)\n", ranks.size(),
               job.train.blas_threads > 0 ? job.train.blas_threads : 1);
  std::vector<std::unique_ptr<Worker>> workers;
  for (size_t i = 0; i < ranks.size(); ++i) {
    workers.push_back(std::make_unique<Worker>(job, mc, dataset, *comms[i],
                                               algo::make_synchronizer(job.algo, world, job.train.seed, &network)));
    if (!loaded.empty()) workers.back()->load_state(loaded.at(ranks[i]).tensors);
  }
  if (!loaded.empty() && leader && !req.quiet) fmt::print("resumed '{}' at step {}\n", run_dir.string(), start_step);
  if (leader) {  // what one worker keeps in memory besides the model, from the tensors it holds
    const Worker& w = *workers.front();
    const int64_t pbytes = w.numel() * 4;
    if (loaded.empty())  // once per run, not again on resume
      metrics->write({{"event", "memory"}, {"step", start_step}, {"worker", ranks.front()}, {"optim", job.optim.name},
                    {"algo", job.algo.name}, {"params", w.numel()}, {"param_bytes", pbytes},
                    {"optimizer_state_bytes", w.optimizer_state_bytes()}, {"sync_state_bytes", w.sync_state_bytes()}});
    if (!req.quiet)
      fmt::print("state per worker: optimizer {:.1f} B/param, algorithm {:.1f} B/param (parameters {:.1f} MB fp32)\n",
                 static_cast<double>(w.optimizer_state_bytes()) / static_cast<double>(w.numel()),
                 static_cast<double>(w.sync_state_bytes()) / static_cast<double>(w.numel()), static_cast<double>(pbytes) / 1e6);
  }

  std::unique_ptr<Meeting> meeting;
  ThreadMeeting* threads_meeting = nullptr;
  if (gloo) {
    meeting = std::make_unique<CommMeeting>(*gloo, &val_batches, job.train.log_every);
  } else {
    std::vector<Worker*> ptrs;
    for (auto& w : workers) ptrs.push_back(w.get());
    auto tm = std::make_unique<ThreadMeeting>(ptrs, &val_batches, job.cluster.timeout_s);
    threads_meeting = tm.get();
    meeting = std::move(tm);
  }

  Progress progress(job.train.steps);
  RunState state{job, mc, run_dir, ckpts, world, req.quiet, start_step,
                 job.train.stop_at > 0 ? job.train.stop_at : job.train.steps, metrics.get(), &progress, meeting.get(),
                 std::chrono::steady_clock::now()};
  state.reporter = ranks.front();
  state.summary.run_dir = run_dir.string();
  state.summary.final_val_loss = std::numeric_limits<double>::quiet_NaN();
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    state.base[r] = base.at(r);
    // The cluster's restored counters are the run's own; a process group's start from here.
    state.stats0[r] = cluster ? comm::CommStats{} : comms[i]->stats();
    state.clock0[r] = cluster ? 0.0 : comms[i]->now();
    state.committed[r] = committed[r].empty() ? -1 : committed[r].front();
  }
  if (cluster) {
    // A failing worker wakes the others; its own error is the one reported.
    std::mutex first_mu;
    std::exception_ptr first;
    try {
      cluster->run([&](int r, comm::Communicator& c) {
        try {
          rank_loop(state, r, *workers[r], c);
        } catch (const std::exception& e) {
          {
            std::lock_guard<std::mutex> lock(first_mu);
            if (!first) first = std::current_exception();
          }
          threads_meeting->fail(fmt::format("worker {} failed: {}", r, e.what()));
          throw;
        }
      });
    } catch (...) {
      if (first) std::rethrow_exception(first);
      throw;
    }
  } else {
    try {
      rank_loop(state, ranks.front(), *workers.front(), *comms.front());
    } catch (const CommError&) {
      throw;  // a peer's failure: the communicator has already recorded who failed first
    } catch (const std::exception& e) {
      // This rank fails for its own reason: say so before its connections close.
      if (gloo) gloo->record_own_failure(fmt::format("rank {} failed: {}", ranks.front(), e.what()));
      throw;
    }
  }
  if (leader && !req.quiet) progress.finish();
  return state.summary;
}

}  // namespace gasloc::train
