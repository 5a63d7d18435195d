#include "gasloc/comm/process_group.hpp"

#include "gasloc/comm/heartbeat.hpp"

#include <arpa/inet.h>
#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/exception.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <mutex>
#include <thread>

#include "gasloc/comm/network_model.hpp"
#include "gasloc/comm/pair_transfer.hpp"
#include "gasloc/comm/session_salt.hpp"
#include "gasloc/comm/token_bucket.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::comm {

using Clock = std::chrono::steady_clock;

namespace {

std::string secs(double s) { return fmt::format("{:g} s", s); }

// How a wait ended badly.
struct WaitFailure {
  bool timed_out = false;
  std::string detail;
};

// True on an overlapped exchange's own thread: its waits are not the worker's idle time (the
// worker computes meanwhile; what it waits for is counted at Pending::wait).
thread_local bool on_flight_thread = false;

// An overlapped operation of this rank (start_exchange, start_all_reduce_mean), landed by the
// first of its handle's wait(), the next overlapped start, or the communicator's destruction.
struct Flight {
  std::thread thread;             // an exchange: its transfers run here while the worker computes
  std::function<void()> finish;   // run when it lands, on the worker's thread (an all-reduce's wait)
  c10::intrusive_ptr<c10d::Work> work;  // an all-reduce's, for completed()
  int64_t bytes = 0;              // what the thread moved each way, counted when it lands
  std::exception_ptr failure;     // kept for wait()
  std::atomic<bool> done{false};  // the exchange's thread has finished
  std::atomic<bool> aborted{false};  // Pending::abort: the exchange's waits end at once
};

}  // namespace

std::string first_line(const std::string& s) {
  std::string l = s.substr(0, s.find('\n'));
  if (!l.empty() && l[0] == '[') {
    const auto close = l.find("] ");
    if (close != std::string::npos && l.find(".cc:") < close) l = l.substr(close + 2);
  }
  return gloo_ports_decoded(l);
}

namespace {
bool is_ip_address(const std::string& text) {
  in6_addr any{};
  return ::inet_pton(AF_INET, text.c_str(), &any) == 1 || ::inet_pton(AF_INET6, text.c_str(), &any) == 1;
}
}  // namespace

std::string gloo_ports_decoded(const std::string& message) {
  std::string out;
  size_t done = 0;
  for (size_t open = message.find('['); open != std::string::npos; open = message.find('[', open + 1)) {
    const size_t close = message.find(']', open);
    if (close == std::string::npos || close + 1 >= message.size() || message[close + 1] != ':') continue;
    size_t end = close + 2;
    while (end < message.size() && end - (close + 2) < 6 && std::isdigit(static_cast<unsigned char>(message[end]))) ++end;
    if (end == close + 2 || (end < message.size() && std::isdigit(static_cast<unsigned char>(message[end])))) continue;
    const long raw = std::stol(message.substr(close + 2, end - close - 2));
    if (raw > 0xffff || !is_ip_address(message.substr(open + 1, close - open - 1))) continue;
    out += message.substr(done, close + 2 - done);
    out += std::to_string(ntohs(static_cast<uint16_t>(raw)));
    done = end;
  }
  return out + message.substr(done);
}

struct ProcessGroupComm::Impl {
  GlooOptions o;
  std::chrono::milliseconds timeout{};
  // Declared before backend so that it is destroyed after it: rank 0's store must outlive the group.
  c10::intrusive_ptr<c10d::Store> store;
  BuiltBackend built;
  // Exchanges done with each peer (pair_transfer.hpp's tags; Gloo's collectives use slots with a
  // non-zero prefix, so these small tags never collide with them): the blocking calls', and
  // apart from them an overlapped operation's, whose thread runs beside the caller's (a stop
  // check's or an evaluation's sealed all-reduce may come while a round is in flight).
  std::vector<uint32_t> pair_calls, flight_pair_calls;
  std::unique_ptr<LinkLimit> limit;  // network.throttle_gloo: shared with an overlapped exchange's thread
  CommStats stats;
  std::string broken;  // the first error; the group is unusable after it
  mutable std::mutex broken_mu;  // an overlapped exchange's thread may fail beside the worker
  std::shared_ptr<Flight> flight;  // the overlapped operation not landed yet
  Clock::time_point t0;
  Arrivals arrivals;    // store-side records of the collectives each rank entered
  int64_t collective_seq = 0;  // this rank's current collective (its arrival number)
  // The sealed all-reduce's buffers (its padded tensor, a received chunk a peer, the fp32 sum of
  // half-precision ones), kept from call to call (kept_bytes says why; may_keep_buffers when).
  std::vector<torch::Tensor> reduce_bufs;
  // The transport's sealing buffers, kept here rather than per thread: an overlapped operation
  // runs on a new thread each time, whose own would start empty.
  std::vector<torch::Tensor> seal_bufs;
  // A job with a secret: every transfer sealed (pair_transfer.hpp), and all-reduces and broadcasts
  // made of sealed transfers, since Gloo's own collectives move bytes in the clear.
  std::unique_ptr<PairSealing> sealing;
  // Last, so that it stops first: its connection must not outlive rank 0's store.
  std::unique_ptr<Heartbeat> heartbeat;

  C10dBackend& pg() { return *built.backend; }

  // Moves `send` to `peers` and theirs into recv (chosen or reused buffers; `into`: the tensors
  // already there, an overlapped exchange's); returns the bytes moved each way.
  // `abort`: set by an overlapped exchange's Pending::abort. `per_peer` (when given): a buffer of
  // `send`'s size and dtype for each peer, sent in its place (the chunks of an all-to-all).
  int64_t exchange(const std::vector<int>& peers, const torch::Tensor& send, std::vector<torch::Tensor>& recv, bool into,
                   const std::atomic<bool>* abort = nullptr, const std::vector<torch::Tensor>* per_peer = nullptr);
  // An all-reduce posted to the backend, landed by finish_all_reduce.
  struct PostedReduce {
    c10::intrusive_ptr<c10d::Work> work;
    torch::Tensor buf;  // the sum, in place
    int64_t wire = 0;   // bytes each way
    int64_t seq = 0;    // its arrival number
    Clock::time_point ready{}, deadline{};  // the bandwidth limit's end; the timeout's
  };
  // With a secret: a reduce-scatter and an all-gather over sealed transfers, the sums in id
  // order, half precision in fp32, then / n: the in-process reference's bits (at its definition).
  // Returns the bytes moved each way.
  int64_t sealed_all_reduce(torch::Tensor& t, const std::atomic<bool>* abort = nullptr);
  void check_reduce_input(const torch::Tensor& t) const;
  PostedReduce post_all_reduce(const torch::Tensor& t, bool overlapped);
  void finish_all_reduce(PostedReduce& p, torch::Tensor& t);
  const torch::Device& dev() const { return built.devices.device; }

  // Accumulates the time spent blocked into stats.idle_s.
  struct Idle {
    Impl& impl;
    Clock::time_point start = Clock::now();
    ~Idle() {
      if (!on_flight_thread) impl.stats.idle_s += std::chrono::duration<double>(Clock::now() - start).count();
    }
  };

  void ensure_usable(const char* op) const {
    std::lock_guard lock(broken_mu);
    if (!broken.empty())
      throw CommError(fmt::format("rank {}: {} on a communicator that already failed: {}", o.rank, op, broken),
                      "a failed process group cannot be reused; restart the ranks (from the last checkpoint)");
  }

  // One overlapped operation per worker (communicator.hpp): a second start, or an exchange beside
  // the one in flight (both would count the same pairs' rounds), is a caller's bug.
  void check_no_flight(const char* op) const {
    if (flight && !on_flight_thread)
      throw CommError(fmt::format("rank {}: {} while an overlapped operation is in flight", o.rank, op),
                      "wait() for the operation in flight first: one at a time per worker");
  }

  // Whether this call may use the kept buffers (reduce_bufs, seal_bufs): on the flight's thread,
  // or while nothing is in flight; a blocking call beside a flight must not share them. On the
  // flight's thread `flight` is not read: the caller's thread sets it.
  bool may_keep_buffers() const { return on_flight_thread || !flight; }

  // Completes the operation in flight, if any; its failure is kept for its handle's wait().
  void land() {
    if (!flight) return;
    const auto f = std::move(flight);
    if (f->thread.joinable()) f->thread.join();
    if (f->finish) {
      try {
        f->finish();
      } catch (...) {
        f->failure = std::current_exception();
      }
      f->finish = nullptr;
    }
    stats.bytes_sent += f->bytes;
    stats.bytes_received += f->bytes;
    f->bytes = 0;
  }

  // A tensor the backend can work on, or a CommError saying where it must be.
  void check_device(const char* op, const torch::Tensor& t) const {
    const auto& p = built.devices;
    if (t.device() == p.device || (p.stage_cpu && t.device().is_cpu())) return;
    throw CommError(fmt::format("rank {}: {} with the {} backend needs tensors on {}{}, got one on {}", o.rank, op,
                                p.backend, p.device.str(), p.stage_cpu ? " (or the CPU)" : "", t.device().str()));
  }

  // `t` itself when the backend can use it in place, else a contiguous copy on its device.
  torch::Tensor staged(const torch::Tensor& t, c10::ScalarType dtype) const {
    if (t.device() == dev() && t.is_contiguous() && t.scalar_type() == dtype) return t;
    return t.to(dev(), dtype).contiguous();
  }

  // Throws the CommError for `msg`, a failure of the operation with `peer` (-1: a collective).
  // Before that, this rank names the rank that failed first (the peer's own record when the peer
  // failed because of a third rank) and records it in the store for the ranks that fail after it.
  [[noreturn]] void fail(const std::string& msg, int peer = -1, bool timed_out = false) {
    std::string text = msg;
    int root = peer;
    if (store) {
      // The reports below must not wait a whole timeout each on a store that hangs too.
      store->setTimeout(std::min(timeout, std::chrono::milliseconds(3000)));
      // A peer that timed out at the same moment as this rank publishes its record a moment later.
      const double wait_s = timed_out ? std::min(2.0, o.timeout_s / 2) : 0.0;
      const FailureRecord rec = root_failure(*store, o.rank, o.world, peer, msg, wait_s);
      publish_failure(*store, o.rank, rec);
      root = rec.root;
      if (rec.what != msg)
        text += rec.root >= 0 ? fmt::format("; the failure started at rank {}: {}", rec.root, rec.what)
                              : fmt::format("; an earlier failure: {}", rec.what);
      text += describe_dead_ranks(*store, o.rank, o.world);
    }
    {
      std::lock_guard lock(broken_mu);
      if (broken.empty()) broken = text;
    }
    throw CommError(text,
                    root >= 0 ? fmt::format("look at rank {}'s output first; raise cluster.timeout_s (gasloc launch "
                                            "--timeout) if it is only slow",
                                            root)
                              : "check the other ranks' output; raise cluster.timeout_s (gasloc launch --timeout) if "
                                "they are only slow",
                    root);
  }

  // Posts an operation; a backend that refuses it at once fails like the operation.
  template <class F>
  c10::intrusive_ptr<c10d::Work> post(F&& fn, const std::function<std::string(const std::string&)>& failed, int peer = -1) {
    try {
      return fn();
    } catch (const std::exception& e) {
      fail(failed(first_line(e.what())), peer);
    }
  }

  // Waits for `w` until `deadline`; a failure becomes a CommError worded by describe(timed_out,
  // detail). `seq`: the collective's arrival number when it is not the latest (an overlapped one).
  template <class Describe>
  void wait(const c10::intrusive_ptr<c10d::Work>& w, Clock::time_point deadline, Describe&& describe, int peer = -1,
            int64_t seq = -1) {
    // 0 ms would mean "no timeout" to c10d; never pass it.
    const auto left =
        std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    WaitFailure f;
    try {
      if (w->wait(left)) return;
      f.detail = "aborted";
    } catch (const c10d::TimeoutError& e) {
      f = {true, first_line(e.what())};
    } catch (const std::exception& e) {
      f.detail = first_line(e.what());
    }
    // The margin covers the backend's own clock, started a moment before ours.
    f.timed_out = f.timed_out || Clock::now() + std::chrono::milliseconds(50) >= deadline;
    std::string msg = describe(f.timed_out, f.detail);
    if (f.timed_out && peer < 0) {
      // A collective: the store knows who never entered it.
      std::vector<int> late;
      if (seq < 0) seq = collective_seq;
      const std::string who = arrivals.behind(seq, &late);
      if (!who.empty()) msg += fmt::format("; never arrived at this collective (#{}): {}", seq, who);
      if (late.size() == 1) peer = late[0];
    }
    fail(msg, peer, f.timed_out);
  }

  // The wording of a collective's failure.
  auto collective_failure(const std::string& what, const std::string& not_called) {
    return [this, what, not_called](bool timed_out, const std::string& detail) {
      return timed_out ? fmt::format("rank {}: {} timed out after {} (a rank may have died, be stuck, or not have {})",
                                     o.rank, what, secs(o.timeout_s), not_called)
                       : fmt::format("rank {}: {} failed: {} (a rank may have died)", o.rank, what, detail);
    };
  }

  // Peers are other ranks of the group, each listed once.
  void check_peers(const std::vector<int>& peers) const {
    for (size_t k = 0; k < peers.size(); ++k) {
      const int p = peers[k];
      if (p < 0 || p >= o.world || p == o.rank)
        throw CommError(fmt::format("rank {}: exchange with rank {}: peers must be other ranks in 0..{}", o.rank, p, o.world - 1));
      if (std::find(peers.begin(), peers.begin() + static_cast<long>(k), p) != peers.begin() + static_cast<long>(k))
        throw CommError(fmt::format("rank {}: exchange lists rank {} twice", o.rank, p));
    }
  }

  // Where a payload from a peer lands: the caller's tensor when it fits and nothing else refers
  // to it or its storage (the in-process backend hands out fresh tensors, and a caller keeping
  // last round's must not see them overwritten), else a fresh one.
  static torch::Tensor receive_buffer(const torch::Tensor& r, const torch::Tensor& send) {
    const bool reusable = r.defined() && r.scalar_type() == send.scalar_type() && r.sizes() == send.sizes() &&
                          r.is_contiguous() && r.device() == send.device() && r.use_count() == 1 &&
                          r.storage().use_count() == 1 && r.storage_offset() == 0;
    return reusable ? r : torch::empty_like(send, torch::MemoryFormat::Contiguous);
  }

  // Every rank must reduce or broadcast the same numel and dtype: gather (numel, dtype) from all
  // ranks first (a few bytes) and name the disagreeing ranks, instead of letting the backend read
  // or write past a buffer.
  void check_same_buffer(const char* op, const torch::Tensor& t) {
    collective_seq = arrivals.arrive(op);
    auto mine = torch::tensor({t.numel(), static_cast<int64_t>(t.scalar_type())}, torch::kInt64).to(dev());
    std::vector<at::Tensor> in{mine};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < o.world; ++r) out[0].push_back(torch::empty_like(mine));
    auto w = post([&] { return pg().allgather(out, in); },
                  [&](const std::string& d) { return fmt::format("rank {}: {} failed: {}", o.rank, op, d); });
    wait(w, Clock::now() + timeout, [&](bool timed_out, const std::string& detail) {
      return timed_out ? fmt::format("rank {}: {} timed out after {} (a rank may have died, be stuck, or not have "
                                     "called {})",
                                     o.rank, op, secs(o.timeout_s), op)
                       : fmt::format("rank {}: {} failed: {}", o.rank, op, detail);
    });
    for (int r = 0; r < o.world; ++r) {
      const auto h = out[0][r].cpu();
      const auto n = h[0].item<int64_t>();
      const auto dt = static_cast<c10::ScalarType>(h[1].item<int64_t>());
      if (n != t.numel() || dt != t.scalar_type())
        fail(fmt::format("rank {}: {} on buffers that differ between ranks: rank {} has {} {} elements, rank {} has {} "
                         "{} elements",
                         o.rank, op, o.rank, t.numel(), dtype_name(static_cast<int64_t>(t.scalar_type())), r, n, dtype_name(static_cast<int64_t>(dt))));
    }
  }
};

namespace {
// Makes the backend's device current for a scope (CUDA); nothing for the CPU.
struct OnDevice {
  c10::OptionalDeviceGuard guard;
  explicit OnDevice(const torch::Device& d) {
    if (!d.is_cpu()) guard.reset_device(d);
  }
};
}  // namespace

ProcessGroupComm::ProcessGroupComm(const GlooOptions& o, const BackendBuilder& build) : impl_(std::make_unique<Impl>()) {
  validate(o, /*check_rank=*/false);  // join_store checks the rank and tells every rank
  auto& I = *impl_;
  I.o = o;
  I.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  I.pair_calls.assign(o.world, 0);
  I.flight_pair_calls.assign(o.world, 0);
  I.limit = std::make_unique<LinkLimit>(o.bandwidth_limit_Bps);
  I.store = join_store(o);
  I.arrivals = Arrivals(I.store, o.rank, o.world);
  if (!o.job.secret.empty()) {
    // A fixed world's store serves one run (join_store refuses a rank claimed twice), and its salt
    // is new at every start: a pair and its call count name a channel once.
    I.sealing = std::make_unique<PairSealing>(PairSealing{
        o.job.secret, read_session_salt(I.store), o.job.token, [rank = o.rank](const PairLink& l, uint32_t call) {
          return fmt::format("pg {}-{} {}call {}", std::min(rank, l.peer), std::max(rank, l.peer),
                             l.lane ? "overlapped " : "", call);
        }});
  }
  I.built = build(o, I.store);
  // Everyone has finished connecting before anyone returns, so that rank 0 (which hosts the
  // store) cannot exit while a peer still reads the addresses it needs from the store. For NCCL
  // it also creates the communicator now, not inside the first real call.
  barrier();
  I.stats = {};
  I.t0 = Clock::now();
  // Beats for the store's host over a connection of its own (heartbeat.hpp); torchrun's agent
  // store has no host that watches.
  if (!o.agent_store) I.heartbeat = std::make_unique<Heartbeat>(job_keys_reconnecting(o), o.rank);
}

ProcessGroupComm::~ProcessGroupComm() {
  if (impl_) impl_->land();  // its thread uses the backend
  if (impl_ && impl_->built.backend && impl_->built.shutdown) {
    try {
      impl_->built.shutdown(*impl_->built.backend);
    } catch (const std::exception&) {
    }
  }
}

int ProcessGroupComm::rank() const { return impl_->o.rank; }
int ProcessGroupComm::world() const { return impl_->o.world; }
const GlooOptions& ProcessGroupComm::options() const { return impl_->o; }
torch::Device ProcessGroupComm::device() const { return impl_->dev(); }

void ProcessGroupComm::record_own_failure(const std::string& what) {
  if (impl_->store) publish_failure(*impl_->store, impl_->o.rank, {impl_->o.rank, what});
}
CommStats ProcessGroupComm::stats() const { return impl_->stats; }
double ProcessGroupComm::now() const { return std::chrono::duration<double>(Clock::now() - impl_->t0).count(); }

int64_t ProcessGroupComm::Impl::exchange(const std::vector<int>& peers, const torch::Tensor& send_in,
                                         std::vector<torch::Tensor>& recv, bool into, const std::atomic<bool>* abort,
                                         const std::vector<torch::Tensor>* per_peer) {
  OnDevice on(dev());
  Idle idle{*this};
  const torch::Tensor send = staged(send_in, send_in.scalar_type());
  const bool on_other_device = send_in.device() != dev();
  std::vector<PairLink> links;
  const int lane = on_flight_thread ? 1 : 0;
  for (int p : peers) links.push_back({p, built.backend.get(), p, lane ? &flight_pair_calls[p] : &pair_calls[p], lane});
  std::vector<torch::Tensor> got(peers.size());
  for (size_t k = 0; k < peers.size(); ++k)
    got[k] = on_other_device ? torch::empty_like(send, torch::MemoryFormat::Contiguous)
                             : (into ? recv[k] : receive_buffer(recv[k], send));
  PairTransferOptions po;
  po.rank = o.rank;
  po.timeout = timeout;
  po.pairs_in_order = built.pairs_in_order;
  po.fail_fast = true;  // a fixed world fails whole: the first failure is the one to name
  po.device = dev();
  po.limit = limit.get();
  po.abort = abort;
  po.seal = sealing.get();
  if (may_keep_buffers()) po.seal_buffers = &seal_bufs;
  int64_t moved = 0;
  const std::vector<PeerResult> results =
      per_peer ? transfer_pairs(links, *per_peer, got, po, &moved) : transfer_pairs(links, send, got, po, &moved);
  for (size_t k = 0; k < peers.size(); ++k) {
    const PeerResult& r = results[k];
    const int p = peers[k];
    if (r.outcome == PeerOutcome::mismatch) fail(r.why, p);
    // Anyone on the path can make a message fail to open: no rank is named as the one that failed.
    if (r.outcome == PeerOutcome::unopened) fail(r.why);
    if (r.outcome != PeerOutcome::failed) continue;
    fail(r.timed_out ? fmt::format("rank {}: exchange with rank {} timed out after {} (rank {} may have died, be stuck, "
                                   "or not list rank {} among its peers)",
                                   o.rank, p, secs(o.timeout_s), p, o.rank)
                     : fmt::format("rank {}: exchange with rank {} failed: {} (rank {} may have died)", o.rank, p, r.why, p),
         p, r.timed_out);
  }
  // A staged send gets its tensors back where it was (fresh ones, like the in-process backend).
  for (size_t k = 0; k < peers.size(); ++k) {
    if (into && on_other_device) recv[k].copy_(got[k]);
    else if (!into) recv[k] = on_other_device ? got[k].to(send_in.device()) : got[k];
  }
  return moved;
}

// With a secret, Gloo's ring (which moves bytes in the clear) is replaced by a reduce-scatter and
// an all-gather over sealed transfers, each rank the owner of one chunk of C = ceil(N / n)
// elements (the buffer padded with zeros to n C): every rank sends chunk p of its tensor to rank
// p, which sums the n copies of its chunk in id order, ((x0 + x1) + x2) + ..., as the in-process
// reference adds (half precision in fp32), divides by n, and sends the result to every other
// rank. Each rank sends 2 (n - 1) C elements, the ring's 2 (n - 1) / n of the buffer; the sums are
// the reference's bit for bit, since each element is added in the same order.
int64_t ProcessGroupComm::Impl::sealed_all_reduce(torch::Tensor& t, const std::atomic<bool>* abort) {
  const int n = o.world, me = o.rank;
  std::vector<int> others;
  for (int r = 0; r < n; ++r)
    if (r != me) others.push_back(r);
  // Slot k: `numel` elements of `dtype` from the kept byte buffers (kept_bytes: the small
  // all-reduces of other dtypes between two of a model's do not shrink them).
  std::vector<torch::Tensor> own;
  std::vector<torch::Tensor>& bufs = may_keep_buffers() ? reduce_bufs : own;
  auto reused = [&](size_t k, int64_t numel, c10::ScalarType dtype) {
    return kept_bytes(bufs, k, numel * static_cast<int64_t>(c10::elementSize(dtype)), dev()).view(dtype);
  };
  const int64_t N = t.numel(), C = (N + n - 1) / n;
  const auto dtype = t.scalar_type();
  // This rank's tensor, padded: chunk c of it goes to rank c; chunk `me` collects the result.
  torch::Tensor padded = reused(0, n * C, dtype);
  padded.narrow(0, 0, N).copy_(t.reshape({-1}));
  padded.narrow(0, N, n * C - N).zero_();
  auto chunk = [&](int c) { return padded.narrow(0, c * C, C); };

  // 1. Reduce-scatter: chunk p to rank p; from every other rank, its copy of chunk `me`.
  std::vector<torch::Tensor> sends, got(others.size());
  for (size_t k = 0; k < others.size(); ++k) {
    sends.push_back(chunk(others[k]));
    got[k] = reused(1 + k, C, dtype);
  }
  int64_t moved = exchange(others, sends[0], got, /*into=*/true, abort, &sends);
  auto of = [&](int r) { return r == me ? chunk(me) : got[static_cast<size_t>(r < me ? r : r - 1)]; };
  const bool upcast = dtype == torch::kHalf || dtype == torch::kBFloat16;
  // Accumulates in rank 0's copy (on rank 0 its own chunk, else the received buffer), or in fp32.
  torch::Tensor sum = upcast ? reused(n, C, torch::kFloat).copy_(of(0)) : of(0);
  for (int r = 1; r < n; ++r) sum.add_(of(r));
  sum.div_(n);
  if (sum.data_ptr() != chunk(me).data_ptr()) chunk(me).copy_(sum);

  // 2. All-gather: the reduced chunk to every other rank; theirs into their chunks.
  std::vector<torch::Tensor> into;
  for (int p : others) into.push_back(chunk(p));
  moved += exchange(others, chunk(me), into, /*into=*/true, abort);
  t.copy_(padded.narrow(0, 0, N).view(t.sizes()));
  return moved;
}

void ProcessGroupComm::Impl::check_reduce_input(const torch::Tensor& t) const {
  ensure_usable("all_reduce_mean");
  if (!t.is_floating_point())
    throw CommError(fmt::format("rank {}: all_reduce_mean needs a floating-point tensor, got {}", o.rank,
                                dtype_name(static_cast<int64_t>(t.scalar_type()))));
  check_device("all_reduce_mean", t);
}

ProcessGroupComm::Impl::PostedReduce ProcessGroupComm::Impl::post_all_reduce(const torch::Tensor& t, bool overlapped) {
  check_same_buffer("all_reduce_mean", t);
  PostedReduce p;
  p.seq = collective_seq;
  // Counted and throttled as a ring all-reduce (every rank sends and receives 2(n-1)/n of the
  // buffer), the same as the in-process backend prices it. Overlapped, the limit delays when the
  // transfer may end, not when it starts: the worker computes meanwhile.
  p.wire = ring_allreduce_bytes(t.numel() * t.element_size(), o.world);
  const auto wire = static_cast<double>(p.wire);
  if (overlapped)
    p.ready = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                 limit->take(wire, wire)));
  else
    limit->pay(wire, wire);
  // Half-precision buffers are summed in fp32: fewer rounding steps than the backend's fp16 sum.
  const bool upcast = t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16;
  p.buf = staged(t, upcast ? torch::kFloat : t.scalar_type());
  std::vector<at::Tensor> v{p.buf};
  const auto describe = collective_failure("all_reduce_mean", "called all_reduce_mean");
  p.work = post([&] { return pg().allreduce(v); }, [&](const std::string& d) { return describe(false, d); });
  p.deadline = Clock::now() + timeout;
  return p;
}

void ProcessGroupComm::Impl::finish_all_reduce(PostedReduce& p, torch::Tensor& t) {
  std::this_thread::sleep_until(p.ready);
  wait(p.work, p.deadline, collective_failure("all_reduce_mean", "called all_reduce_mean"), -1, p.seq);
  p.buf.div_(o.world);
  if (!p.buf.is_same(t)) t.copy_(p.buf);
  stats.bytes_sent += p.wire;
  stats.bytes_received += p.wire;
}

void ProcessGroupComm::all_reduce_mean(torch::Tensor& t) {
  auto& I = *impl_;
  I.check_reduce_input(t);
  if (I.o.world == 1) return;
  OnDevice on(I.dev());
  Impl::Idle idle{I};
  if (I.sealing) {
    const int64_t moved = I.sealed_all_reduce(t);
    I.stats.bytes_sent += moved;
    I.stats.bytes_received += moved;
    return;
  }
  auto posted = I.post_all_reduce(t, /*overlapped=*/false);
  I.finish_all_reduce(posted, t);
}

void ProcessGroupComm::exchange(const std::vector<int>& peers, const torch::Tensor& send, std::vector<torch::Tensor>& recv) {
  auto& I = *impl_;
  I.ensure_usable("exchange");
  I.check_no_flight("exchange");
  I.check_peers(peers);
  I.check_device("exchange", send);
  recv.resize(peers.size());
  if (peers.empty()) return;
  const int64_t moved = I.exchange(peers, send, recv, /*into=*/false);
  I.stats.bytes_sent += moved;
  I.stats.bytes_received += moved;
}

// The handle of an overlapped operation: wait() lands it and counts the time it blocks as idle.
class ProcessGroupComm::InFlight final : public Pending {
 public:
  InFlight(Impl& I, std::shared_ptr<Flight> f) : I_(I), f_(std::move(f)) {}
  void wait() override {
    if (waited_) throw CommError("wait: called twice on one operation");
    waited_ = true;
    const bool cut_short = f_->aborted && !f_->thread.joinable();  // an aborted all-reduce: not waited for
    if (I_.flight == f_ && cut_short) {
      I_.flight.reset();
    } else if (I_.flight == f_) {
      Impl::Idle idle{I_};
      I_.land();
    }
    if (f_->failure) std::rethrow_exception(f_->failure);
  }
  bool completed() const override {
    return waited_ || (f_->thread.joinable() ? f_->done.load() : !f_->work || f_->work->isCompleted());
  }
  void abort() override {
    if (waited_ || completed()) return;
    f_->aborted = true;  // an exchange: its thread's waits end within 50 ms (pair_transfer.hpp)
    if (f_->thread.joinable()) return;
    // An all-reduce cannot be cut short: the backend ends it or times it out; this rank is done.
    const std::string what = fmt::format("rank {}: the overlapped all_reduce_mean was aborted before it completed", I_.o.rank);
    {
      std::lock_guard lock(I_.broken_mu);
      if (I_.broken.empty()) I_.broken = what;
    }
    f_->failure = std::make_exception_ptr(CommError(what, "a process group cannot continue after an abort; restart the ranks"));
  }

 private:
  Impl& I_;
  std::shared_ptr<Flight> f_;
  bool waited_ = false;
};

std::unique_ptr<Pending> ProcessGroupComm::start_exchange(const std::vector<int>& peers, const torch::Tensor& send,
                                                          std::vector<torch::Tensor>& recv) {
  auto& I = *impl_;
  I.check_no_flight("start_exchange");
  I.ensure_usable("exchange");
  I.check_peers(peers);
  I.check_device("exchange", send);
  if (peers.empty()) return Communicator::start_exchange(peers, send, recv);
  // The receives land in these tensors' storage, which the caller holds while it computes.
  recv.clear();
  for (size_t k = 0; k < peers.size(); ++k) recv.push_back(torch::empty_like(send, torch::MemoryFormat::Contiguous));
  auto f = std::make_shared<Flight>();
  f->thread = std::thread([&I, flight = f.get(), peers, send, into = recv]() mutable {
    on_flight_thread = true;
    try {
      flight->bytes = I.exchange(peers, send, into, /*into=*/true, &flight->aborted);
    } catch (...) {
      flight->failure = std::current_exception();
    }
    flight->done = true;
  });
  I.flight = f;
  return std::make_unique<InFlight>(I, std::move(f));
}

std::unique_ptr<Pending> ProcessGroupComm::start_all_reduce_mean(torch::Tensor& t) {
  auto& I = *impl_;
  I.check_no_flight("start_all_reduce_mean");
  I.check_reduce_input(t);
  if (I.o.world == 1) return Communicator::start_all_reduce_mean(t);
  if (I.sealing) {
    // Sealed transfers on a thread of its own, as an overlapped exchange; t is written there.
    auto f = std::make_shared<Flight>();
    f->thread = std::thread([&I, flight = f.get(), out = t]() mutable {
      on_flight_thread = true;
      try {
        OnDevice on(I.dev());
        flight->bytes = I.sealed_all_reduce(out, &flight->aborted);
      } catch (...) {
        flight->failure = std::current_exception();
      }
      flight->done = true;
    });
    I.flight = f;
    return std::make_unique<InFlight>(I, std::move(f));
  }
  OnDevice on(I.dev());
  // Posted now, on the worker's thread, so that every rank's collectives reach the backend in one
  // order; the backend's own threads move it while the worker computes.
  std::shared_ptr<Impl::PostedReduce> posted;
  {
    Impl::Idle idle{I};  // the size check meets every rank
    posted = std::make_shared<Impl::PostedReduce>(I.post_all_reduce(t, /*overlapped=*/true));
  }
  auto f = std::make_shared<Flight>();
  f->work = posted->work;
  f->finish = [&I, posted, out = t]() mutable {
    OnDevice on(I.dev());
    I.finish_all_reduce(*posted, out);
  };
  I.flight = f;
  return std::make_unique<InFlight>(I, std::move(f));
}

void ProcessGroupComm::broadcast(torch::Tensor& t, int root) {
  auto& I = *impl_;
  const int me = I.o.rank;
  I.ensure_usable("broadcast");
  if (root < 0 || root >= I.o.world)
    throw CommError(fmt::format("rank {}: broadcast root {} is outside 0..{}", me, root, I.o.world - 1));
  I.check_device("broadcast", t);
  if (I.o.world == 1) return;
  OnDevice on(I.dev());
  Impl::Idle idle{I};
  if (I.sealing) {
    // Over sealed transfers: the root to each rank. A transfer goes both ways, so every other rank
    // sends its buffer to the root too, which drops it.
    std::vector<int> peers;
    for (int r = 0; r < I.o.world; ++r)
      if (me == root ? r != root : r == root) peers.push_back(r);
    std::vector<torch::Tensor> got(peers.size());
    const int64_t moved = I.exchange(peers, I.staged(t, t.scalar_type()), got, /*into=*/false);
    if (me != root) t.copy_(got[0].view(t.sizes()));
    I.stats.bytes_sent += moved;
    I.stats.bytes_received += moved;
    return;
  }
  I.check_same_buffer("broadcast", t);
  // Counted and throttled as a pipelined chain root -> root+1 -> ... like the in-process
  // backend: every rank but the last forwards the buffer once, every rank but the root receives it.
  const double nbytes = static_cast<double>(t.numel() * t.element_size());
  const int pos = (me - root + I.o.world) % I.o.world;
  const double sent = pos < I.o.world - 1 ? nbytes : 0.0, received = pos > 0 ? nbytes : 0.0;
  I.limit->pay(sent, received);
  torch::Tensor buf = I.staged(t, t.scalar_type());
  std::vector<at::Tensor> v{buf};
  c10d::BroadcastOptions bo;
  bo.rootRank = root;
  const auto describe = I.collective_failure(fmt::format("broadcast from rank {}", root), "called broadcast");
  auto w = I.post([&] { return I.pg().broadcast(v, bo); }, [&](const std::string& d) { return describe(false, d); });
  I.wait(w, Clock::now() + I.timeout, describe);
  if (!buf.is_same(t)) t.copy_(buf);
  I.stats.bytes_sent += static_cast<int64_t>(sent);
  I.stats.bytes_received += static_cast<int64_t>(received);
}

void ProcessGroupComm::barrier() {
  auto& I = *impl_;
  I.ensure_usable("barrier");
  if (I.o.world == 1) return;
  OnDevice on(I.dev());
  Impl::Idle idle{I};
  c10d::BarrierOptions bo;
  if (!I.dev().is_cpu()) bo.device_ids = {I.dev().index()};  // otherwise c10d guesses the GPU from the rank, and warns
  I.collective_seq = I.arrivals.arrive("barrier");
  const auto describe = I.collective_failure("barrier", "reached the barrier");
  auto w = I.post([&] { return I.pg().barrier(bo); }, [&](const std::string& d) { return describe(false, d); });
  I.wait(w, Clock::now() + I.timeout, describe);
}

}  // namespace gasloc::comm
