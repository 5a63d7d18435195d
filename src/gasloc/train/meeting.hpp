// How the workers of one run meet outside their algorithm: to evaluate (the average model, each
// worker's own model, the consensus distance) and to agree on where to stop after Ctrl+C.
//
// In-process clusters meet through shared memory, so evaluation costs no virtual time and no
// simulated bytes. Real process groups meet through their Communicator; the bytes that costs
// are subtracted from the reported traffic.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <vector>

#include "gasloc/comm/communicator.hpp"
#include "gasloc/data/sampler.hpp"
#include "gasloc/train/worker.hpp"

namespace gasloc::train {

struct EvalResult {
  double val_loss = 0.0;                // the average model, mean_i phi_i
  std::vector<double> worker_val_loss;  // each worker's own model (all ranks where known)
  double consensus_distance = 0.0;      // mean_i ||phi_i - mean phi||^2
  double virtual_time_s = 0.0;          // when the average model exists: the latest worker clock (gloo: own)
};

class Meeting {
 public:
  virtual ~Meeting() = default;
  // Collective: every rank calls it at the same step.
  virtual EvalResult evaluate(int rank, Worker& worker, int64_t step) = 0;
  // Called by every rank after every step; true when this rank must stop after `step`.
  // All ranks stop after the same step.
  virtual bool should_stop(int rank, int64_t step, bool stop_requested) = 0;
  // Collective: returns when every rank has called it (checkpoint commits). Costs no virtual
  // time: the algorithm's clocks do not see it.
  virtual void barrier(int rank) = 0;
  // Bytes the meeting itself sent from this rank (excluded from reported traffic).
  virtual int64_t own_bytes(int rank) const { return 0; }
};

// Worker threads of one process. `workers[r]` is rank r's worker.
class ThreadMeeting final : public Meeting {
 public:
  ThreadMeeting(std::vector<Worker*> workers, const std::vector<data::Batch>* val, double timeout_s);
  EvalResult evaluate(int rank, Worker& worker, int64_t step) override;
  bool should_stop(int rank, int64_t step, bool stop_requested) override;
  void barrier(int) override { wait_all([] {}); }
  // Wakes every waiting rank with a CommError (a worker thread failed).
  void fail(const std::string& why);

 private:
  void wait_all(const std::function<void()>& last);  // barrier; the last arrival runs `last`

  std::vector<Worker*> workers_;
  const std::vector<data::Batch>* val_;
  double timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  bool failed_ = false;
  std::string why_;
  EvalResult result_;
  int64_t max_step_ = 0, stop_step_ = -1;
};

// Ranks in separate processes, meeting through their Communicator.
class CommMeeting final : public Meeting {
 public:
  CommMeeting(comm::Communicator& comm, const std::vector<data::Batch>* val, int64_t check_every);
  EvalResult evaluate(int rank, Worker& worker, int64_t step) override;
  bool should_stop(int rank, int64_t step, bool stop_requested) override;
  void barrier(int) override { comm_.barrier(); }
  int64_t own_bytes(int) const override { return own_bytes_; }

 private:
  comm::Communicator& comm_;
  const std::vector<data::Batch>* val_;
  int64_t check_every_;
  int64_t own_bytes_ = 0;
};

}  // namespace gasloc::train
