// The Gloo backend: one rank per process (or per thread in tests), over c10d's ProcessGroupGloo
// (TCP) with the rendezvous of rendezvous.hpp. Implements the Communicator contract with real
// timeouts: a peer that dies or never calls gives a CommError naming it, never a hang.
//
// Numerics: all_reduce_mean is Gloo's allreduce(SUM) followed by a division by world. Gloo sums
// in its own (ring) order, not rank order 0..n-1 like the in-process reference, so results agree
// with it to fp32 rounding in general and exactly for integer-valued data (whose partial sums are
// exact). exchange copies bytes and is always exact.
//
// After a CommError the communicator is unusable (Gloo tears down its connections on a timeout);
// every later call throws a CommError repeating the first one.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gasloc/comm/communicator.hpp"
#include "gasloc/comm/rendezvous.hpp"

namespace gasloc::comm {

// Paces a link: tokens (bytes) accrue at `rate` per second up to `burst`; an operation of
// `bytes` takes them, and when the balance goes negative the caller waits until it is repaid.
// Used at operation granularity: a throttled rank delays the start of each transfer by what its
// link would have needed, so its peers wait for it as they would for a slow link, and its
// average throughput never exceeds the rate. rate 0 = unlimited.
class TokenBucket {
 public:
  explicit TokenBucket(double rate_Bps = 0, double burst_bytes = -1);
  // Takes `bytes`; returns the seconds the caller must wait before starting (0 if none).
  double take(double bytes);
  double rate() const { return rate_; }

 private:
  double rate_, burst_, tokens_;
  std::chrono::steady_clock::time_point last_;
};

class GlooCommunicator final : public Communicator {
 public:
  // Joins the process group described by `o` (blocks until all ranks have joined, at most
  // o.timeout_s). Throws CommError on a bad option, a port in use, a missing rank.
  explicit GlooCommunicator(const GlooOptions& o);
  ~GlooCommunicator() override;
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override;
  int world() const override;
  // Floating-point tensors (bf16/fp16 are summed in fp32). Every rank must pass the same
  // numel and dtype; a mismatch is a CommError naming the ranks.
  void all_reduce_mean(torch::Tensor& t) override;
  // Posts every receive and every send before waiting, so rings and any symmetric graph cannot
  // deadlock. A small header (numel, dtype) travels first: buffers of different sizes on the
  // two ends of a link are a CommError naming both ranks, never a memory overrun. recv is
  // resized to peers.size(); tensors already there are reused when their shape and dtype fit.
  void exchange(const std::vector<int>& peers, const torch::Tensor& send, std::vector<torch::Tensor>& recv) override;
  void broadcast(torch::Tensor& t, int root) override;
  void barrier() override;
  double now() const override;  // wall seconds since construction finished
  void compute(int64_t) override {}
  // Bytes this rank put on / took off the wire (all-reduce: the ring volume 2(n-1)/n of the
  // buffer each way), and idle_s: time blocked inside communication calls (waiting for peers,
  // for the transfer, and for the bandwidth limit).
  CommStats stats() const override;

  const GlooOptions& options() const;
  // Records in the rendezvous store that this rank is failing for its own reason (`what`), before
  // it exits: its peers, which fail when its connections close, then name it and the reason.
  void record_own_failure(const std::string& what);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gasloc::comm
