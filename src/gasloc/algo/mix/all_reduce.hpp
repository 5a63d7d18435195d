// The all-reduce mix: m = mean_i x_i over the members, x cast to the wire dtype, the mean back in
// x's dtype and checked finite. Clipped (algo.clip_peers): every worker's message to every other,
// each pseudo-gradient theta - x_j clipped and summed in id order (PeerClip::clipped_mean), so
// that every worker keeps the same bits; it needs the anchor theta. In an elastic round the
// clipped all-reduce is over the attempt's members, an attempt with a failed edge anywhere
// aborted by the members' vote and its clipping counts put back.
#pragma once
#include <memory>

#include "gasloc/algo/mix/uncompressed.hpp"

namespace gasloc::algo {

class AllReduceMix final : public UncompressedMix {
 public:
  // world: the workers' count; clip: algo.clip_peers' (nullptr: a plain all-reduce).
  AllReduceMix(int world, std::unique_ptr<PeerClip> clip, MessageWatch watch);
  MixFlight start(const MixRound& r, comm::Communicator& comm) override;
  torch::Tensor finish(MixFlight& f) override;
  // Elastic rounds: one attempt of the mean over r.members (call id r.call_id), which commits
  // for all members or none.
  bool has_collective(int64_t) const override { return true; }
  MixAttempt collective_attempt(const MixRound& r, comm::Communicator& comm) override;
  bool restores_state() const override { return clip_ != nullptr; }
  bool needs_anchor() const override { return clip_ != nullptr; }

 private:
  // Every member's message (r.members; empty: every worker) to every other, each pseudo-gradient
  // clipped, summed in id order. *complete (elastic rounds) turns false on a failed edge, which
  // is a CommError without it.
  torch::Tensor clipped_all_gather(const MixRound& r, const torch::Tensor& sent, comm::Communicator& comm,
                                   bool* complete = nullptr);
  MixAttempt clipped_attempt(const MixRound& r, comm::Communicator& comm);
  void note_others(int64_t t, int me, const torch::Tensor& x);

  int world_;
};

}  // namespace gasloc::algo
