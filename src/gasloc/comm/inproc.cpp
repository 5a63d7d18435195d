// The threading half of the in-process backend: the rendezvous of the ranks on a shared call
// (inproc_call.hpp holds the rules), failure propagation, the worker threads.
//
// A call goes through two meeting points, both under one mutex with one condition variable:
//   1. arrive: each rank deposits its entry; the last one settles the call (checks, prices).
//   2. data:   each rank, without the lock, reads the others' tensors (its all-reduce chunk,
//              its peers' sends, the root's tensor); then waits until everyone has finished
//              reading, because only then may anyone return and modify its own tensor.
// Every wait ends on success, on the cluster's first failure, on a missing rank that has
// already returned from run()'s function, or at the deadline; it never hangs.
#include "gasloc/comm/inproc.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "gasloc/comm/inproc_call.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::comm {

using inproc::Call;
using inproc::Op;
using inproc::op_name;
using SteadyClock = std::chrono::steady_clock;

namespace detail {

// A call's timeout counted in time the process ran: a process stopped (SIGSTOP, Ctrl+Z, a
// suspended machine) or starved has every rank's thread stopped too, so that time proves no peer
// missing and would otherwise fail the run the moment it continues. The wait goes in slices of
// at most kSlice, and a slice that took longer than kSlice + kStall (the process did not run for
// most of it) is charged as kSlice only.
class RunningDeadline {
 public:
  explicit RunningDeadline(double budget_s) : left_s_(budget_s) {}
  // Waits on `cv` for one slice; false once the budget is spent.
  bool wait(std::condition_variable& cv, std::unique_lock<std::mutex>& lk) {
    if (left_s_ <= 0) return false;
    const double slice = std::min(kSliceS, left_s_);
    const auto t0 = SteadyClock::now();
    cv.wait_for(lk, std::chrono::duration<double>(slice));
    const double took = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    left_s_ -= took > slice + kStallS ? slice : took;
    return left_s_ > 0;
  }

 private:
  static constexpr double kSliceS = 0.25, kStallS = 1.0;
  double left_s_;
};

struct RankState {
  double clock = 0.0;
  CommStats stats;
  int64_t seq = 0;      // collective calls this rank has entered; numbers its next call
  bool exited = false;  // its run() function has returned: it will enter no more calls
  // An overlapped operation (start_*): its data moved at the start, and its link is busy until
  // link_done on the virtual clock, which the compute clock meets at wait().
  bool in_flight = false;
  double link_done = 0.0;
};

struct InProcState {
  InProcState(int n, NetworkModel model, double timeout_s, inproc::Elastic elastic)
      : n(n), model(std::move(model)), timeout_s(timeout_s), elastic(elastic), ranks(n) {}
  const int n;
  const NetworkModel model;
  const double timeout_s;
  const inproc::Elastic elastic;

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::vector<RankState> ranks;
  std::map<int64_t, Call> calls;   // live calls by number (at most two: ranks leaving #s, entering #s+1)
  std::string failure;             // the first failure ("rank 3 failed: ..."); empty while healthy
  std::exception_ptr failure_exc;  // what run() rethrows for it
  bool running = false;

  // Records the first failure and wakes every waiting rank; later failures are its consequences.
  // Caller holds mu.
  void fail(const std::string& what, std::exception_ptr exc) {
    if (!failure.empty()) return;
    failure = what;
    failure_exc = exc;
    cv.notify_all();
  }
  // Records a failure this backend detected and returns the CommError to throw for it.
  CommError comm_failure(Op op, const std::string& what) {
    CommError err(std::string(op_name(op)) + ": " + what);
    fail(what, std::make_exception_ptr(err));
    return err;
  }
};

}  // namespace detail

namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) s += fmt::format(" and {} more", ranks.size() - 8);
  return s;
}

class InProcComm final : public Communicator {
 public:
  InProcComm(detail::InProcState& s, int rank, bool counted) : s_(s), rank_(rank), counted_(counted) {}
  int rank() const override { return rank_; }
  int world() const override { return s_.n; }

  // Communication is not differentiable: no autograd graph across ranks (NoGradGuard is per thread).
  bool all_reduce_mean_over(torch::Tensor& t, const std::vector<int>& members, int64_t) override {
    torch::NoGradGuard no_grad;
    inproc::Entry e;
    if (t.defined()) e.tensor = t.reshape({-1});
    e.members = members;
    const auto me = std::find(members.begin(), members.end(), rank_);
    const bool member = me != members.end() && t.defined();
    bool aborted = false;
    const torch::Tensor mean = call(Op::AllReduceOver, std::move(e), [&](const Call& c) {
      aborted = c.aborted;
      if (!aborted && member) reduce_chunk(c, members, static_cast<int>(me - members.begin()));
    });
    if (aborted) return false;
    if (member) t.copy_(mean.view(t.sizes()));
    return true;
  }

  void exchange(const std::vector<int>& peers, const torch::Tensor& send, std::vector<torch::Tensor>& recv) override {
    exchange_as(peers, send, recv, false);
  }

  std::unique_ptr<Pending> start_exchange(const std::vector<int>& peers, const torch::Tensor& send,
                                          std::vector<torch::Tensor>& recv) override {
    exchange_as(peers, send, recv, true);
    return std::make_unique<Flight>(*this);
  }

  void all_reduce_mean(torch::Tensor& t) override { all_reduce_as(t, false); }

  std::unique_ptr<Pending> start_all_reduce_mean(torch::Tensor& t) override {
    all_reduce_as(t, true);
    return std::make_unique<Flight>(*this);
  }

 private:
  // The handle of an overlapped operation: the data has moved; wait() moves the compute clock to
  // the link's end when the compute did not hide the whole transfer, and counts that as idle.
  class Flight final : public Pending {
   public:
    explicit Flight(InProcComm& c) : c_(c) {}
    void wait() override {
      if (waited_) throw CommError("wait: called twice on one operation");
      waited_ = true;
      std::lock_guard lk(c_.s_.mu);
      auto& me = c_.s_.ranks[c_.rank_];
      me.in_flight = false;
      if (aborted_) throw CommError(fmt::format("rank {}: the overlapped operation was aborted before it completed", c_.rank_));
      if (me.link_done > me.clock) {
        me.stats.idle_s += me.link_done - me.clock;
        me.clock = me.link_done;
      }
    }
    // The data moved at the start (the reference): complete once the worker's clock has passed
    // the link's end, as a real transfer would have landed by then.
    bool completed() const override {
      std::lock_guard lk(c_.s_.mu);
      const auto& me = c_.s_.ranks[c_.rank_];
      return waited_ || me.link_done <= me.clock;
    }
    // Aborted before it landed on the virtual clock: this worker's outputs do not count (wait()
    // throws); its peers, which the reference served at the start, are not touched.
    void abort() override {
      if (!completed()) aborted_ = true;
    }

   private:
    InProcComm& c_;
    bool waited_ = false, aborted_ = false;
  };

  void all_reduce_as(torch::Tensor& t, bool overlapped) {
    torch::NoGradGuard no_grad;
    inproc::Entry e;
    if (t.defined()) e.tensor = t.reshape({-1});
    std::vector<int> all(s_.n);
    for (int r = 0; r < s_.n; ++r) all[r] = r;
    const torch::Tensor mean =
        call(Op::AllReduceMean, std::move(e), [&](const Call& c) { reduce_chunk(c, all, rank_); }, overlapped);
    t.copy_(mean.view(t.sizes()));
  }

  void exchange_as(const std::vector<int>& peers, const torch::Tensor& send, std::vector<torch::Tensor>& recv,
                   bool overlapped) {
    torch::NoGradGuard no_grad;
    inproc::Entry e;
    e.tensor = send;
    e.peers = peers;
    std::vector<torch::Tensor> got;
    call(Op::Exchange, std::move(e), [&](const Call& c) {
      got.reserve(peers.size());
      // A peer that left at this exchange (elastic) sent nothing: an undefined tensor, a failed edge.
      for (int j : peers) {
        const auto& sent = c.entries[j].tensor;
        got.push_back(sent.defined() ? sent.clone(torch::MemoryFormat::Contiguous) : torch::Tensor());
      }
    }, overlapped);
    recv = std::move(got);
  }

 public:

  void broadcast(torch::Tensor& t, int root) override {
    torch::NoGradGuard no_grad;
    inproc::Entry e;
    e.tensor = t;
    e.root = root;
    call(Op::Broadcast, std::move(e), [&](const Call& c) {
      if (rank_ != root) t.copy_(c.entries[root].tensor);
    });
  }

  void barrier() override { call(Op::Barrier, {}, [](const Call&) {}); }

  double now() const override {
    std::lock_guard lk(s_.mu);
    return s_.ranks[rank_].clock;
  }
  bool virtual_clock() const override { return true; }

  void compute(int64_t inner_steps) override {
    if (inner_steps < 0) throw CommError(fmt::format("compute: rank {} got a negative step count {}", rank_, inner_steps));
    std::lock_guard lk(s_.mu);
    const double dt = static_cast<double>(inner_steps) * s_.model.step_time(rank_);
    s_.ranks[rank_].clock += dt;
    if (counted_) s_.ranks[rank_].stats.compute_s += dt;
  }

  void pause(double seconds) override {
    if (!(seconds >= 0)) throw CommError(fmt::format("pause: rank {} got {} seconds", rank_, seconds));
    std::lock_guard lk(s_.mu);
    s_.ranks[rank_].clock += seconds;
    s_.ranks[rank_].stats.idle_s += seconds;
  }

  CommStats stats() const override {
    std::lock_guard lk(s_.mu);
    return s_.ranks[rank_].stats;
  }

 private:
  // The k-th of `ranks`' chunks of an all-reduce's mean, summed in the order of `ranks`: every
  // element gets the same operations whichever rank computes it, so the result does not depend
  // on the split, and every rank then copies the same bits.
  void reduce_chunk(const Call& c, const std::vector<int>& ranks, int k) const {
    const int K = static_cast<int>(ranks.size());
    const int64_t numel = c.result.numel(), lo = numel * k / K, len = numel * (k + 1) / K - lo;
    if (len == 0) return;
    auto out = c.result.narrow(0, lo, len);
    // Half-precision buffers are summed in fp32, as the Gloo backend does: one rounding, not n.
    const bool upcast = out.scalar_type() == torch::kHalf || out.scalar_type() == torch::kBFloat16;
    const auto& first = c.entries[ranks[0]].tensor;
    auto acc = upcast ? first.narrow(0, lo, len).to(torch::kFloat) : out;
    if (!upcast) acc.copy_(first.narrow(0, lo, len));
    for (int i = 1; i < K; ++i) acc.add_(c.entries[ranks[i]].tensor.narrow(0, lo, len));
    acc.div_(K);
    if (upcast) out.copy_(acc);
  }

  // One collective call of this rank (see the file comment). `data` reads the others' entries
  // once everyone has arrived; the return value is the call's result tensor (all-reduce).
  // `overlapped` (start_*): the data moves now and the priced end goes to the rank's link, not
  // its compute clock (Flight::wait). The call is priced as a blocking one started at the rank's
  // clock: one operation in flight at a time means its link is free by then.
  torch::Tensor call(Op op, inproc::Entry e, const std::function<void(const Call&)>& data, bool overlapped = false) {
    detail::RunningDeadline deadline(s_.timeout_s);
    std::unique_lock lk(s_.mu);
    if (!s_.failure.empty()) throw CommError(std::string(op_name(op)) + ": " + s_.failure);
    auto& me = s_.ranks[rank_];
    if (counted_ && me.in_flight)
      throw s_.comm_failure(op, fmt::format("rank {} called {} while its overlapped operation is in flight; wait() for "
                                            "it first (one operation in flight per worker)",
                                            rank_, op_name(op)));
    const int64_t seq = me.seq++;
    Call& c = s_.calls.try_emplace(seq, s_.n, seq).first->second;
    e.present = true;
    e.op = op;
    e.clock = me.clock;
    e.counted = counted_;
    c.entries[rank_] = std::move(e);
    if (++c.arrived == s_.n) {
      inproc::settle(c, s_.model, s_.elastic);
      if (!c.error.empty()) s_.fail(c.error, std::make_exception_ptr(CommError(c.error)));
      s_.cv.notify_all();
    }
    wait(lk, op, c, deadline, true);
    if (!c.error.empty()) throw CommError(c.error);

    lk.unlock();
    try {
      data(c);
    } catch (const std::exception& ex) {
      lk.lock();
      throw s_.comm_failure(op, fmt::format("rank {} failed in call #{}: {}", rank_, seq, ex.what()));
    }
    lk.lock();
    c.entries[rank_].data_done = true;
    if (++c.data_done == s_.n) s_.cv.notify_all();
    wait(lk, op, c, deadline, false);

    if (counted_) {
      const auto& o = c.out[rank_];
      if (overlapped) {
        me.in_flight = true;
        me.link_done = o.clock.end_s;
      } else {
        me.clock = o.clock.end_s;
        me.stats.idle_s += o.clock.idle_s;
      }
      me.stats.bytes_sent += o.sent;
      me.stats.bytes_received += o.received;
    }
    torch::Tensor result = c.result;
    if (++c.left == s_.n) s_.calls.erase(seq);
    return result;
  }

  // Waits until everyone has arrived at `c` (arrival) or finished reading (!arrival). Throws
  // CommError on the cluster's failure, on a missing rank that has returned from its worker
  // function, or at the deadline (timeout_s of running time: see RunningDeadline).
  void wait(std::unique_lock<std::mutex>& lk, Op op, Call& c, detail::RunningDeadline& deadline, bool arrival) {
    auto done = [&] { return arrival ? c.ready : c.data_done == s_.n; };
    auto missing = [&](bool exited_only) {
      std::vector<int> m;
      for (int r = 0; r < s_.n; ++r) {
        const bool there = arrival ? c.entries[r].present : c.entries[r].data_done;
        if (!there && (!exited_only || s_.ranks[r].exited)) m.push_back(r);
      }
      return m;
    };
    const char* what = arrival ? "to enter" : "to finish";
    while (!done()) {
      if (!s_.failure.empty()) throw CommError(std::string(op_name(op)) + ": " + s_.failure);
      if (arrival) {
        if (auto gone = missing(true); !gone.empty())
          throw s_.comm_failure(op, fmt::format("{} returned from the worker function without entering {} call #{} "
                                                "(rank {} waits in it)",
                                                ranks_text(gone), op_name(op), c.seq, rank_));
      }
      if (!deadline.wait(s_.cv, lk) && !done() && s_.failure.empty())
        throw s_.comm_failure(op, fmt::format("rank {} timed out after {:g} s waiting for {} {} {} call #{}", rank_,
                                              s_.timeout_s, ranks_text(missing(false)), what, op_name(op), c.seq));
    }
  }

  detail::InProcState& s_;
  const int rank_;
  const bool counted_;
};

}  // namespace

InProcCluster::InProcCluster(int n, NetworkModel model, double timeout_s, double heartbeat_timeout_s) {
  if (n < 1) throw ConfigError(fmt::format("InProcCluster: the world size must be >= 1, got {}", n));
  if (!std::isfinite(timeout_s) || timeout_s <= 0)
    throw ConfigError(fmt::format("InProcCluster: timeout_s must be a finite number > 0, got {}", timeout_s));
  model.validate(n);
  if (!std::isfinite(heartbeat_timeout_s))
    throw ConfigError(fmt::format("InProcCluster: heartbeat_timeout_s must be finite, got {}", heartbeat_timeout_s));
  state_ = std::make_unique<detail::InProcState>(n, std::move(model), timeout_s, inproc::Elastic{heartbeat_timeout_s});
  for (int r = 0; r < n; ++r) comms_.push_back(std::make_unique<InProcComm>(*state_, r, true));
  for (int r = 0; r < n; ++r) controls_.push_back(std::make_unique<InProcComm>(*state_, r, false));
}

InProcCluster::~InProcCluster() = default;

int InProcCluster::world() const { return state_->n; }

const NetworkModel& InProcCluster::model() const { return state_->model; }

Communicator& InProcCluster::comm(int rank) {
  comm_at(rank, "comm");
  return *comms_[rank];
}

Communicator& InProcCluster::control(int rank) {
  comm_at(rank, "control");
  return *controls_[rank];
}

void InProcCluster::run(const std::function<void(int, Communicator&)>& f) {
  auto& s = *state_;
  {
    std::lock_guard lk(s.mu);
    if (s.running) throw CommError("InProcCluster::run: already running (run() is not reentrant)");
    if (!s.failure.empty())
      throw CommError("InProcCluster::run: the cluster failed earlier (" + s.failure + ")",
                      "a failed in-process cluster stays failed; create a new one");
    s.running = true;
    for (auto& r : s.ranks) r.exited = false;
  }
  auto worker = [&](int r) {
    try {
      f(r, *comms_[r]);
    } catch (const std::exception& e) {
      std::lock_guard lk(s.mu);
      s.fail(fmt::format("rank {} failed: {}", r, e.what()), std::current_exception());
    } catch (...) {
      std::lock_guard lk(s.mu);
      s.fail(fmt::format("rank {} failed: unknown exception", r), std::current_exception());
    }
    std::lock_guard lk(s.mu);
    s.ranks[r].exited = true;
    s.cv.notify_all();  // ranks waiting for it must learn it will never come
  };
  std::vector<std::thread> threads;
  threads.reserve(s.n);
  try {
    for (int r = 0; r < s.n; ++r) threads.emplace_back(worker, r);
  } catch (const std::exception& e) {
    // The missing ranks never arrive: fail the started ones rather than let them time out.
    std::lock_guard lk(s.mu);
    s.fail(fmt::format("could not start the thread of rank {}: {}", threads.size(), e.what()), std::current_exception());
  }
  for (auto& t : threads) t.join();

  std::lock_guard lk(s.mu);
  s.running = false;
  for (auto& r : s.ranks) r.exited = false;  // comm() stays usable from the caller's own threads
  if (s.failure_exc) std::rethrow_exception(s.failure_exc);
}

const Communicator& InProcCluster::comm_at(int rank, const char* what) const {
  if (rank < 0 || rank >= state_->n)
    throw CommError(fmt::format("InProcCluster::{}: rank {} is outside a world of {}", what, rank, state_->n));
  return *comms_[rank];
}

CommStats InProcCluster::stats(int rank) const { return comm_at(rank, "stats").stats(); }

double InProcCluster::clock(int rank) const { return comm_at(rank, "clock").now(); }

void InProcCluster::restore(int rank, double clock, const CommStats& stats) {
  comm_at(rank, "restore");
  std::lock_guard lk(state_->mu);
  if (state_->running) throw CommError("InProcCluster::restore: the cluster is running");
  state_->ranks[rank].clock = clock;
  state_->ranks[rank].stats = stats;
  // A checkpoint waits for the transfer in flight (communicator.hpp), so a restored link is free.
  state_->ranks[rank].in_flight = false;
  state_->ranks[rank].link_done = clock;
}

}  // namespace gasloc::comm
