// The all-reduce mix: m = mean_i x_i over the members, x cast to the wire dtype, the mean back in
// x's dtype and checked finite. Clipped (algo.clip_peers): every worker's message to every other,
// each pseudo-gradient theta - x_j clipped and summed in id order (PeerClip::clipped_mean), so
// that every worker keeps the same bits; it needs the anchor theta.
#pragma once
#include <memory>

#include "gasloc/algo/mix/mix.hpp"
#include "gasloc/algo/mix/poison.hpp"
#include "gasloc/algo/peer_clip.hpp"

namespace gasloc::algo {

class AllReduceMix final : public Mix {
 public:
  // world: the workers' count; clip: algo.clip_peers' (nullptr: a plain all-reduce).
  AllReduceMix(int world, std::unique_ptr<PeerClip> clip, MessageWatch watch);
  MixFlight start(const MixRound& r, comm::Communicator& comm) override;
  torch::Tensor finish(MixFlight& f) override;
  // Elastic rounds: one attempt of the mean over r.members (call id r.call_id), which commits
  // for all members or none.
  bool has_collective(int64_t) const override { return true; }
  MixAttempt collective_attempt(const MixRound& r, comm::Communicator& comm) override;
  bool needs_anchor() const override { return clip_ != nullptr; }
  StateDict state() const override;
  void load_state(const StateDict& s) override;
  MixStats stats() const override;

 private:
  torch::Tensor clipped_all_gather(const MixRound& r, const torch::Tensor& sent, comm::Communicator& comm);
  void note_others(int64_t t, int me, const torch::Tensor& x);

  int world_;
  std::unique_ptr<PeerClip> clip_;
  MessageWatch watch_;
};

}  // namespace gasloc::algo
