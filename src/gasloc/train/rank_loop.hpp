// The loop of one rank: steps, train lines and progress, view changes, evaluations, the stop
// after Ctrl+C and checkpoints, the same on every kind of cluster (what the ranks agree on goes
// through Coordination).
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "gasloc/comm/cluster.hpp"
#include "gasloc/train/checkpoint.hpp"
#include "gasloc/train/coordination.hpp"
#include "gasloc/train/metrics.hpp"
#include "gasloc/train/run.hpp"
#include "gasloc/train/trainer.hpp"
#include "gasloc/train/worker.hpp"

namespace gasloc::train {

double seconds_since(std::chrono::steady_clock::time_point t0);

// What the ranks of this process share during a run.
struct RunState {
  const Run& run;
  const JobConfig& job;
  RunCheckpoints checkpoints;
  bool quiet = false;
  int64_t start_step = 0, end_step = 0;
  MetricsLog* metrics = nullptr;
  Progress* progress = nullptr;
  Coordination* coord = nullptr;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  int reporter = 0;                       // the rank that fills `summary` (the lowest rank in this process)
  std::map<int, Counters> base;           // each local rank's counters at the start of this invocation
  std::map<int, comm::CommStats> stats0;  // and its communicator's stats then
  std::map<int, double> clock0;
  double eval_price_s = 0;                // what one evaluation of the average model costs on the virtual clock
  std::map<int, double> eval_time;        // each local rank's evaluations so far in this invocation, priced
  std::map<int, int64_t> committed;       // each local rank's last committed step (-1: none)
  TrainSummary summary;

  // `compute_wall_s`: the rank's wall seconds of computing in this invocation, its compute time
  // where the clock is real.
  Counters counters(int rank, const comm::Communicator& comm, double compute_wall_s) const;
  std::string last_checkpoint(int rank) const;
  void say(int rank, const std::string& line) const;
};

// Each local rank's counters where its checkpoint left them (zero for a new run), and its last
// committed step (`committed`). A resumed in-process cluster continues its virtual clocks and
// counters itself: later prices depend on the clocks, so only the wall time is left to add on top
// of them.
void restore_counters(RunState& state, comm::Cluster& cluster, const std::map<int, Checkpoint>& loaded,
                      const std::map<int, int64_t>& committed);

// The worker loop of one rank, from state.start_step to state.end_step or an agreed stop.
void rank_loop(RunState& s, int rank, Worker& worker, comm::Communicator& comm);

}  // namespace gasloc::train
