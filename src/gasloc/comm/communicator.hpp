// How a worker talks to the others. One Communicator per worker (rank). Every algorithm uses
// only this interface, so the same worker code runs on the in-process simulated cluster and on
// real processes (Gloo, NCCL) — those backends arrive with the communication issue; this file
// fixes the contract and provides the single-rank backend.
//
// Contract (all backends):
// - all_reduce_mean, broadcast and barrier are collective: every rank must call them, in the
//   same order, with tensors of the same shape and dtype. They block until complete.
// - exchange(peers, send, recv) sends `send` to every listed peer and receives one tensor from
//   each into recv (resized to peers.size(), same order as peers; fresh tensors, never views of
//   another rank's buffer). It blocks until all its transfers finish. Peers must list each other
//   (symmetric graph), be distinct and not the caller, and send the same shape and dtype. Every
//   rank calls exchange, in the same order relative to the other collectives, passing an empty
//   list when it has no neighbours this round, so that a backend may match calls by their order
//   (the in-process backend does, and checks it).
// - A call that cannot complete within the backend's timeout throws CommError naming the
//   operation and the rank(s) concerned; it never hangs. After a CommError the communicator is
//   unusable: later calls throw CommError too.
// - A Communicator is used by one thread at a time (the worker's).
// - Overlapped operations (start_exchange, start_all_reduce_mean; algo.overlap_steps, docs/design.md
//   section 11): see their comment below.
// - Elastic rounds (cluster.elastic, docs/design.md section 10; in-process and Gloo, comm/elastic_gloo.hpp):
//   a rank that dies at an exchange passes an undefined `send` to its listed peers, and each of
//   them gets an undefined recv entry for it, a failed edge, instead of an error;
//   all_reduce_mean_over averages over a round's members only and reports an aborted round.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

namespace gasloc::comm {

struct CommStats {
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  double idle_s = 0.0;  // time spent waiting for peers, or for an overlapped transfer to finish
  double compute_s = 0.0;  // time spent computing on a virtual clock (compute()); 0 on a real one
};

// A started operation, as c10d's Work: start_exchange and start_all_reduce_mean return one.
// wait() blocks until the operation is complete; then, and not before, its outputs (the recv
// vector, the averaged tensor) hold the result and its input may be reused. A failure of the
// operation surfaces at wait() as the CommError the blocking form would have thrown. Call wait()
// once, on the worker's thread; a worker's clock pays the part of the transfer its compute did not
// hide at wait() (the in-process backend's virtual clock).
//
// completed(): whether wait() would return now without blocking (the transfer has landed or
// failed; on a virtual clock: the link's end is not after the worker's clock). Never blocks.
// abort(): the caller gives up the operation (a quorum moved on, a peer is known dead). A transfer
// still travelling stops and wait() throws a CommError saying it was aborted; the peers see a
// failed link, and the communicator is unusable afterwards, as after any CommError (the elastic
// communicator only drops those links). An operation that had completed is not undone: wait()
// reports how it ended. A collective the backend cannot cut short (Gloo's all-reduce) is left to
// end or time out on the backend's threads, and wait() throws at once.
class Pending {
 public:
  virtual ~Pending() = default;
  virtual void wait() = 0;
  virtual bool completed() const = 0;
  virtual void abort() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual void all_reduce_mean(torch::Tensor& t) = 0;
  virtual void exchange(const std::vector<int>& peers, const torch::Tensor& send, std::vector<torch::Tensor>& recv) = 0;
  virtual void broadcast(torch::Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  // The mean of t over `members` (ranks ascending, summed in that order) into t on the members.
  // Every rank calls it, members or not; a rank outside passes an undefined tensor and is left
  // alone. A member passing an undefined tensor dies at this round: the round is aborted for all,
  // nobody's tensor changes, and false is returned, so that the caller retries over the
  // survivors. Over every rank it is all_reduce_mean, bit for bit. `call_id` names the call the
  // same on every member (its round and attempt) for a backend that meets by key rather than by
  // the order of calls; the in-process backend checks the order instead. Backends without
  // elastic rounds throw CommError.
  virtual bool all_reduce_mean_over(torch::Tensor& t, const std::vector<int>& members, int64_t call_id);
  // The overlapped forms of exchange and all_reduce_mean: the call starts the operation and
  // returns a handle; the worker computes while it travels and calls wait() before it reads the
  // outputs. On top of the blocking forms' rules:
  // - Every rank starts the same operations in the same order relative to the other collectives.
  // - At most one operation in flight per worker: it is waited for before the worker starts
  //   another or calls any other collective of this communicator (its control channel, which
  //   evaluations and stop agreements use, stays free meanwhile).
  // - The input (`send`, `t`) is not touched until wait() returns: pass a snapshot, never a view
  //   of parameters that keep training.
  // - A checkpoint waits first, so that what it stores is complete.
  // This default performs the blocking operation at the start and returns a handle already
  // complete (a failure is kept for wait()): correct everywhere, without overlap. The process
  // group (Gloo, NCCL) moves the data while the worker computes; the in-process backend overlaps
  // on its virtual clock.
  virtual std::unique_ptr<Pending> start_exchange(const std::vector<int>& peers, const torch::Tensor& send,
                                                  std::vector<torch::Tensor>& recv);
  virtual std::unique_ptr<Pending> start_all_reduce_mean(torch::Tensor& t);
  // Seconds on this worker's clock: virtual in simulation, wall time since start otherwise.
  virtual double now() const = 0;
  // Whether now() is a virtual clock (the in-process cluster's), which prices compute and links,
  // rather than the wall clock, in which real time already passed.
  virtual bool virtual_clock() const { return false; }
  // Accounts `inner_steps` inner steps of local compute on this worker's clock: the virtual
  // clock advances by inner_steps * (its per-step compute time); a real clock ignores it
  // because real time already passed.
  virtual void compute(int64_t inner_steps) = 0;
  // Accounts `seconds` in which this worker neither computes nor communicates (a restart's
  // downtime) as idle time on its clock; a real clock ignores it because real time already passed.
  virtual void pause(double seconds) {}
  virtual CommStats stats() const = 0;
};

// World of one: collectives are identities. Runs on the real clock.
class SingleRank final : public Communicator {
 public:
  SingleRank();
  int rank() const override { return 0; }
  int world() const override { return 1; }
  void all_reduce_mean(torch::Tensor&) override {}
  void exchange(const std::vector<int>& peers, const torch::Tensor& send, std::vector<torch::Tensor>& recv) override;
  void broadcast(torch::Tensor&, int root) override;
  void barrier() override {}
  double now() const override;
  void compute(int64_t) override {}
  CommStats stats() const override { return {}; }

 private:
  int64_t start_ns_;
};

}  // namespace gasloc::comm
