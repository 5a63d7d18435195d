// The process backends' one Communicator: a rank of a c10d process group (Gloo or NCCL), met at
// the rendezvous store of rendezvous.hpp. gloo.cpp and nccl.cpp only build their c10d backend;
// everything the contract asks for lives here once: timeouts on every wait, the (numel, dtype)
// checks that turn mismatched buffers into errors naming both ranks, the failure records that
// name the rank that failed first, the bandwidth limit, the stats, and where tensors must live.
//
// Numerics: all_reduce_mean is the backend's allreduce(SUM) followed by a division by world. The
// backend sums in its own (ring) order, not rank order 0..n-1 like the in-process reference, so
// results agree with it to fp32 rounding in general and exactly for integer-valued data (whose
// partial sums are exact). Half-precision buffers are summed in fp32. exchange copies bytes and
// is always exact.
//
// Timeouts: every wait has the deadline cluster.timeout_s after the call was posted. A failure
// counts as a timeout when c10d says so by type (c10d::TimeoutError) or when it came at that
// deadline: Gloo reports its own timeout as gloo::IoException, the type of a closed connection
// too, and Work::wait(timeout) as a plain c10::Error, both at the deadline they were given.
//
// After a CommError the communicator is unusable (the backend tears down its connections); every
// later call throws a CommError repeating the first one.
#pragma once
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/version.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gasloc/comm/communicator.hpp"
#include "gasloc/comm/rendezvous.hpp"

namespace gasloc::comm {

// c10d's backend class: LibTorch 2.x's Gloo and NCCL derive from c10d::Backend; 1.13's (Debian's
// libtorch-dev) from c10d::ProcessGroup, with the same operations.
#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

// Where a backend's buffers live. A tensor already there is used in place; a CPU tensor is
// staged (copied there and back) when stage_cpu; a tensor anywhere else is a CommError.
struct DevicePolicy {
  std::string backend = "Gloo";  // for messages
  torch::Device device{torch::kCPU};
  bool stage_cpu = false;  // NCCL: CPU tensors travel through the GPU (checks, tests; slower)
};

// What a backend builder hands the communicator.
struct BuiltBackend {
  c10::intrusive_ptr<C10dBackend> backend;
  DevicePolicy devices;
  // A pair's transfers run in order on one stream, and a pair's connection is made on first use,
  // blocking both ends (NCCL): exchange posts peers in ascending rank order, the lower rank of a
  // pair sending first, which cannot deadlock. Otherwise (Gloo) every receive is posted before
  // any send: a receive's ready notice then never queues behind this rank's own payload on the
  // connection, and both directions of a link move at once.
  bool pairs_in_order = false;
  std::function<void(C10dBackend&)> shutdown;  // before the backend is released (may be empty)
};

// Builds the c10d backend of rank o.rank over the joined store. Throws CommError.
using BackendBuilder = std::function<BuiltBackend(const GlooOptions& o, const c10::intrusive_ptr<c10d::Store>& store)>;

// The first line of a c10d/Gloo message, without Gloo's "[file.cc:123] " source prefix, its
// ports decoded (gloo_ports_decoded).
std::string first_line(const std::string& message);

// `message` with every "[IP]:PORT" that Gloo wrote showing the port it means. Gloo's TCP address
// (gloo/transport/tcp/address.cc, Address::str) prints sin_port as it lies in memory, in network
// byte order: port 41235 reads "[127.0.0.1]:5025" on x86, which hid where a refused connect went.
// A bracket that does not hold an IP address is left as it is.
std::string gloo_ports_decoded(const std::string& message);

class ProcessGroupComm : public Communicator {
 public:
  // Joins the store (blocks until all ranks have, at most o.timeout_s), builds the backend and
  // meets the other ranks once. Throws CommError on a bad option, a port in use, a missing rank.
  ProcessGroupComm(const GlooOptions& o, const BackendBuilder& build);
  ~ProcessGroupComm() override;
  ProcessGroupComm(const ProcessGroupComm&) = delete;
  ProcessGroupComm& operator=(const ProcessGroupComm&) = delete;

  int rank() const override;
  int world() const override;
  // Floating-point tensors. Every rank must pass the same numel and dtype; a mismatch is a
  // CommError naming the ranks.
  void all_reduce_mean(torch::Tensor& t) override;
  // Posts every transfer before waiting, in the order the backend needs (BuiltBackend::
  // pairs_in_order), so rings and any symmetric graph cannot deadlock. A small header (numel, dtype) travels first:
  // buffers of different sizes on the two ends of a link are a CommError naming both ranks,
  // never a memory overrun. recv is resized to peers.size(); tensors already there are reused
  // when their shape, dtype and device fit and nothing else refers to them.
  void exchange(const std::vector<int>& peers, const torch::Tensor& send, std::vector<torch::Tensor>& recv) override;
  // Overlapped (communicator.hpp): an exchange's transfers run on a thread of their own; an
  // all-reduce is posted at once (after the size check every rank meets at) and moved by the
  // backend's threads. recv holds fresh tensors at once, filled when wait() returns. Collectives
  // called meanwhile (the control channel's) run beside it; a second start or another exchange
  // before wait() is a CommError.
  std::unique_ptr<Pending> start_exchange(const std::vector<int>& peers, const torch::Tensor& send,
                                          std::vector<torch::Tensor>& recv) override;
  std::unique_ptr<Pending> start_all_reduce_mean(torch::Tensor& t) override;
  void broadcast(torch::Tensor& t, int root) override;
  void barrier() override;
  double now() const override;  // wall seconds since construction finished
  void compute(int64_t) override {}
  // Bytes this rank put on / took off the wire (all-reduce: the ring volume 2(n-1)/n of the
  // buffer each way), and idle_s: time blocked inside communication calls (waiting for peers,
  // for the transfer, and for the bandwidth limit).
  CommStats stats() const override;

  const GlooOptions& options() const;
  torch::Device device() const;  // where the backend's buffers live
  // Records in the rendezvous store that this rank is failing for its own reason (`what`), before
  // it exits: its peers, which fail when its connections close, then name it and the reason.
  void record_own_failure(const std::string& what);

  struct Impl;  // opaque; public so that the .cpp's helpers can name it

 private:
  class InFlight;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gasloc::comm
