// The run's start (trainer.cpp's steps before the ranks' loops): the cluster, where the run
// starts or resumes, the thread plan, in-process arrivals and faults given in seconds.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gasloc/algo/membership.hpp"
#include "gasloc/comm/cluster.hpp"
#include "gasloc/comm/network_model.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/coordination.hpp"
#include "gasloc/train/metrics.hpp"
#include "gasloc/train/run.hpp"
#include "gasloc/train/trainer.hpp"
#include "gasloc/train/worker.hpp"

namespace gasloc::train {

// What this process settled about the job before the run directory is touched, read by the steps after.
struct JobSetup {
  const TrainRequest& req;
  const JobConfig& job;
  const data::Dataset& dataset;
  const model::LlamaConfig& mc;
  comm::Cluster& cluster;
  const Run& run;
  comm::Communicator* processes;  // nullptr when every rank lives in this process (or it has no collective)
  Coordination& coord;            // what the ranks agree on, and how
  const comm::NetworkModel& network;
  const std::vector<int>& ranks;  // the ranks in this process
  int world;
  bool leader, joiner, auto_streams;
};

// Where the run directory leaves this invocation: its checkpoints, what each local rank loads
// (nothing for a new run or a joiner), and what the ranks write and evaluate on.
struct RunStart {
  const RunCheckpoints& ckpts;
  const std::map<int, Checkpoint>& loaded;
  const algo::Arrivals& arrivals;  // in-process ranks beyond the workers that saved the run: they join
  const std::vector<std::vector<int64_t>>& committed;
  int64_t step;
  MetricsLog* metrics;
  const std::vector<data::Batch>& val_batches;
  bool resumed = false;  // a resumed run (a rank that heals holds no checkpoint of its own, though)
  bool heals = false;    // an elastic rank that resumes without the agreed step: healed by a donor
};

// The ranks this process hosts (cluster.backend, cluster.timeout_s, the network, elastic options).
std::unique_ptr<comm::Cluster> open_cluster(const TrainRequest& req, const JobConfig& job);
// The workers this process hosts, before its cluster exists to say so (the memory check).
int workers_in_this_process(const JobConfig& job);

// Where a new run starts (0), or a resumed one continues, with what `ranks` load put in `loaded`.
// A directory whose run died during its first checkpoint (files written, nothing committed)
// starts over. `own_files_only`: look at `ranks`' files only (an elastic rank: peers that started
// before it may train already).
int64_t prepare_start(const TrainRequest& req, const Run& run, const RunCheckpoints& ckpts, const std::vector<int>& ranks,
                      const std::vector<std::vector<int64_t>>& committed, comm::Communicator* processes,
                      std::map<int, Checkpoint>& loaded, bool own_files_only);
// --repair: each local rank's checkpoints checked, and every thing dropped named.
void repair_checkpoints(const JobSetup& s, const RunCheckpoints& ckpts);

// The BLAS threads of one product; 0: OpenBLAS's own count.
int planned_blas_threads(const JobConfig& job, int local_workers, int host_processes);
void print_thread_plan(const JobConfig& job, int local_workers, int host_processes, bool auto_streams);
void warn_two_pools(const JobConfig& job);
// What one worker keeps in memory besides the model: in metrics once per run, and on the terminal.
void report_worker_memory(const Worker& w, const JobConfig& job, MetricsLog& metrics, int rank, int64_t step, bool resumed,
                          bool quiet);

// What the workers draw from `train_tokens` training tokens over `steps` steps of `batch_size`
// windows of seq_len + 1 tokens (data/sampler.hpp: i.i.d. window starts over the whole stream, or
// over each worker's own slice with disjoint sampling): printed at the start of a run, so that a
// large world reusing a small corpus is never silent.
std::string data_coverage(int64_t train_tokens, int world, int64_t steps, int64_t batch_size, int64_t seq_len, bool disjoint);

// The job's membership (elastic in-process runs), saying how faults given in seconds landed.
std::optional<algo::Membership> fault_membership(const JobSetup& s, const algo::Arrivals& arrivals);
// An in-process id beyond the workers that saved a resumed run: its donor's checkpoint until it is healed.
void stand_in_for_arrival(Worker& w, int id, const RunStart& start, const algo::Membership& membership);

}  // namespace gasloc::train
