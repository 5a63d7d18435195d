// How the workers of one run meet outside their algorithm: to evaluate (the average model, each
// worker's own model, the consensus distance) and to agree on where to stop after Ctrl+C. Every
// meeting goes over the ranks' control channels (comm/cluster.hpp), which cost no virtual time
// and are not counted in the reported traffic, so the in-process cluster and a process group
// report the same metrics.
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

#include "gasloc/comm/communicator.hpp"
#include "gasloc/data/sampler.hpp"
#include "gasloc/train/worker.hpp"

namespace gasloc::train {

struct EvalResult {
  double val_loss = 0.0;                // the average model, mean_i phi_i
  std::vector<double> worker_val_loss;  // each worker's own model, by rank
  double consensus_distance = 0.0;      // mean_i ||phi_i - mean phi||^2
  double virtual_time_s = 0.0;          // when the average model exists: the latest worker clock
  std::vector<int> members;             // elastic: the workers holding a model (worker_val_loss's order); empty: all
  int reporter = 0;                     // the worker that reports it: 0, or the lowest member
};

// One per process, shared by the ranks it hosts.
class Meeting {
 public:
  // `local_ranks` of `world` live in this process; processes agree on a stop every
  // `stop_check_every` steps.
  Meeting(const std::vector<data::Batch>* val, int local_ranks, int world, int64_t stop_check_every);
  // Collective over the control channels: every rank calls it at the same step. In an elastic run
  // the average and the consensus are over the workers that hold a model (Synchronizer::holders).
  EvalResult evaluate(comm::Communicator& control, Worker& worker);
  // Called by every rank after every step; true when this rank must stop after `step`.
  // All ranks stop after the same step.
  bool should_stop(comm::Communicator& control, int64_t step, bool stop_requested);

 private:
  const std::vector<data::Batch>* val_;
  const bool one_process_;
  const int64_t check_every_;
  std::mutex mu_;
  int64_t max_step_ = 0, stop_step_ = -1;
};

}  // namespace gasloc::train
