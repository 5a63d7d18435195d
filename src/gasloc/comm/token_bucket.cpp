#include "gasloc/comm/token_bucket.hpp"

#include <algorithm>

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

}  // namespace gasloc::comm
