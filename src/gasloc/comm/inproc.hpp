// The in-process backend: n workers as threads of one process, talking through shared memory,
// each on a virtual clock priced by a NetworkModel. It is the reference backend: results are
// exact and deterministic (all-reduce sums in rank order), so Gloo/NCCL are tested against it,
// and the simulated cluster can model heterogeneous compute and links on one machine.
//
// Matching: every collective call (all_reduce_mean, exchange, broadcast, barrier) of every rank
// is numbered by a per-rank counter; call #s of rank r meets call #s of all other ranks, so
// every rank calls every collective, including exchange (an empty peer list when it has no
// neighbours this round). A call whose ranks disagree (operation, tensor shape or dtype, root,
// asymmetric peer lists) throws CommError on every rank naming the ranks and the operation. In
// an exchange every rank with peers must send the same shape and dtype (one message size per
// round, which is what the cost model prices), a little stricter than pairwise agreement.
//
// Overlap: start_exchange and start_all_reduce_mean meet and move their data at the start like
// the blocking calls, priced from the rank's clock then; the priced end is the rank's link
// busy-until time instead of its clock, which keeps computing, and wait() brings the clock to that
// end if it is behind, counting the difference as idle. A round of H_i steps whose transfer of C_i
// seconds is started tau steps before its merge thus costs H_i s_i + max(0, C_i - tau s_i).
//
// Failure: the first failure (a worker function that throws, a timeout, a mismatch, a rank that
// returns from run()'s function while others wait for it) poisons the cluster: every rank
// blocked in, or later entering, a collective throws CommError naming it. Nothing hangs: a wait
// longer than timeout_s throws (time the process ran: a stopped process does not time out). A poisoned cluster stays poisoned; make a new one.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "gasloc/comm/communicator.hpp"
#include "gasloc/comm/network_model.hpp"

namespace gasloc::comm {

namespace detail {
struct InProcState;
}

class InProcCluster {
 public:
  // Throws ConfigError for an invalid model (see NetworkModel::validate) or n < 1, timeout_s <= 0.
  // heartbeat_timeout_s >= 0 makes the cluster elastic (docs/design.md section 10): a rank may
  // leave at an exchange or a member all-reduce, and the ranks it fails wait, on their virtual
  // clocks, until its death is detected: its clock then plus heartbeat_timeout_s.
  explicit InProcCluster(int n, NetworkModel model = {}, double timeout_s = 60.0, double heartbeat_timeout_s = -1.0);
  ~InProcCluster();
  InProcCluster(const InProcCluster&) = delete;
  InProcCluster& operator=(const InProcCluster&) = delete;

  int world() const;
  const NetworkModel& model() const;
  // The communicator of `rank`, for callers that run the workers on their own threads (one
  // thread per rank). Throws CommError for a rank outside [0, world).
  Communicator& comm(int rank);
  // Rank's control channel: the same ranks for what is not the algorithm's (evaluation, metrics,
  // checkpoint commits). Its calls are numbered and matched with comm(rank)'s (a rank calling
  // one where another calls the other is a mismatch) and fail with the cluster, but cost no
  // virtual time and are not counted in stats().
  Communicator& control(int rank);
  // Runs f(rank, comm(rank)) on n threads (one per worker) and joins them. Rethrows the first
  // failure: the original exception of the worker that failed first (not the CommErrors of the
  // ranks it woke up), or the CommError of a timeout or mismatch. Clocks and stats carry over
  // from one run to the next.
  void run(const std::function<void(int, Communicator&)>& f);
  CommStats stats(int rank) const;
  double clock(int rank) const;
  // Sets a rank's clock and counters before a run: a resumed run continues where its checkpoint
  // left them, so every later price (max of clocks, idle time) is what it would have been.
  void restore(int rank, double clock, const CommStats& stats);

 private:
  const Communicator& comm_at(int rank, const char* what) const;  // checks the rank

  std::unique_ptr<detail::InProcState> state_;
  std::vector<std::unique_ptr<Communicator>> comms_, controls_;
};

}  // namespace gasloc::comm
