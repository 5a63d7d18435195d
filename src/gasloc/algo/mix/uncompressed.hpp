// What the uncompressed exchanges (gossip.hpp, all_reduce.hpp) share: their messages are the
// workers' parameters, so they are poisoned (faults.poison, poison.hpp) and clipped
// (algo.clip_peers, PeerClip) as they are; checkpoints carry the clipping's counts and window.
#pragma once
#include <memory>

#include "gasloc/algo/mix/mix.hpp"
#include "gasloc/algo/mix/poison.hpp"
#include "gasloc/algo/peer_clip.hpp"

namespace gasloc::algo {

class UncompressedMix : public Mix {
 public:
  // clip: algo.clip_peers' (nullptr: off).
  UncompressedMix(std::unique_ptr<PeerClip> clip, MessageWatch watch) : clip_(std::move(clip)), watch_(std::move(watch)) {}
  StateDict state() const override {
    StateDict s;
    if (clip_) clip_->save(s);
    return s;
  }
  void load_state(const StateDict& s) override {
    if (clip_) clip_->load(s);
  }
  MixStats stats() const override {
    MixStats s;
    s.suspect = watch_.suspect();
    if (!clip_) return s;
    s.clipped_from = clip_->clipped_from();
    s.dropped_from = clip_->dropped_from();
    return s;
  }

 protected:
  std::unique_ptr<PeerClip> clip_;
  MessageWatch watch_;
};

}  // namespace gasloc::algo
