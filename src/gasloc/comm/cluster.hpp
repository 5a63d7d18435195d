// The ranks this process hosts: every rank of the job (the in-process cluster: threads on a
// virtual clock) or one (a rank of a Gloo or NCCL process group, one process per rank). The
// trainer runs the same code over both; make_cluster picks one from cluster.backend.
//
// Each hosted rank has two communicators: comm(r), the algorithm's, counted in its stats and
// priced on the virtual clock; and control(r), for what is not the algorithm's (evaluation,
// metrics, stopping, checkpoint commits), which costs no virtual time and is not counted in
// comm(r).stats(). Both are collective over all ranks of the job and used by rank r's thread.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gasloc/comm/communicator.hpp"
#include "gasloc/comm/network_model.hpp"
#include "gasloc/comm/store.hpp"

namespace gasloc::comm {

class ProcessGroupComm;
class ElasticRoster;
struct GlooOptions;

class Cluster {
 public:
  virtual ~Cluster() = default;
  virtual int world() const = 0;
  // The ranks this process hosts, ascending.
  virtual const std::vector<int>& local_ranks() const = 0;
  // The processes of this job on this host (LOCAL_WORLD_SIZE under a launcher), which share its
  // cores: 1 for the in-process cluster.
  virtual int host_processes() const { return 1; }
  virtual Communicator& comm(int rank) = 0;
  virtual Communicator& control(int rank) = 0;
  // For set-up between processes before the ranks run (agreeing on the job, sharing checkpoint
  // steps, opening the metrics file in turn): the control channel of this process's one rank;
  // nullptr when this process hosts every rank (there is nobody else to agree with).
  virtual Communicator* processes() = 0;
  // Runs f(rank, comm(rank)) for every hosted rank (one thread each in-process; on this thread
  // for a process rank) and rethrows the first failure: the exception of the rank that failed
  // first, not the CommErrors of the ranks it woke. A process rank that fails for its own reason
  // (not a CommError) records it for its peers first, so that they name it.
  virtual void run(const std::function<void(int, Communicator&)>& f) = 0;
  // Continues rank's virtual clock and counters from a checkpoint before run(): true when the
  // cluster keeps them (the in-process cluster, whose later prices depend on its clocks; its
  // comm's stats and clock are then the run's own, from zero); false when they start afresh
  // here and the caller adds the checkpoint's on top.
  virtual bool restore(int rank, double clock, const CommStats& stats) { return false; }
  // An elastic process rank's side of the membership (elastic_roster.hpp); nullptr otherwise. Such
  // a cluster has no collective over all ranks: processes() is nullptr and set-up, evaluation,
  // stopping and checkpoints go through the store.
  virtual ElasticRoster* elastic_roster() { return nullptr; }
};

struct ClusterOptions {
  std::string backend = "inproc";  // inproc | gloo | nccl (one process per rank, gasloc launch)
  int workers = 1;                 // inproc: the world; process backends take WORLD_SIZE
  double timeout_s = 300;          // every blocking call, rendezvous included
  // The links and compute of `world` ranks: the in-process virtual clock prices with it.
  std::function<NetworkModel(int world)> network;
  // Process backends: hold each rank's real link to network(world).bandwidth(rank).
  bool throttle = false;
  // Process backends: the job presented to the rendezvous store. handed_in: the token came from
  // gasloc launch (--job-id), which hosts gasloc's store; otherwise it was derived by the rank.
  JobIdentity job;
  bool handed_in = false;
  bool store_all_interfaces = false;  // rank 0 hosting the store: every interface
  // Elastic membership (docs/design.md section 10): in-process, a worker that dies at a round
  // costs its partners heartbeat_timeout_s after its death on their clocks; over Gloo, ranks
  // started by `gasloc launch --elastic` meet in pair groups (elastic_gloo.hpp).
  bool elastic = false;
  double heartbeat_timeout_s = 10.0;
  int64_t incarnation = -1;  // elastic Gloo: this process's incarnation of its rank (launch --elastic counts restarts; -1: the store's roster host answers)
  bool join = false;         // elastic Gloo: a joiner of the running job even at incarnation 0 (cluster.join)
};

// Throws ConfigError for a backend this build lacks (nccl without a CUDA LibTorch) or does not
// know; CommError when the process group cannot form (rendezvous.hpp says how to launch).
std::unique_ptr<Cluster> make_cluster(const ClusterOptions& o);

// A process backend this build has: "gloo", or "nccl" with a CUDA LibTorch. Throws ConfigError
// naming what is missing and what to do.
void check_process_backend(const std::string& backend);
// One rank of a process group over `backend` (checked as above); CommError when it cannot form.
std::unique_ptr<ProcessGroupComm> make_process_group(const std::string& backend, const GlooOptions& o);
// The cluster of a process that hosts `pg`'s rank (make_cluster's process half; tests run such
// ranks as threads).
std::unique_ptr<Cluster> process_cluster(std::unique_ptr<ProcessGroupComm> pg);

}  // namespace gasloc::comm
