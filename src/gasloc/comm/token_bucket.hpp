// Paces a link: tokens (bytes) accrue at `rate` per second up to `burst`; an operation of
// `bytes` takes them, and when the balance goes negative the caller waits until it is repaid.
// Used at operation granularity: a throttled rank delays the start of each transfer by what its
// link would have needed, so its peers wait for it as they would for a slow link, and its
// average throughput never exceeds the rate. rate 0 = unlimited.
#pragma once
#include <chrono>
#include <mutex>

namespace gasloc::comm {

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

// A rank's link: one bucket for what it sends, one for what it receives, shared by the worker's
// thread and an overlapped transfer's (hence the lock).
class LinkLimit {
 public:
  explicit LinkLimit(double rate_Bps = 0) : send_(rate_Bps), recv_(rate_Bps) {}
  // Seconds until the link has carried these bytes (0 without a limit).
  double take(double send_bytes, double recv_bytes);
  // take(), then sleeps that long.
  void pay(double send_bytes, double recv_bytes);

 private:
  std::mutex mu_;
  TokenBucket send_, recv_;
};

}  // namespace gasloc::comm
