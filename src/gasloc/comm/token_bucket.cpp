#include "gasloc/comm/token_bucket.hpp"

#include <algorithm>
#include <thread>

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

double LinkLimit::take(double send_bytes, double recv_bytes) {
  std::lock_guard lock(mu_);
  return std::max(send_.take(send_bytes), recv_.take(recv_bytes));
}

void LinkLimit::pay(double send_bytes, double recv_bytes) {
  const double d = take(send_bytes, recv_bytes);
  if (d > 0) std::this_thread::sleep_for(std::chrono::duration<double>(d));
}

}  // namespace gasloc::comm
