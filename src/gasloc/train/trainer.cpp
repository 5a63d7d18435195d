#include "gasloc/train/trainer.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <limits>
#include <optional>

#include "gasloc/algo/compression.hpp"
#include "gasloc/algo/registry.hpp"
#include "gasloc/comm/cluster.hpp"
#include "gasloc/core/blas_threads.hpp"
#include "gasloc/core/cpu_block_cache.hpp"
#include "gasloc/core/cpus.hpp"
#include "gasloc/train/compute_gate.hpp"
#include "gasloc/train/coordination.hpp"
#include "gasloc/train/host_fit.hpp"
#include "gasloc/train/metrics.hpp"
#include "gasloc/train/rank_loop.hpp"
#include "gasloc/train/run.hpp"
#include "gasloc/train/run_lock.hpp"
#include "gasloc/train/run_start.hpp"
#include "gasloc/train/signals.hpp"
#include "gasloc/train/worker.hpp"

// The run's steps, in order: run_training (the job, the data, the cluster, the coordination, the
// configuration agreed), train_in_run_dir (the run directory's lock, where the run starts or
// resumes, its files), train_workers (BLAS threads, workers), run_rank_loops (every local rank's
// loop, rank_loop.cpp). What the ranks agree on goes through Coordination (coordination.hpp),
// chosen once in run_training: nothing below asks which kind of cluster it runs on.

namespace gasloc::train {

namespace {

// The ranks' loops, from the step this invocation starts at (a joiner's: where it joined) to the end.
TrainSummary run_rank_loops(const JobSetup& s, const RunStart& start,
                            const std::vector<std::unique_ptr<Worker>>& workers, int64_t joined_at) {
  const JobConfig& job = s.job;
  const std::vector<int>& ranks = s.ranks;
  s.coord.open_evaluation(start.val_batches);
  Progress progress(job.train.steps);
  const int64_t end_step = job.train.stop_at > 0 ? job.train.stop_at : job.train.steps;
  RunState state{s.run, job, start.ckpts, s.req.quiet, joined_at, end_step, start.metrics, &progress, &s.coord};
  state.reporter = ranks.front();
  // A process's real clock already holds its evaluations; the virtual clock leaves them out (the
  // algorithm's clock stays the algorithm's), so they are counted beside it.
  if (s.cluster.comm(ranks.front()).virtual_clock() && job.train.eval_model == "average")
    state.eval_price_s = eval_seconds(s.network, workers.front()->numel(), s.world);
  state.summary.run_dir = s.run.dir().string();
  state.summary.final_val_loss = std::numeric_limits<double>::quiet_NaN();
  if (joined_at < 0) {
    fmt::print("worker {}: the job finished before it could rejoin\n", ranks.front());
    state.summary.ended_before_join = true;
    return state.summary;
  }
  std::map<int, int64_t> last_committed;
  for (int r : ranks)
    last_committed[r] = start.committed[r].empty() || s.joiner || start.heals ? -1 : start.committed[r].front();
  restore_counters(state, s.cluster, start.loaded, last_committed);
  std::map<int, Worker*> by_rank;
  for (size_t i = 0; i < ranks.size(); ++i) by_rank[ranks[i]] = workers[i].get();
  s.cluster.run([&](int r, comm::Communicator& c) { rank_loop(state, r, *by_rank.at(r), c); });
  // A rank still waiting to join learns that the job finished (not that it lost every member).
  if (state.summary.steps_done == end_step && !state.summary.interrupted) s.coord.finished(end_step);
  if (s.leader && !s.req.quiet) progress.finish();
  return state.summary;
}

// This process's BLAS threads and workers (on a resume, from their checkpoints), then their loops.
TrainSummary train_workers(const JobSetup& s, const RunStart& start) {
  const JobConfig& job = s.job;
  const std::vector<int>& ranks = s.ranks;
  const BlasThreads blas(planned_blas_threads(job, static_cast<int>(ranks.size()), s.cluster.host_processes()));
  if (blas.active() && s.req.verbose)
    print_thread_plan(job, static_cast<int>(ranks.size()), s.cluster.host_processes(), s.auto_streams);
  if (s.leader && !s.req.quiet && job.train.device == "cpu" && job.train.threads > 1 && !blas.active())
    warn_two_pools(job);
  const std::optional<algo::Membership> membership = fault_membership(s, start.arrivals);
  const algo::Membership* views = s.coord.store_views();
  if (!views && membership) views = &*membership;
  const int slots = planned_compute_slots(job, static_cast<int>(ranks.size()));
  std::optional<ComputeGate> gate;
  if (slots > 0) gate.emplace(slots);
  // Workers that share the cores are hundreds of threads: their freed tensors are kept for the
  // next of the same size (core/cpu_block_cache.hpp). Made before the workers, gone after them.
  std::optional<CpuBlockCache> block_cache;
  if (gate) block_cache.emplace(block_cache_bytes(s.mc, job, static_cast<int64_t>(ranks.size()), slots));
  std::vector<std::unique_ptr<Worker>> workers;
  for (size_t i = 0; i < ranks.size(); ++i) {
    workers.push_back(
        std::make_unique<Worker>(job, s.mc, s.dataset, s.cluster.comm(ranks[i]),
                                 algo::make_synchronizer(job.algo, s.world, job.train.seed, &s.network, views, job.faults.poisons())));
    workers.back()->share_cores(gate ? &*gate : nullptr);
    if (start.loaded.contains(ranks[i])) workers.back()->load_state(start.loaded.at(ranks[i]).tensors);
    else if (start.arrivals.contains(ranks[i])) stand_in_for_arrival(*workers.back(), ranks[i], start, *membership);
  }
  if (start.resumed && s.leader && !s.req.quiet) fmt::print("resumed '{}' at step {}\n", s.run.dir().string(), start.step);
  if (s.leader)
    report_worker_memory(*workers.front(), job, *start.metrics, ranks.front(), start.step, start.resumed, s.req.quiet);
  const int64_t joined_at = s.coord.join(*workers.front(), {start.step, start.heals});
  return run_rank_loops(s, start, workers, joined_at);
}

// One job per run directory, for the run's whole life; then the checkpoints, before anything in
// the directory changes, so that a bad resume changes nothing. A joiner loads none: it takes a
// running worker's state.
TrainSummary train_in_run_dir(const JobSetup& s) {
  const JobConfig& job = s.job;
  const RunDirLock lock(s.run.dir(), s.ranks);
  const int saved = !s.req.resume_dir.empty() && !s.joiner ? s.run.check_resume_world(s.ranks.front() == 0) : s.world;
  RunCheckpoints ckpts(s.run.dir(), s.world);
  std::map<int, Checkpoint> loaded;
  if (s.req.repair && !s.joiner) repair_checkpoints(s, ckpts);
  const auto committed = committed_by_rank(ckpts, s.world, s.ranks, s.processes);
  std::vector<int> with_checkpoint, arriving;
  for (int r : s.ranks) (r < saved ? with_checkpoint : arriving).push_back(r);
  const bool resumed = !s.req.resume_dir.empty();
  const StartPoint at = s.coord.agree_start({s.req, s.run, ckpts, with_checkpoint, arriving, saved, committed}, loaded);
  algo::Arrivals arrivals;
  for (int r : arriving) arrivals[r] = algo::algorithm(job.algo.name).rounds_in(at.step, job.algo.H);
  if (s.leader) {
    if (s.req.verbose) s.run.print();
    else if (!s.req.quiet) s.run.print_summary();
  }
  const auto metrics = s.coord.open_metrics(s.run, s.dataset, resumed, !loaded.empty(), at.step);
  // What this resume changed (--allow-change), at the step it takes effect.
  if (s.leader && resumed && !s.joiner)
    for (const SettingChange& c : s.run.changes())
      metrics->write(ConfigChangeEvent{at.step, s.ranks.front(), c.key, c.old_value, c.new_value});
  const auto val_batches =
      data::validation_batches(*s.dataset.val, job.data.batch_size, job.data.seq_len, job.data.val_batches);
  RunStart start{ckpts, loaded, arrivals, committed, at.step, metrics.get(), val_batches};
  start.resumed = resumed && !s.joiner;
  start.heals = at.heals;
  return train_workers(s, start);
}

}  // namespace

TrainSummary run_training(const TrainRequest& req) {
  // From the start: a Ctrl+C during set-up must stop the run cleanly too, not kill it.
  SignalScope signals;
  std::vector<SettingChange> changes;
  JobConfig job = resolve_job(req, &changes);
  check_rounds_fit(job);
  if (job.train.threads > 0) torch::set_num_threads(static_cast<int>(job.train.threads));

  const data::Dataset dataset = data::Dataset::open(job.data.dir, job.data.vocab_size, job.data.verify_shards);
  const model::LlamaConfig mc = job.model.resolve(dataset.vocab_size);  // data.seq_len fits: JobConfig::validate
  algo::check_compression_for_model(job.algo, mc.num_params());  // the chunk against the model, once its size is known
  const std::string memory = check_memory(mc, job, workers_in_this_process(job));
  // A compressed round's messages are priced by their size against the simulated model's.
  if (job.algo.compression != "none") job.network.parameter_message_bytes = mc.num_params() * job.network.simulated_element_bytes;

  // Which ranks live in this process: all of them in-process, one per process otherwise.
  const auto cluster = open_cluster(req, job);
  const int world = cluster->world();
  job.algo.validate(world);
  // The thread plan: run.json records the stream count the run used (a resume keeps it).
  const bool auto_streams = job.train.streams == 0;
  job.train.streams = planned_streams(job.train.streams, job.train.device, job.data.batch_size, world,
                                      usable_cpus());
  const Run run(job, mc, world, changes);
  comm::Communicator* processes = cluster->processes();
  const auto coord = make_coordination(*cluster, job);
  coord->agree_config(run.resolved(), dataset.fingerprint);
  const comm::NetworkModel network = job.network.model(world);
  const std::vector<int>& ranks = cluster->local_ranks();
  if (coord->leader() && !req.quiet) {
    fmt::print("{}\n", data_coverage(dataset.train->size(), world, job.train.steps, job.data.batch_size, job.data.seq_len,
                                     job.data.sampling == "disjoint"));
    const int slots = planned_compute_slots(job, static_cast<int>(ranks.size()));
    if (ranks.size() > 1 && !memory.empty())
      fmt::print("{}{}\n", memory, slots > 0 ? fmt::format("; {} of them compute at once (cluster.compute_slots)", slots) : "");
  }
  // Each step calls the next, so that what a step holds (the set-up here, the run directory's
  // lock, the BLAS threads, the workers) outlives the steps after it and is let go in reverse.
  return train_in_run_dir({req, job, dataset, mc, *cluster, run, processes, *coord, network, ranks, world,
                           coord->leader(), coord->joiner(), auto_streams});
}

}  // namespace gasloc::train
