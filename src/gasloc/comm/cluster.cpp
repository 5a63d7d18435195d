#include "gasloc/comm/cluster.hpp"

#include <fmt/format.h>

#include "gasloc/comm/elastic_gloo.hpp"
#include "gasloc/comm/gloo.hpp"
#include "gasloc/comm/inproc.hpp"
#include "gasloc/comm/nccl.hpp"
#include "gasloc/comm/rendezvous.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::comm {

namespace {

// Every rank as a thread of this process; one rank runs on the caller's thread, on the real clock.
class ThreadCluster final : public Cluster {
 public:
  ThreadCluster(int world, const NetworkModel& network, double timeout_s, double heartbeat_timeout_s) {
    for (int r = 0; r < world; ++r) ranks_.push_back(r);
    if (world > 1) inproc_ = std::make_unique<InProcCluster>(world, network, timeout_s, heartbeat_timeout_s);
  }
  int world() const override { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& local_ranks() const override { return ranks_; }
  Communicator& comm(int rank) override { return inproc_ ? inproc_->comm(rank) : single_; }
  Communicator& control(int rank) override { return inproc_ ? inproc_->control(rank) : single_control_; }
  Communicator* processes() override { return nullptr; }
  void run(const std::function<void(int, Communicator&)>& f) override {
    if (inproc_) inproc_->run(f);
    else f(0, single_);
  }
  bool restore(int rank, double clock, const CommStats& stats) override {
    if (!inproc_) return false;
    inproc_->restore(rank, clock, {stats.bytes_sent, inproc_->stats(rank).bytes_received, stats.idle_s, stats.compute_s});
    return true;
  }

 private:
  std::vector<int> ranks_;
  std::unique_ptr<InProcCluster> inproc_;
  SingleRank single_, single_control_;
};

// The stats of what `pg` did outside the control channel: the control channel's calls are
// metered by ControlView and taken out here.
class CountedView final : public Communicator {
 public:
  CountedView(ProcessGroupComm& pg, const CommStats& excluded) : pg_(pg), excluded_(excluded) {}
  int rank() const override { return pg_.rank(); }
  int world() const override { return pg_.world(); }
  void all_reduce_mean(torch::Tensor& t) override { pg_.all_reduce_mean(t); }
  void exchange(const std::vector<int>& peers, const torch::Tensor& send, std::vector<torch::Tensor>& recv) override {
    pg_.exchange(peers, send, recv);
  }
  std::unique_ptr<Pending> start_exchange(const std::vector<int>& peers, const torch::Tensor& send,
                                          std::vector<torch::Tensor>& recv) override {
    return pg_.start_exchange(peers, send, recv);
  }
  std::unique_ptr<Pending> start_all_reduce_mean(torch::Tensor& t) override { return pg_.start_all_reduce_mean(t); }
  void broadcast(torch::Tensor& t, int root) override { pg_.broadcast(t, root); }
  void barrier() override { pg_.barrier(); }
  double now() const override { return pg_.now(); }
  void compute(int64_t steps) override { pg_.compute(steps); }
  CommStats stats() const override {
    CommStats s = pg_.stats();
    s.bytes_sent -= excluded_.bytes_sent;
    s.bytes_received -= excluded_.bytes_received;
    s.idle_s -= excluded_.idle_s;
    return s;
  }

 private:
  ProcessGroupComm& pg_;
  const CommStats& excluded_;
};

// The same process group, every call metered into `used` (what the control channel cost).
class ControlView final : public Communicator {
 public:
  ControlView(ProcessGroupComm& pg, CommStats& used) : pg_(pg), used_(used) {}
  int rank() const override { return pg_.rank(); }
  int world() const override { return pg_.world(); }
  void all_reduce_mean(torch::Tensor& t) override { Meter m(*this); pg_.all_reduce_mean(t); }
  void exchange(const std::vector<int>& peers, const torch::Tensor& send, std::vector<torch::Tensor>& recv) override {
    Meter m(*this);
    pg_.exchange(peers, send, recv);
  }
  void broadcast(torch::Tensor& t, int root) override { Meter m(*this); pg_.broadcast(t, root); }
  void barrier() override { Meter m(*this); pg_.barrier(); }
  double now() const override { return pg_.now(); }
  void compute(int64_t) override {}
  CommStats stats() const override { return used_; }

 private:
  // Adds what one call cost, failed calls included.
  struct Meter {
    ControlView& v;
    CommStats before = v.pg_.stats();
    ~Meter() {
      const CommStats after = v.pg_.stats();
      v.used_.bytes_sent += after.bytes_sent - before.bytes_sent;
      v.used_.bytes_received += after.bytes_received - before.bytes_received;
      v.used_.idle_s += after.idle_s - before.idle_s;
    }
  };
  ProcessGroupComm& pg_;
  CommStats& used_;
};

// A process of one rank is asked for that rank only.
void check_hosted(int rank, int hosted) {
  if (rank != hosted) throw CommError(fmt::format("rank {} is not hosted by this process (it hosts rank {})", rank, hosted));
}

// One rank of a process group: this process hosts exactly that rank.
class ProcessCluster final : public Cluster {
 public:
  explicit ProcessCluster(std::unique_ptr<ProcessGroupComm> pg)
      : pg_(std::move(pg)), ranks_{pg_->rank()}, counted_(*pg_, control_used_), control_(*pg_, control_used_) {}
  int world() const override { return pg_->world(); }
  const std::vector<int>& local_ranks() const override { return ranks_; }
  int host_processes() const override { return pg_->options().local_world; }
  Communicator& comm(int rank) override { return check(rank), counted_; }
  Communicator& control(int rank) override { return check(rank), control_; }
  Communicator* processes() override { return &control_; }
  void run(const std::function<void(int, Communicator&)>& f) override {
    try {
      f(ranks_[0], counted_);
    } catch (const CommError&) {
      throw;  // a peer's failure: the communicator has already recorded who failed first
    } catch (const std::exception& e) {
      // This rank fails for its own reason: say so before its connections close.
      pg_->record_own_failure(fmt::format("rank {} failed: {}", ranks_[0], e.what()));
      throw;
    }
  }

 private:
  void check(int rank) const { check_hosted(rank, ranks_[0]); }
  std::unique_ptr<ProcessGroupComm> pg_;
  std::vector<int> ranks_;
  CommStats control_used_;
  CountedView counted_;
  ControlView control_;
};

// One elastic Gloo rank: no group of the world, pair groups met through the store.
class ElasticProcessCluster final : public Cluster {
 public:
  explicit ElasticProcessCluster(std::unique_ptr<ElasticGlooComm> c, int local_world)
      : c_(std::move(c)), ranks_{c_->rank()}, local_world_(local_world) {}
  int world() const override { return c_->world(); }
  const std::vector<int>& local_ranks() const override { return ranks_; }
  int host_processes() const override { return local_world_; }
  Communicator& comm(int rank) override { return check(rank), *c_; }
  Communicator& control(int rank) override { return check(rank), *c_; }
  Communicator* processes() override { return nullptr; }
  void run(const std::function<void(int, Communicator&)>& f) override { f(ranks_[0], *c_); }
  ElasticRoster* elastic_roster() override { return &c_->roster(); }

 private:
  void check(int rank) const { check_hosted(rank, ranks_[0]); }
  std::unique_ptr<ElasticGlooComm> c_;
  std::vector<int> ranks_;
  int local_world_;
};

}  // namespace

void check_process_backend(const std::string& backend) {
  if (backend == "gloo" || (backend == "nccl" && kHaveNccl)) return;
  if (backend == "nccl")
    throw ConfigError("the nccl backend is not in this build of gasloc: its LibTorch has no CUDA or no NCCL",
                      "use the gloo backend here (cluster.backend = \"gloo\"), or build gasloc against a CUDA "
                      "LibTorch with NCCL on a GPU machine (scripts/gpu_check.sh shows how)");
  throw ConfigError(fmt::format("unknown process backend '{}'", backend), "use gloo or nccl");
}

std::unique_ptr<ProcessGroupComm> make_process_group(const std::string& backend, const GlooOptions& o) {
  check_process_backend(backend);
#ifdef GASLOC_WITH_NCCL
  if (backend == "nccl") return std::make_unique<NcclCommunicator>(o);
#endif
  return std::make_unique<GlooCommunicator>(o);
}

std::unique_ptr<Cluster> make_cluster(const ClusterOptions& o) {
  if (o.backend == "inproc")
    return std::make_unique<ThreadCluster>(o.workers, o.network(o.workers), o.timeout_s, o.elastic ? o.heartbeat_timeout_s : -1.0);
  if (o.elastic && o.backend != "gloo")
    throw ConfigError("cluster.elastic: elastic runs over " + o.backend + " are not built yet",
                      "run elastic jobs over Gloo (cluster.backend = \"gloo\", under gasloc launch --elastic) or on the "
                      "in-process cluster");
  check_process_backend(o.backend);  // before the launcher's variables: a missing backend is the first thing to say
  GlooOptions po = gloo_options_from_env();
  po.timeout_s = o.timeout_s;
  po.job = o.job;
  po.store_all_interfaces = o.store_all_interfaces;
  if (o.handed_in) po.agent_store = false;  // gasloc launch hosts gasloc's store, not torchrun's
  if (o.throttle) po.bandwidth_limit_Bps = o.network(po.world).bandwidth(po.rank);
  if (o.elastic) {
    po.connect_only = true;  // gasloc launch hosts the store and its roster
    return std::make_unique<ElasticProcessCluster>(std::make_unique<ElasticGlooComm>(po, o.incarnation, o.join, o.heartbeat_timeout_s), po.local_world);
  }
  return process_cluster(make_process_group(o.backend, po));
}

std::unique_ptr<Cluster> process_cluster(std::unique_ptr<ProcessGroupComm> pg) {
  return std::make_unique<ProcessCluster>(std::move(pg));
}

}  // namespace gasloc::comm
