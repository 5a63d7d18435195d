// How the workers of one run meet outside their algorithm: to evaluate (the average model, each
// worker's own model, the consensus distance) and to agree on where to stop after Ctrl+C. Every
// meeting goes over the ranks' control channels (comm/cluster.hpp), which cost no virtual time
// and are not counted in the reported traffic, so the in-process cluster and a process group
// report the same metrics. What an evaluation of the average model would cost on the network
// is priced apart (eval_seconds), beside the algorithm's clock.
//
// train.eval_model = "local" evaluates each worker's own model and sends no model anywhere.
// In one process (the in-process cluster) the ranks leave their losses in this shared object and
// the last to arrive reports the mean over the workers holding a model, with no collective. A
// process rank cannot see the others' losses without one, so each reports its own line.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "gasloc/comm/network_model.hpp"
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
  int reporter = 0;                     // the worker named on the line: 0, or the lowest member (local over processes: itself)
  bool reports = false;                 // this rank writes the line
};

// Seconds an all-reduce of the average model (`params` fp32 values over `world` workers) takes
// on `network`: what an evaluation of the average model costs. 0 for one worker.
double eval_seconds(const comm::NetworkModel& network, int64_t params, int world);

// One per process, shared by the ranks it hosts.
class Meeting {
 public:
  // `local_ranks` of `world` live in this process; processes agree on a stop every
  // `stop_check_every` steps.
  // `local`: train.eval_model = "local" (each worker's own model, no collective).
  Meeting(const std::vector<data::Batch>* val, int local_ranks, int world, int64_t stop_check_every, bool local = false);
  // Every rank calls it at the same step. The average model: collective over the control
  // channels; in an elastic run the average and the consensus are over the workers that hold a
  // model (Synchronizer::holders). Local: no collective (see the file comment), no consensus
  // distance (NaN), val_loss the mean of the holders' own losses.
  EvalResult evaluate(comm::Communicator& control, Worker& worker, int64_t step);
  // Called by every rank after every step; true when this rank must stop after `step`.
  // All ranks stop after the same step.
  bool should_stop(comm::Communicator& control, int64_t step, bool stop_requested);

 private:
  const std::vector<data::Batch>* val_;
  const bool one_process_;
  const int64_t check_every_;
  const bool local_;
  std::mutex mu_;
  int64_t max_step_ = 0, stop_step_ = -1;
  // Local evaluations in one process, by step: each rank's own loss and clock as they arrive.
  struct LocalEval {
    std::vector<std::optional<double>> loss;  // by rank; nullopt: holds no model
    std::vector<double> clock;
    int arrived = 0;
  };
  std::map<int64_t, LocalEval> local_evals_;
  EvalResult evaluate_average(comm::Communicator& control, Worker& worker, const std::vector<int>& members, bool elastic);
  EvalResult evaluate_local(comm::Communicator& control, Worker& worker, const std::vector<int>& members, int64_t step);
};

}  // namespace gasloc::train
