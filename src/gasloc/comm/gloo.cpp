// ProcessGroupGloo is declared only under USE_C10D_GLOO, which LibTorch's CMake config does not
// export; Linux builds of libtorch_cpu always contain Gloo, so declare it here (after the
// precompiled header, which does not include c10d).
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include "gasloc/comm/gloo.hpp"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <thread>

#include "gasloc/comm/network_model.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::comm {

using Clock = std::chrono::steady_clock;

TokenBucket::TokenBucket(double rate_Bps, double burst_bytes)
    : rate_(std::max(0.0, rate_Bps)),
      // 10 ms worth of tokens: enough to absorb timer jitter, too little to matter for a round.
      burst_(burst_bytes >= 0 ? burst_bytes : rate_ * 0.01),
      tokens_(burst_),
      last_(Clock::now()) {}

double TokenBucket::take(double bytes) {
  if (rate_ <= 0) return 0;
  const auto t = Clock::now();
  tokens_ = std::min(burst_, tokens_ + rate_ * std::chrono::duration<double>(t - last_).count());
  last_ = t;
  tokens_ -= bytes;
  // A negative balance is repaid by the refill while the caller waits.
  return tokens_ < 0 ? -tokens_ / rate_ : 0.0;
}

namespace {

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Int: return "int32";
    default: return c10::toString(t);
  }
}

// The first line of a c10d/Gloo message, without Gloo's "[file.cc:123] " source prefix.
std::string first_line(const std::string& s) {
  std::string l = s.substr(0, s.find('\n'));
  if (!l.empty() && l[0] == '[') {
    const auto close = l.find("] ");
    if (close != std::string::npos && l.find(".cc:") < close) l = l.substr(close + 2);
  }
  return l;
}

std::string secs(double s) { return fmt::format("{:g} s", s); }

// Tags keep exchange rounds apart: each pair of ranks counts the exchanges it did together (both
// ends count the same), and the tag carries that count and the message kind. Gloo's collectives
// use slots with a non-zero prefix, so these small tags never collide with them.
constexpr int kHeader = 0, kPayload = 1;
int make_tag(uint32_t pair_round, int kind) { return static_cast<int>(((pair_round & 0x0FFFFFFFu) << 2) | kind); }

constexpr int64_t kMagic = 0x6761736c6f63;  // "gasloc": a header that is not ours is a bug, not data

std::shared_ptr<::gloo::transport::Device> make_device(const GlooOptions& o) {
  try {
    if (!o.interface.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(o.interface);
    // All ranks on this host: bind the data connections to loopback too (the machine's hostname
    // may resolve to an address that is not reachable, or to nothing).
    const std::string& a = o.master_addr;
    if (a == "localhost" || a.rfind("127.", 0) == 0) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    if (a == "::1") return c10d::ProcessGroupGloo::createDeviceForHostname("::1");
    return c10d::ProcessGroupGloo::createDefaultDevice();
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {}: cannot open a Gloo network device{}: {}", o.rank,
                                o.interface.empty() ? "" : " on interface " + o.interface, first_line(e.what())),
                    "set GLOO_SOCKET_IFNAME to a network interface that reaches the other ranks (see `ip addr`)");
  }
}

}  // namespace

struct GlooCommunicator::Impl {
  GlooOptions o;
  std::chrono::milliseconds timeout{};
  // Declared before pg so that it is destroyed after it: rank 0's store must outlive the group.
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::vector<uint32_t> pair_round;  // exchanges done with each peer
  TokenBucket send_bucket, recv_bucket;
  CommStats stats;
  std::string broken;  // the first error; the group is unusable after it
  Clock::time_point t0;

  // Accumulates the time spent blocked into stats.idle_s.
  struct Idle {
    Impl& impl;
    Clock::time_point start = Clock::now();
    ~Idle() { impl.stats.idle_s += std::chrono::duration<double>(Clock::now() - start).count(); }
  };

  void ensure_usable(const char* op) const {
    if (!broken.empty())
      throw CommError(fmt::format("rank {}: {} on a communicator that already failed: {}", o.rank, op, broken),
                      "a failed process group cannot be reused; restart the ranks (from the last checkpoint)");
  }

  // Throws the CommError for `msg`, a failure of the operation with `peer` (-1: a collective).
  // Before that, this rank names the rank that failed first (the peer's own record when the peer
  // failed because of a third rank) and records it in the store for the ranks that fail after it.
  [[noreturn]] void fail(const std::string& msg, int peer = -1, bool timed_out = false) {
    std::string text = msg;
    int root = peer;
    if (store) {
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
    broken = text;
    throw CommError(text,
                    root >= 0 ? fmt::format("look at rank {}'s output first; raise cluster.timeout_s (gasloc launch "
                                            "--timeout) if it is only slow",
                                            root)
                              : "check the other ranks' output; raise cluster.timeout_s (gasloc launch --timeout) if "
                                "they are only slow",
                    root);
  }

  // Waits for `w` until `deadline`; a failure becomes a CommError worded by describe(timed_out,
  // detail). Gloo reports a timeout and a closed connection both as exceptions.
  template <class Describe>
  void wait(const c10::intrusive_ptr<c10d::Work>& w, Clock::time_point deadline, Describe&& describe, int peer = -1) {
    // 0 ms would mean "no timeout" to c10d; never pass it.
    const auto left =
        std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    std::string detail;
    try {
      if (w->wait(left)) return;
      detail = "aborted";
    } catch (const std::exception& e) {
      detail = first_line(e.what());
    }
    const bool timed_out = Clock::now() + std::chrono::milliseconds(50) >= deadline ||
                           detail.find("imed out") != std::string::npos || detail.find("imeout") != std::string::npos;
    fail(describe(timed_out, detail), peer, timed_out);
  }

  void sleep_for_bandwidth(double send_bytes, double recv_bytes) {
    const double d = std::max(send_bucket.take(send_bytes), recv_bucket.take(recv_bytes));
    if (d > 0) std::this_thread::sleep_for(std::chrono::duration<double>(d));
  }

  // Every rank must reduce or broadcast the same numel and dtype: gather (numel, dtype) from all
  // ranks first (a few bytes) and name the disagreeing ranks, instead of letting Gloo read or
  // write past a buffer.
  void check_same_buffer(const char* op, const torch::Tensor& t) {
    auto mine = torch::tensor({t.numel(), static_cast<int64_t>(t.scalar_type())}, torch::kInt64);
    std::vector<at::Tensor> in{mine};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < o.world; ++r) out[0].push_back(torch::empty_like(mine));
    c10::intrusive_ptr<c10d::Work> w;
    try {
      w = pg->allgather(out, in);
    } catch (const std::exception& e) {
      fail(fmt::format("rank {}: {} failed: {}", o.rank, op, first_line(e.what())));
    }
    wait(w, Clock::now() + timeout, [&](bool timed_out, const std::string& detail) {
      return timed_out ? fmt::format("rank {}: {} timed out after {} (a rank may have died, be stuck, or not have "
                                     "called {})",
                                     o.rank, op, secs(o.timeout_s), op)
                       : fmt::format("rank {}: {} failed: {}", o.rank, op, detail);
    });
    for (int r = 0; r < o.world; ++r) {
      const auto n = out[0][r][0].item<int64_t>();
      const auto dt = static_cast<c10::ScalarType>(out[0][r][1].item<int64_t>());
      if (n != t.numel() || dt != t.scalar_type())
        fail(fmt::format("rank {}: {} on buffers that differ between ranks: rank {} has {} {} elements, rank {} has {} "
                         "{} elements",
                         o.rank, op, o.rank, t.numel(), dtype_name(t.scalar_type()), r, n, dtype_name(dt)));
    }
  }
};

GlooCommunicator::GlooCommunicator(const GlooOptions& o) : impl_(std::make_unique<Impl>()) {
  validate(o, /*check_rank=*/false);  // join_store checks the rank and tells every rank
  auto& I = *impl_;
  I.o = o;
  I.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  I.pair_round.assign(o.world, 0);
  I.send_bucket = TokenBucket(o.bandwidth_limit_Bps);
  I.recv_bucket = TokenBucket(o.bandwidth_limit_Bps);
  I.store = join_store(o);
  auto pg_opts = c10d::ProcessGroupGloo::Options::create(I.timeout);
  pg_opts->devices.push_back(make_device(o));
  try {
    I.pg = c10::make_intrusive<c10d::ProcessGroupGloo>(I.store, o.rank, o.world, pg_opts);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {} could not connect to the other ranks over Gloo: {}{}", o.rank,
                                first_line(e.what()), describe_dead_ranks(*I.store, o.rank, o.world)),
                    "a rank may have died during start-up, or a firewall blocks the ranks' ports (GLOO_SOCKET_IFNAME "
                    "selects the interface)");
  }
  // Everyone has finished connecting before anyone returns, so that rank 0 (which hosts the
  // store) cannot exit while a peer still reads the addresses it needs from the store.
  barrier();
  I.stats = {};
  I.t0 = Clock::now();
}

GlooCommunicator::~GlooCommunicator() = default;

int GlooCommunicator::rank() const { return impl_->o.rank; }
int GlooCommunicator::world() const { return impl_->o.world; }
const GlooOptions& GlooCommunicator::options() const { return impl_->o; }

void GlooCommunicator::record_own_failure(const std::string& what) {
  if (impl_->store) publish_failure(*impl_->store, impl_->o.rank, {impl_->o.rank, what});
}
CommStats GlooCommunicator::stats() const { return impl_->stats; }
double GlooCommunicator::now() const { return std::chrono::duration<double>(Clock::now() - impl_->t0).count(); }

void GlooCommunicator::all_reduce_mean(torch::Tensor& t) {
  auto& I = *impl_;
  const int me = I.o.rank;
  I.ensure_usable("all_reduce_mean");
  if (!t.is_floating_point() || !t.device().is_cpu())
    throw CommError(fmt::format("rank {}: all_reduce_mean needs a CPU floating-point tensor, got {} on {}", me,
                                dtype_name(t.scalar_type()), t.device().str()));
  if (I.o.world == 1) return;
  Impl::Idle idle{I};
  I.check_same_buffer("all_reduce_mean", t);
  // Counted and throttled as a ring all-reduce (every rank sends and receives 2(n-1)/n of the
  // buffer), the same as the in-process backend prices it.
  const auto wire = static_cast<double>(ring_allreduce_bytes(t.numel() * t.element_size(), I.o.world));
  I.sleep_for_bandwidth(wire, wire);
  // Half-precision buffers are summed in fp32: fewer rounding steps than Gloo's fp16 sum.
  const bool upcast = t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16;
  torch::Tensor buf = upcast ? t.to(torch::kFloat).contiguous() : t.contiguous();
  std::vector<at::Tensor> v{buf};
  c10::intrusive_ptr<c10d::Work> w;
  try {
    w = I.pg->allreduce(v);
  } catch (const std::exception& e) {
    I.fail(fmt::format("rank {}: all_reduce_mean failed: {}", me, first_line(e.what())));
  }
  I.wait(w, Clock::now() + I.timeout, [&](bool timed_out, const std::string& detail) {
    return timed_out ? fmt::format("rank {}: all_reduce_mean timed out after {} (a rank may have died, be stuck, or not "
                                   "have called all_reduce_mean)",
                                   me, secs(I.o.timeout_s))
                     : fmt::format("rank {}: all_reduce_mean failed: {} (a rank may have died)", me, detail);
  });
  buf.div_(I.o.world);
  if (!buf.is_same(t)) t.copy_(buf);
  I.stats.bytes_sent += static_cast<int64_t>(wire);
  I.stats.bytes_received += static_cast<int64_t>(wire);
}

void GlooCommunicator::exchange(const std::vector<int>& peers, const torch::Tensor& send_in,
                                std::vector<torch::Tensor>& recv) {
  auto& I = *impl_;
  const int me = I.o.rank;
  I.ensure_usable("exchange");
  for (size_t k = 0; k < peers.size(); ++k) {
    const int p = peers[k];
    if (p < 0 || p >= I.o.world || p == me)
      throw CommError(fmt::format("rank {}: exchange with rank {}: peers must be other ranks in 0..{}", me, p, I.o.world - 1));
    if (std::find(peers.begin(), peers.begin() + static_cast<long>(k), p) != peers.begin() + static_cast<long>(k))
      throw CommError(fmt::format("rank {}: exchange lists rank {} twice", me, p));
  }
  if (!send_in.device().is_cpu())
    throw CommError(fmt::format("rank {}: the Gloo backend exchanges CPU tensors, got one on {}", me, send_in.device().str()));
  recv.resize(peers.size());
  if (peers.empty()) return;
  Impl::Idle idle{I};
  const torch::Tensor send = send_in.contiguous();
  const auto n = static_cast<int64_t>(peers.size());
  std::vector<int> tags(peers.size());
  for (size_t k = 0; k < peers.size(); ++k) tags[k] = make_tag(I.pair_round[peers[k]]++, 0);

  auto timed_out_msg = [&](int p) {
    return fmt::format("rank {}: exchange with rank {} timed out after {} (rank {} may have died, be stuck, or not list "
                       "rank {} among its peers)",
                       me, p, secs(I.o.timeout_s), p, me);
  };
  auto failed_msg = [&](int p, const std::string& detail) {
    return fmt::format("rank {}: exchange with rank {} failed: {} (rank {} may have died)", me, p, detail, p);
  };
  auto post = [&](auto&& fn, int p) {
    try {
      return fn();
    } catch (const std::exception& e) {
      I.fail(failed_msg(p, first_line(e.what())), p);
    }
  };

  // 1. Headers: every receive, then every send, then wait. Each side learns the other's size.
  torch::Tensor my_header = torch::tensor({kMagic, send.numel(), static_cast<int64_t>(send.scalar_type())}, torch::kInt64);
  std::vector<torch::Tensor> headers(peers.size());
  std::vector<c10::intrusive_ptr<c10d::Work>> recv_w(peers.size()), send_w(peers.size());
  for (size_t k = 0; k < peers.size(); ++k) {
    headers[k] = torch::zeros({3}, torch::kInt64);
    std::vector<at::Tensor> v{headers[k]};
    recv_w[k] = post([&] { return I.pg->recv(v, peers[k], tags[k] | kHeader); }, peers[k]);
  }
  for (size_t k = 0; k < peers.size(); ++k) {
    std::vector<at::Tensor> v{my_header};
    send_w[k] = post([&] { return I.pg->send(v, peers[k], tags[k] | kHeader); }, peers[k]);
  }
  auto deadline = Clock::now() + I.timeout;
  auto describe_for = [&](int p) {
    return [&, p](bool timed_out, const std::string& detail) { return timed_out ? timed_out_msg(p) : failed_msg(p, detail); };
  };
  for (size_t k = 0; k < peers.size(); ++k) I.wait(recv_w[k], deadline, describe_for(peers[k]), peers[k]);
  for (size_t k = 0; k < peers.size(); ++k) {
    const auto h = headers[k].accessor<int64_t, 1>();
    const auto dt = static_cast<c10::ScalarType>(h[2]);
    if (h[0] != kMagic)
      I.fail(fmt::format("rank {}: exchange with rank {}: received a malformed header (is rank {} running another "
                         "program or version?)",
                         me, peers[k], peers[k]),
             peers[k]);
    if (h[1] != send.numel() || dt != send.scalar_type()) {
      // Lower rank first, so both ends print the same sentence.
      std::string a = fmt::format("rank {} sends {} {} elements", me, send.numel(), dtype_name(send.scalar_type()));
      std::string b = fmt::format("rank {} sends {} {} elements", peers[k], h[1], dtype_name(dt));
      if (peers[k] < me) std::swap(a, b);
      I.fail(fmt::format("rank {}: exchange with rank {}: {} but {}; both ends of a link must exchange buffers of the same "
                         "size and dtype",
                         me, peers[k], a, b),
             peers[k]);
    }
  }
  for (size_t k = 0; k < peers.size(); ++k) I.wait(send_w[k], deadline, describe_for(peers[k]), peers[k]);

  // 2. Payload. A rank with a bandwidth limit starts it late, as its slow link would finish late.
  const double nbytes = static_cast<double>(send.numel() * send.element_size());
  I.sleep_for_bandwidth(n * nbytes, n * nbytes);
  for (size_t k = 0; k < peers.size(); ++k) {
    auto& r = recv[k];
    // Reuse the caller's tensor only when nothing else refers to it or its storage: the
    // in-process backend hands out fresh tensors, and a caller keeping last round's must not
    // see them overwritten.
    const bool reusable = r.defined() && r.scalar_type() == send.scalar_type() && r.sizes() == send.sizes() &&
                          r.is_contiguous() && r.device().is_cpu() && r.use_count() == 1 &&
                          r.storage().use_count() == 1 && r.storage_offset() == 0;
    if (!reusable)
      r = torch::empty_like(send, torch::MemoryFormat::Contiguous);
  }
  if (send.numel() > 0) {
    for (size_t k = 0; k < peers.size(); ++k) {
      std::vector<at::Tensor> v{recv[k]};
      recv_w[k] = post([&] { return I.pg->recv(v, peers[k], tags[k] | kPayload); }, peers[k]);
    }
    for (size_t k = 0; k < peers.size(); ++k) {
      std::vector<at::Tensor> v{send};
      send_w[k] = post([&] { return I.pg->send(v, peers[k], tags[k] | kPayload); }, peers[k]);
    }
    deadline = Clock::now() + I.timeout;
    for (size_t k = 0; k < peers.size(); ++k) I.wait(recv_w[k], deadline, describe_for(peers[k]), peers[k]);
    for (size_t k = 0; k < peers.size(); ++k) I.wait(send_w[k], deadline, describe_for(peers[k]), peers[k]);
  }
  I.stats.bytes_sent += static_cast<int64_t>(n * nbytes);
  I.stats.bytes_received += static_cast<int64_t>(n * nbytes);
}

void GlooCommunicator::broadcast(torch::Tensor& t, int root) {
  auto& I = *impl_;
  const int me = I.o.rank;
  I.ensure_usable("broadcast");
  if (root < 0 || root >= I.o.world)
    throw CommError(fmt::format("rank {}: broadcast root {} is outside 0..{}", me, root, I.o.world - 1));
  if (!t.device().is_cpu())
    throw CommError(fmt::format("rank {}: the Gloo backend broadcasts CPU tensors, got one on {}", me, t.device().str()));
  if (I.o.world == 1) return;
  Impl::Idle idle{I};
  I.check_same_buffer("broadcast", t);
  // Counted and throttled as a pipelined chain root -> root+1 -> ... like the in-process
  // backend: every rank but the last forwards the buffer once, every rank but the root receives it.
  const double nbytes = static_cast<double>(t.numel() * t.element_size());
  const int pos = (me - root + I.o.world) % I.o.world;
  const double sent = pos < I.o.world - 1 ? nbytes : 0.0, received = pos > 0 ? nbytes : 0.0;
  I.sleep_for_bandwidth(sent, received);
  torch::Tensor buf = t.contiguous();
  std::vector<at::Tensor> v{buf};
  c10d::BroadcastOptions bo;
  bo.rootRank = root;
  c10::intrusive_ptr<c10d::Work> w;
  try {
    w = I.pg->broadcast(v, bo);
  } catch (const std::exception& e) {
    I.fail(fmt::format("rank {}: broadcast failed: {}", me, first_line(e.what())));
  }
  I.wait(w, Clock::now() + I.timeout, [&](bool timed_out, const std::string& detail) {
    return timed_out ? fmt::format("rank {}: broadcast from rank {} timed out after {} (a rank may have died, be stuck, "
                                   "or not have called broadcast)",
                                   me, root, secs(I.o.timeout_s))
                     : fmt::format("rank {}: broadcast from rank {} failed: {} (a rank may have died)", me, root, detail);
  });
  if (!buf.is_same(t)) t.copy_(buf);
  I.stats.bytes_sent += static_cast<int64_t>(sent);
  I.stats.bytes_received += static_cast<int64_t>(received);
}

void GlooCommunicator::barrier() {
  auto& I = *impl_;
  const int me = I.o.rank;
  I.ensure_usable("barrier");
  if (I.o.world == 1) return;
  Impl::Idle idle{I};
  c10::intrusive_ptr<c10d::Work> w;
  try {
    w = I.pg->barrier();
  } catch (const std::exception& e) {
    I.fail(fmt::format("rank {}: barrier failed: {}", me, first_line(e.what())));
  }
  I.wait(w, Clock::now() + I.timeout, [&](bool timed_out, const std::string& detail) {
    return timed_out ? fmt::format("rank {}: barrier timed out after {} (a rank may have died, be stuck, or not have "
                                   "reached the barrier)",
                                   me, secs(I.o.timeout_s))
                     : fmt::format("rank {}: barrier failed: {} (a rank may have died)", me, detail);
  });
}

}  // namespace gasloc::comm
