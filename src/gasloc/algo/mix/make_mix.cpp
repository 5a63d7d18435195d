// The one factory of Mixes; see make_mix.hpp.
#include "gasloc/algo/mix/make_mix.hpp"

#include "gasloc/algo/mix/all_reduce.hpp"
#include "gasloc/algo/mix/elastic_mix.hpp"
#include "gasloc/algo/mix/gossip.hpp"
#include "gasloc/algo/mix/gossip_delta.hpp"
#include "gasloc/algo/mix/gossip_direct.hpp"
#include "gasloc/algo/mix/gossip_modulo.hpp"
#include "gasloc/algo/mix/overlapped.hpp"
#include "gasloc/algo/mix/owners_all_reduce.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::algo {

namespace {
void refuse_what_is_not_built(const MixOptions& o) {
  if (o.membership && o.overlapped)
    throw ConfigError("config key 'algo.overlap_steps': overlapped rounds are built for a fixed membership; an elastic "
                      "run or a [faults] schedule changes it at rounds",
                      "set algo.overlap_steps = 0, or cluster.elastic = false without [faults]");
  if (o.clip && o.compression && o.topology.is_all_reduce())
    throw ConfigError("config key 'algo.clip_peers': a compressed all-reduce is not clipped (each owner sums shards of "
                      "the messages and never sees a whole pseudo-gradient, whose norm clipping needs)",
                      "set algo.clip_peers = false, algo.compression = none, or a gossip topology");
  if (o.compression && !o.poisons.empty())
    throw ConfigError("config key 'faults.poison': compressed rounds are not poisoned (a codec's message is not the "
                      "worker's parameters)",
                      "set algo.compression = none, or remove faults.poison");
}

std::unique_ptr<Mix> make_codec_gossip(const MixOptions& o, const CompressionOptions& with) {
  auto clip = o.clip ? std::make_unique<PeerClip>(*o.clip, o.topology.size()) : nullptr;
  switch (with.gossip) {
    case GossipCodec::direct: return std::make_unique<DirectGossipMix>(o.topology, with, std::move(clip));
    case GossipCodec::delta: return std::make_unique<DeltaGossipMix>(o.topology, with, std::move(clip));
    case GossipCodec::modulo: break;
  }
  return std::make_unique<ModuloGossipMix>(o.topology, with, std::move(clip));
}

std::unique_ptr<Mix> make_exchange(const MixOptions& o) {
  const bool all_reduce = o.topology.is_all_reduce();
  if (o.compression) {
    CompressionOptions with = *o.compression;
    with.elastic = o.views_change();
    std::unique_ptr<Mix> codec;
    if (all_reduce) codec = std::make_unique<OwnersAllReduceMix>(o.topology, with);
    else codec = make_codec_gossip(o, with);
    return std::make_unique<OverlappedMix>(std::move(codec));  // several exchanges in turn: relayed when overlapped
  }
  auto clip = o.clip ? std::make_unique<PeerClip>(*o.clip, o.topology.size()) : nullptr;
  if (all_reduce && clip)  // an exchange with every worker, then the clipped sum: relayed when overlapped
    return std::make_unique<OverlappedMix>(std::make_unique<AllReduceMix>(o.topology.size(), std::move(clip), MessageWatch(o.poisons)));
  if (all_reduce) return std::make_unique<AllReduceMix>(o.topology.size(), std::move(clip), MessageWatch(o.poisons));
  return std::make_unique<GossipMix>(o.topology, std::move(clip), MessageWatch(o.poisons));
}
}  // namespace

std::unique_ptr<Mix> make_mix(const MixOptions& o) {
  refuse_what_is_not_built(o);
  std::unique_ptr<Mix> exchange = make_exchange(o);
  if (!o.membership) return exchange;
  return std::make_unique<ElasticMix>(std::move(exchange), *o.membership, o.topology.size());
}

}  // namespace gasloc::algo
