// What a worker's exchanges counted and noticed (docs/design.md section 10, "One Mix"): the
// synchronizer reports them, the metrics carry them, a divergence names the suspect.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace gasloc::algo {

// A peer whose message in a worker's last mix stood out, which a divergence right after it names
// instead of blaming the step size: faults.poison scaled it, or (gossip) its largest |value| was
// kOutlierRatio or more times the worker's own.
struct MessageSuspect {
  int sender = -1;
  int64_t round = -1;  // the mix's round (dadam: its step - 1)
  double ratio = 0;    // its largest |value| over the receiver's own; 0: not measured (an all-reduce)
  double poison = 1;   // faults.poison's factor on it
};
inline constexpr double kOutlierRatio = 10.0;

// Each field is absent where the exchange does not count it.
struct MixStats {
  std::optional<int64_t> codec_resends;                // the modulo codec: chunks resent in fp32 after a wrap, so far
  std::optional<std::vector<int64_t>> clipped_from;    // algo.clip_peers: messages clipped so far, by sender id
  std::optional<std::vector<int64_t>> dropped_from;    // algo.clip_peers: non-finite messages dropped so far, by sender id
  std::optional<MessageSuspect> suspect;               // the last blocking mix's (MessageSuspect), if one stood out
};

}  // namespace gasloc::algo
