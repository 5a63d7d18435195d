// NOT COMPILED on CPU machines (CMakeLists.txt drops this file unless GASLOC_WITH_NCCL), and
// written against LibTorch 2.x's c10d (ProcessGroupNCCL as a c10d::Backend): check it with
// scripts/gpu_check.sh on a GPU machine.
//
// ProcessGroupNCCL is declared only under USE_C10D_NCCL, which LibTorch's CMake config does not
// export; CUDA builds of LibTorch always contain it.
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include "gasloc/comm/nccl.hpp"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "gasloc/comm/gloo.hpp"  // TokenBucket
#include "gasloc/comm/network_model.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::comm {

using Clock = std::chrono::steady_clock;

namespace {

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
constexpr int64_t kMagic = 0x6761736c6f63;

}  // namespace

struct NcclCommunicator::Impl {
  GlooOptions o;
  std::chrono::milliseconds timeout{};
  c10::intrusive_ptr<c10d::Store> store;  // before pg: destroyed after it
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg;
  int device_index = 0;
  torch::Device device{torch::kCUDA, 0};
  TokenBucket send_bucket, recv_bucket;
  CommStats stats;
  std::string broken;
  Clock::time_point t0;

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

  [[noreturn]] void fail(const std::string& msg) {
    broken = msg;
    throw CommError(msg + (store ? describe_dead_ranks(*store, o.rank, o.world) : std::string()),
                    "check the other ranks' output; raise cluster.timeout_s (gasloc launch --timeout) if they are only slow");
  }

  template <class Describe>
  void wait(const c10::intrusive_ptr<c10d::Work>& w, Clock::time_point deadline, Describe&& describe) {
    const auto left = std::max(std::chrono::milliseconds(1),
                               std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    std::string detail;
    try {
      if (w->wait(left)) return;
      detail = "aborted";
    } catch (const std::exception& e) {
      detail = first_line(e.what());
    }
    const bool timed_out = Clock::now() + std::chrono::milliseconds(50) >= deadline ||
                           detail.find("imed out") != std::string::npos || detail.find("imeout") != std::string::npos;
    fail(describe(timed_out, detail));
  }

  template <class F>
  c10::intrusive_ptr<c10d::Work> post(const std::string& what, F&& fn) {
    try {
      return fn();
    } catch (const std::exception& e) {
      fail(fmt::format("rank {}: {} failed: {}", o.rank, what, first_line(e.what())));
    }
  }

  void sleep_for_bandwidth(double send_bytes, double recv_bytes) {
    const double d = std::max(send_bucket.take(send_bytes), recv_bucket.take(recv_bytes));
    if (d > 0) std::this_thread::sleep_for(std::chrono::duration<double>(d));
  }

  // The tensor NCCL works on: `t` itself when it is contiguous on this GPU, else a staged copy.
  torch::Tensor on_device(const torch::Tensor& t, c10::ScalarType dtype) const {
    if (t.device() == device && t.is_contiguous() && t.scalar_type() == dtype) return t;
    if (t.is_cuda() && t.device() != device)
      throw CommError(fmt::format("rank {}: tensor on {} but this rank uses {}", o.rank, t.device().str(), device.str()));
    return t.to(device, dtype).contiguous();
  }

  void check_same_buffer(const char* op, const torch::Tensor& t) {
    auto mine = torch::tensor({t.numel(), static_cast<int64_t>(t.scalar_type())}, torch::kInt64).to(device);
    std::vector<at::Tensor> in{mine};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < o.world; ++r) out[0].push_back(torch::empty_like(mine));
    auto w = post(op, [&] { return pg->allgather(out, in); });
    wait(w, Clock::now() + timeout, [&](bool timed_out, const std::string& detail) {
      return timed_out ? fmt::format("rank {}: {} timed out after {} (a rank may have died, be stuck, or not have called "
                                     "{})",
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
                         o.rank, op, o.rank, t.numel(), c10::toString(t.scalar_type()), r, n, c10::toString(dt)));
    }
  }
};

NcclCommunicator::NcclCommunicator(const GlooOptions& o) : impl_(std::make_unique<Impl>()) {
  validate(o);
  auto& I = *impl_;
  I.o = o;
  I.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  I.send_bucket = TokenBucket(o.bandwidth_limit_Bps);
  I.recv_bucket = TokenBucket(o.bandwidth_limit_Bps);
  const int count = static_cast<int>(c10::cuda::device_count());
  if (count < 1)
    throw CommError(fmt::format("rank {}: the NCCL backend needs a CUDA device and none is visible", o.rank),
                    "use --backend gloo on CPU machines; check CUDA_VISIBLE_DEVICES and nvidia-smi");
  I.device_index = (o.local_rank >= 0 ? o.local_rank : o.rank) % count;
  I.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(I.device_index));
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(I.device_index));
  // Without blocking wait, c10d's Work::wait only orders CUDA streams and returns at once; with
  // it, wait(timeout) blocks the CPU and throws on timeout, which the contract requires. The
  // user's own setting wins (overwrite = 0). Both spellings: TORCH_ (2.2+) and the older one.
  ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 0);
  ::setenv("NCCL_BLOCKING_WAIT", "1", 0);
  I.store = join_store(o);
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = I.timeout;
  try {
    I.pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(I.store, o.rank, o.world, opts);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {} could not create the NCCL process group: {}", o.rank, first_line(e.what())));
  }
  barrier();  // also creates the NCCL communicator now, not inside the first real call
  I.stats = {};
  I.t0 = Clock::now();
}

NcclCommunicator::~NcclCommunicator() {
  if (!impl_ || !impl_->pg) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  // 2.4+ warns when a group is destroyed without shutdown(); it also frees NCCL's resources.
  try {
    impl_->pg->shutdown();
  } catch (const std::exception&) {
  }
#endif
}

int NcclCommunicator::rank() const { return impl_->o.rank; }
int NcclCommunicator::world() const { return impl_->o.world; }
torch::Device NcclCommunicator::device() const { return impl_->device; }
CommStats NcclCommunicator::stats() const { return impl_->stats; }
double NcclCommunicator::now() const { return std::chrono::duration<double>(Clock::now() - impl_->t0).count(); }

void NcclCommunicator::all_reduce_mean(torch::Tensor& t) {
  auto& I = *impl_;
  const int me = I.o.rank;
  I.ensure_usable("all_reduce_mean");
  if (!t.is_floating_point())
    throw CommError(fmt::format("rank {}: all_reduce_mean needs a floating-point tensor, got {}", me,
                                c10::toString(t.scalar_type())));
  if (I.o.world == 1) return;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(I.device_index));
  Impl::Idle idle{I};
  I.check_same_buffer("all_reduce_mean", t);
  const auto wire = static_cast<double>(ring_allreduce_bytes(t.numel() * t.element_size(), I.o.world));
  I.sleep_for_bandwidth(wire, wire);
  const bool upcast = t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16;
  torch::Tensor buf = I.on_device(t, upcast ? torch::kFloat : t.scalar_type());
  std::vector<at::Tensor> v{buf};
  auto w = I.post("all_reduce_mean", [&] { return I.pg->allreduce(v); });
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

void NcclCommunicator::exchange(const std::vector<int>& peers_in, const torch::Tensor& send_in,
                                std::vector<torch::Tensor>& recv) {
  auto& I = *impl_;
  const int me = I.o.rank;
  I.ensure_usable("exchange");
  for (size_t k = 0; k < peers_in.size(); ++k) {
    const int p = peers_in[k];
    if (p < 0 || p >= I.o.world || p == me)
      throw CommError(fmt::format("rank {}: exchange with rank {}: peers must be other ranks in 0..{}", me, p, I.o.world - 1));
    if (std::count(peers_in.begin(), peers_in.end(), p) > 1)
      throw CommError(fmt::format("rank {}: exchange lists rank {} twice", me, p));
  }
  recv.resize(peers_in.size());
  if (peers_in.empty()) return;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(I.device_index));
  Impl::Idle idle{I};
  // ProcessGroupNCCL gives every pair of ranks its own communicator, created (a blocking
  // handshake between the two) on first use. Visiting peers in ascending rank order makes the
  // handshakes deadlock-free: the smallest pending pair is always first for both its ranks.
  // Within a pair, send and receive run on one stream in order, so the lower rank sends first
  // and the higher receives first.
  std::vector<size_t> order(peers_in.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return peers_in[a] < peers_in[b]; });
  const torch::Tensor send = I.on_device(send_in, send_in.scalar_type());

  auto timed_out_msg = [&](int p) {
    return fmt::format("rank {}: exchange with rank {} timed out after {} (rank {} may have died, be stuck, or not list "
                       "rank {} among its peers)",
                       me, p, secs(I.o.timeout_s), p, me);
  };
  auto describe_for = [&](int p) {
    return [&, p](bool timed_out, const std::string& detail) {
      return timed_out ? timed_out_msg(p)
                       : fmt::format("rank {}: exchange with rank {} failed: {} (rank {} may have died)", me, p, detail, p);
    };
  };
  // Posts one send and one receive per peer in the deadlock-free order; returns the works.
  auto swap = [&](const torch::Tensor& out, std::vector<torch::Tensor>& in, int tag) {
    std::vector<c10::intrusive_ptr<c10d::Work>> works(2 * order.size());
    for (size_t k : order) {
      const int p = peers_in[k];
      std::vector<at::Tensor> s{out}, r{in[k]};
      auto do_send = [&] { works[2 * k] = I.post("exchange", [&] { return I.pg->send(s, p, tag); }); };
      auto do_recv = [&] { works[2 * k + 1] = I.post("exchange", [&] { return I.pg->recv(r, p, tag); }); };
      if (me < p) do_send(), do_recv();
      else do_recv(), do_send();
    }
    const auto deadline = Clock::now() + I.timeout;
    for (size_t k : order) {
      I.wait(works[2 * k + 1], deadline, describe_for(peers_in[k]));
      I.wait(works[2 * k], deadline, describe_for(peers_in[k]));
    }
  };

  auto my_header =
      torch::tensor({kMagic, send.numel(), static_cast<int64_t>(send_in.scalar_type())}, torch::kInt64).to(I.device);
  std::vector<torch::Tensor> headers(peers_in.size());
  for (auto& h : headers) h = torch::zeros({3}, torch::TensorOptions().dtype(torch::kInt64).device(I.device));
  swap(my_header, headers, 0);
  for (size_t k = 0; k < peers_in.size(); ++k) {
    const auto h = headers[k].cpu();
    const auto n = h[1].item<int64_t>();
    const auto dt = static_cast<c10::ScalarType>(h[2].item<int64_t>());
    if (h[0].item<int64_t>() != kMagic)
      I.fail(fmt::format("rank {}: exchange with rank {}: received a malformed header", me, peers_in[k]));
    if (n != send.numel() || dt != send_in.scalar_type()) {
      std::string a = fmt::format("rank {} sends {} {} elements", me, send.numel(), c10::toString(send_in.scalar_type()));
      std::string b = fmt::format("rank {} sends {} {} elements", peers_in[k], n, c10::toString(dt));
      if (peers_in[k] < me) std::swap(a, b);
      I.fail(fmt::format("rank {}: exchange with rank {}: {} but {}; both ends of a link must exchange buffers of the same "
                         "size and dtype",
                         me, peers_in[k], a, b));
    }
  }
  const double nbytes = static_cast<double>(send.numel() * send.element_size());
  const double total = nbytes * static_cast<double>(peers_in.size());
  I.sleep_for_bandwidth(total, total);
  std::vector<torch::Tensor> got(peers_in.size());
  for (auto& g : got) g = torch::empty_like(send, torch::MemoryFormat::Contiguous);
  if (send.numel() > 0) swap(send, got, 1);
  // Hand back tensors where the caller's were: a CPU send gets CPU tensors (fresh ones, like the
  // in-process backend), a GPU send gets the GPU tensors.
  for (size_t k = 0; k < got.size(); ++k) recv[k] = send_in.device() == I.device ? got[k] : got[k].to(send_in.device());
  I.stats.bytes_sent += static_cast<int64_t>(total);
  I.stats.bytes_received += static_cast<int64_t>(total);
}

void NcclCommunicator::broadcast(torch::Tensor& t, int root) {
  auto& I = *impl_;
  const int me = I.o.rank;
  I.ensure_usable("broadcast");
  if (root < 0 || root >= I.o.world)
    throw CommError(fmt::format("rank {}: broadcast root {} is outside 0..{}", me, root, I.o.world - 1));
  if (I.o.world == 1) return;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(I.device_index));
  Impl::Idle idle{I};
  I.check_same_buffer("broadcast", t);
  const double nbytes = static_cast<double>(t.numel() * t.element_size());
  const int pos = (me - root + I.o.world) % I.o.world;
  const double sent = pos < I.o.world - 1 ? nbytes : 0.0, received = pos > 0 ? nbytes : 0.0;
  I.sleep_for_bandwidth(sent, received);
  torch::Tensor buf = I.on_device(t, t.scalar_type());
  std::vector<at::Tensor> v{buf};
  c10d::BroadcastOptions bo;
  bo.rootRank = root;
  auto w = I.post("broadcast", [&] { return I.pg->broadcast(v, bo); });
  I.wait(w, Clock::now() + I.timeout, [&](bool timed_out, const std::string& detail) {
    return timed_out ? fmt::format("rank {}: broadcast from rank {} timed out after {} (a rank may have died or not have "
                                   "called broadcast)",
                                   me, root, secs(I.o.timeout_s))
                     : fmt::format("rank {}: broadcast from rank {} failed: {}", me, root, detail);
  });
  if (!buf.is_same(t)) t.copy_(buf);
  I.stats.bytes_sent += static_cast<int64_t>(sent);
  I.stats.bytes_received += static_cast<int64_t>(received);
}

void NcclCommunicator::barrier() {
  auto& I = *impl_;
  const int me = I.o.rank;
  I.ensure_usable("barrier");
  if (I.o.world == 1) return;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(I.device_index));
  Impl::Idle idle{I};
  c10d::BarrierOptions bo;
  bo.device_ids = {I.device_index};  // otherwise c10d guesses the GPU from the rank, and warns
  auto w = I.post("barrier", [&] { return I.pg->barrier(bo); });
  I.wait(w, Clock::now() + I.timeout, [&](bool timed_out, const std::string& detail) {
    return timed_out ? fmt::format("rank {}: barrier timed out after {} (a rank may have died or not reached the barrier)",
                                   me, secs(I.o.timeout_s))
                     : fmt::format("rank {}: barrier failed: {}", me, detail);
  });
}

}  // namespace gasloc::comm
