// Paces a link: tokens (bytes) accrue at `rate` per second up to `burst`; an operation of
// `bytes` takes them, and when the balance goes negative the caller waits until it is repaid.
// Used at operation granularity: a throttled rank delays the start of each transfer by what its
// link would have needed, so its peers wait for it as they would for a slow link, and its
// average throughput never exceeds the rate. rate 0 = unlimited.
#pragma once
#include <chrono>

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

}  // namespace gasloc::comm
