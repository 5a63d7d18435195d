// make_mix: the one place where a round's exchange is chosen from the configuration, and where a
// combination is accepted or refused (a ConfigError naming the key, the reason and the fix).
//   topology      all-reduce (complete) or gossip
//   compression   the owners' compressed all-reduce, or gossip through the direct, delta or
//                 modulo codec (codec_mix.hpp lists their files); overlapped, relayed (overlapped.hpp)
//   clip          algo.clip_peers: the clipped all-reduce, or gossip clipping each message
//   poisons       faults.poison (poison.hpp)
//   membership    elastic runs and stop-and-resume: ElasticMix around the exchange
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "gasloc/algo/compression.hpp"
#include "gasloc/algo/mix/mix.hpp"
#include "gasloc/algo/peer_clip.hpp"

namespace gasloc::algo {

struct MixOptions {
  topology::Topology topology;
  const Membership* membership = nullptr;  // nullptr: a fixed world; outlives the Mix
  std::optional<CompressionOptions> compression = {};
  std::optional<double> clip = {};            // algo.clip_factor, with algo.clip_peers
  std::vector<Poison> poisons = {};
  bool overlapped = false;                 // algo.overlap_steps > 0
  // Whether the round views change (an elastic run, a [faults] schedule; faults.restart_all keeps
  // every worker). Read without pinning a view: a restarted joiner is in no early round's view.
  bool views_change() const { return membership && !membership->trivial() && !membership->restart_all(); }
};

std::unique_ptr<Mix> make_mix(const MixOptions& o);

}  // namespace gasloc::algo
