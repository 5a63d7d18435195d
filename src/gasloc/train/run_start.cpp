#include "gasloc/train/run_start.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "gasloc/algo/registry.hpp"
#include "gasloc/core/cpus.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/secret.hpp"

namespace gasloc::train {

namespace {

// The job this process presents to the rendezvous store: --job-id (gasloc launch's token, or a
// `gasloc store`'s job), or, for ranks started by hand, one derived from train.run_dir as given
// (the one thing every rank of a job shares that two jobs on one host cannot). Not from every
// setting: ranks of one job whose settings differ must meet, so that agree_on_config names the
// key that differs.
comm::JobIdentity job_identity(const TrainRequest& req, const JobConfig& job) {
  if (!req.job_id.empty()) return {req.job_id, "--job-id " + req.job_id, {}};
  return {comm::derive_job_token("gasloc train run_dir=" + job.train.run_dir), "gasloc train run_dir=" + job.train.run_dir, {}};
}

}  // namespace

std::unique_ptr<comm::Cluster> open_cluster(const TrainRequest& req, const JobConfig& job) {
  // cluster.timeout_s governs the rendezvous and every operation (gasloc launch --timeout sets
  // it); with network.throttle_gloo a process rank's real link is held to the scenario's.
  comm::ClusterOptions o{job.cluster.backend, static_cast<int>(job.cluster.workers), job.cluster.timeout_s,
                         [&job](int w) { return job.network.model(w); }, job.network.throttle_gloo};
  o.job = job_identity(req, job);
  // Only a process backend meets through the store; its secret is read (and checked) here.
  if (!job.cluster.secret_file.empty() && job.cluster.backend.str() != "inproc")
    o.job.secret = read_secret_file(job.cluster.secret_file);
  o.handed_in = !req.job_id.empty();
  o.store_all_interfaces = job.cluster.store_all_interfaces;
  o.elastic = job.cluster.elastic;
  o.heartbeat_timeout_s = job.cluster.heartbeat_timeout_s;
  o.incarnation = req.incarnation;
  o.join = job.cluster.join;
  return comm::make_cluster(o);
}

namespace {

// Every rank's committed steps as one list for a message: "rank 0: 40, 30; rank 1: 30".
std::string committed_text(const std::vector<std::vector<int64_t>>& committed) {
  std::string out;
  for (size_t r = 0; r < committed.size(); ++r)
    out += fmt::format("{}rank {}: {}", r ? "; " : "", r,
                       committed[r].empty() ? std::string("none") : fmt::format("{}", fmt::join(committed[r], ", ")));
  return out;
}

// --resume-step: a step some rank committed (its commit proves that every rank wrote it).
int64_t checked_resume_step(int64_t step, const std::vector<std::vector<int64_t>>& committed) {
  for (const auto& c : committed)
    if (std::find(c.begin(), c.end(), step) != c.end()) return step;
  throw CheckpointError(fmt::format("--resume-step {} is not a committed checkpoint of this run (committed: {})", step,
                                    committed_text(committed)),
                        "give one of the committed steps");
}

// --repair: the newest step every rank still holds once the damaged ones are dropped.
int64_t common_step(const std::vector<std::vector<int64_t>>& committed, const Run& run) {
  for (int64_t s : committed.front())
    if (std::all_of(committed.begin(), committed.end(), [s](const auto& c) { return std::find(c.begin(), c.end(), s) != c.end(); }))
      return s;
  throw CheckpointError(fmt::format("no step of '{}' is held by every rank after the repair (committed: {})",
                                    run.dir().string(), committed_text(committed)),
                        "the run cannot continue as it was; start it again in a new train.run_dir");
}

}  // namespace

// Where a new run starts, or a resumed one continues, and what it loads. A directory whose run
// died during its first checkpoint (files written, nothing committed) starts over.
int64_t prepare_start(const TrainRequest& req, const Run& run, const RunCheckpoints& ckpts, const std::vector<int>& ranks,
                      const std::vector<std::vector<int64_t>>& committed, comm::Communicator* processes,
                      std::map<int, Checkpoint>& loaded, bool own_files_only) {
  if (!req.resume_dir.empty()) {
    const int64_t step = req.resume_step >= 0 ? checked_resume_step(req.resume_step, committed)
                         : req.repair         ? common_step(committed, run)
                                              : ckpts.resume_step(committed, ranks);
    for (int r : ranks) loaded.emplace(r, run.load(ckpts, step, r, committed[r]));
    int64_t newest = -1;
    for (const auto& c : committed)
      if (!c.empty()) newest = std::max(newest, c.front());
    if (newest > step && ranks.front() == 0 && !req.quiet)
      fmt::print("resuming '{}' at step {}: its committed step {} is dropped at this run's first checkpoint (steps {}..{} "
                 "are trained again)\n",
                 run.dir().string(), step, newest, step + 1, newest);
    return step;
  }
  const bool nothing_committed = std::all_of(committed.begin(), committed.end(), [](const auto& c) { return c.empty(); });
  const std::vector<int>* own = own_files_only ? &ranks : nullptr;
  if (nothing_committed && ckpts.any(own)) {
    for (int r : ranks) ckpts.discard_uncommitted(r);
    if (processes) processes->barrier();  // every rank's files are gone before anyone looks
    if (ranks.front() == 0 && !req.quiet)
      fmt::print("'{}' holds no committed checkpoint (its run stopped during its first one): starting over\n",
                 run.dir().string());
  }
  run.check_fresh(ckpts, own);
  return 0;
}

// The BLAS threads of one product (train.blas_threads when set). Workers that are threads of
// this process keep the cores busy themselves: one each (core/blas_threads.hpp explains the spin
// this avoids); batch streams are such threads too. Processes of one job on one host share its
// cores: each takes its share, instead of OpenBLAS's default of every core (4 Gloo ranks on 2
// cores ran 1.16x slower so, docs/performance.md). 0: OpenBLAS's own count.
int planned_blas_threads(const JobConfig& job, int local_workers, int host_processes) {
  if (job.train.blas_threads > 0) return static_cast<int>(job.train.blas_threads);
  if (local_workers > 1 || job.train.streams > 1) return 1;
  if (host_processes > 1) return std::max(1, usable_cpus() / host_processes);
  return 0;
}

void print_thread_plan(const JobConfig& job, int local_workers, int host_processes, bool auto_streams) {
  const std::string blas = job.train.blas_threads > 0 ? fmt::format("{} BLAS thread(s) per product (train.blas_threads)",
                                                                    job.train.blas_threads)
                                                      : fmt::format("{} BLAS thread(s) per product",
                                                                    planned_blas_threads(job, local_workers, host_processes));
  if (host_processes > 1 && local_workers == 1 && job.train.streams == 1) {
    fmt::print("{} processes of this job on this host (LOCAL_WORLD_SIZE) share its {} cores: {} each{}\n", host_processes,
               usable_cpus(), blas, job.train.blas_threads > 0 ? "" : " (train.blas_threads overrides)");
    return;
  }
  fmt::print("{} worker thread(s) in this process{}, {}\n", local_workers,
             job.train.streams > 1 ? fmt::format(" with {} batch streams each (train.streams{})", job.train.streams,
                                                 auto_streams ? " = 0: one per core for a worker alone" : "")
                                   : "",
             blas);
}

// LibTorch's OpenMP threads spin between operations on the cores OpenBLAS's own threads need.
void warn_two_pools(const JobConfig& job) {
  fmt::print("warning: train.threads = {} beside OpenBLAS's own threads: the two pools compete for the cores (3x to 5x "
             "fewer tokens/s measured at the tiny and micro presets on 2 cores, docs/performance.md); leave "
             "train.threads at 0, or set train.blas_threads = 1\n",
             job.train.threads);
}

// What one worker keeps in memory besides the model, from the tensors it holds: in metrics once
// per run (not again on resume), and on the terminal.
std::string data_coverage(int64_t train_tokens, int world, int64_t steps, int64_t batch_size, int64_t seq_len, bool disjoint) {
  const double drawn = static_cast<double>(steps) * static_cast<double>(batch_size) * static_cast<double>(seq_len + 1);
  const double n = static_cast<double>(train_tokens);
  if (disjoint) {
    const double slice = n / world;
    const double passes = drawn / slice;
    return fmt::format("data: {} training tokens in {} disjoint slices of ~{:.0f} tokens; each worker draws up to {:.0f} tokens "
                       "({} steps x {} windows of {} tokens, random starts) from its own slice: {:.3g} passes over it{}",
                       train_tokens, world, slice, drawn, steps, batch_size, seq_len + 1, passes,
                       passes > 1 ? ", so its windows repeat" : "");
  }
  const double all = drawn * world / n;
  return fmt::format("data: {} training tokens shared by {} worker(s); each draws up to {:.0f} tokens ({} steps x {} windows of "
                     "{} tokens, random starts over the whole stream, its own seed): {:.3g} passes each, {:.3g} for all "
                     "together{}",
                     train_tokens, world, drawn, steps, batch_size, seq_len + 1, drawn / n, all,
                     all > 1 ? ", so windows repeat across workers" : "");
}

void report_worker_memory(const Worker& w, const JobConfig& job, MetricsLog& metrics, int rank, int64_t step, bool resumed,
                          bool quiet) {
  const int64_t pbytes = w.numel() * 4;
  if (!resumed)
    metrics.write(MemoryEvent{.step = step,
                              .worker = rank,
                              .optim = job.optim.name,
                              .algo = job.algo.name,
                              .params = w.numel(),
                              .param_bytes = pbytes,
                              .optimizer_state_bytes = w.optimizer_state_bytes(),
                              .sync_state_bytes = w.sync_state_bytes()});
  if (!quiet)
    fmt::print("state per worker: optimizer {:.1f} B/param, algorithm {:.1f} B/param (parameters {:.1f} MB fp32)\n",
               static_cast<double>(w.optimizer_state_bytes()) / static_cast<double>(w.numel()),
               static_cast<double>(w.sync_state_bytes()) / static_cast<double>(w.numel()), static_cast<double>(pbytes) / 1e6);
}

namespace {

// The round time of an unimpeded worker on the virtual clock, H s + C: what turns faults given
// in seconds into rounds.
double unimpeded_round_seconds(const JobConfig& job, const model::LlamaConfig& mc, const comm::NetworkModel& network,
                               int world) {
  const auto& entry = algo::algorithm(job.algo.name.str());
  const algo::SyncContext c{job.algo, entry, world, static_cast<uint64_t>(job.train.seed), &network, nullptr};
  const torch::ScalarType wire = entry.sends_gradients ? torch::kFloat32 : c.wire();
  return c.round_seconds(mc.num_params() * static_cast<int64_t>(c10::elementSize(wire)));
}

}  // namespace

// The membership of an elastic in-process run, saying how faults given in seconds landed.
std::optional<algo::Membership> fault_membership(const JobSetup& s, const algo::Arrivals& arrivals) {
  if (!s.job.faults.by_time() || s.coord.store_views()) return s.job.membership(s.world, 0, arrivals);
  const double round_s = unimpeded_round_seconds(s.job, s.mc, s.network, s.world);
  auto m = s.job.membership(s.world, round_s, arrivals);
  if (s.leader && !s.req.quiet && m) {
    std::string where;
    const auto& events = m->events();
    for (size_t i = 0; i < std::min<size_t>(events.size(), 8); ++i)
      where += fmt::format("{}worker {} at round {}", i ? ", " : "", events[i].id, events[i].round);
    if (events.size() > 8) where += fmt::format(", ... ({} in all)", events.size());
    fmt::print("faults in seconds: a round takes {:.2f} s on an unimpeded worker's clock; deaths: {}\n", round_s,
               where.empty() ? "none" : where);
  }
  return m;
}

// An id beyond the workers that saved a resumed run holds, until it is healed at its arrival
// round's merge, its donor's checkpoint under its own random generator: its round and step are
// then the job's, and what it holds is the state it will receive.
void stand_in_for_arrival(Worker& w, int id, const RunStart& start, const algo::Membership& membership) {
  const int donor = membership.view(start.arrivals.at(id)).donor(id);
  StateDict state = start.loaded.at(donor).tensors;
  state["rng.cpu"] = w.state().at("rng.cpu");
  w.load_state(state);
}

// --repair: each local rank's checkpoints checked (files present, checksums right), and every
// thing dropped named.
void repair_checkpoints(const JobSetup& s, const RunCheckpoints& ckpts) {
  for (int r : s.ranks) {
    const auto dropped = ckpts.repair(r);
    for (const auto& line : dropped) fmt::print("repair: {}\n", line);
    if (dropped.empty() && !s.req.quiet) fmt::print("repair: rank {}: its committed checkpoints load; nothing dropped\n", r);
  }
}

// The workers this process hosts, before its cluster exists to say so: the in-process cluster
// hosts every one of cluster.workers, a process backend one rank.
int workers_in_this_process(const JobConfig& job) {
  return job.cluster.backend == "inproc" ? static_cast<int>(job.cluster.workers) : 1;
}

}  // namespace gasloc::train
