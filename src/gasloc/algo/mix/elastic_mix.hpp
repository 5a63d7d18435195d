// Elastic membership (docs/design.md section 10) as one wrapper around any Mix: round t's view
// from the Membership, the inner Mix given each attempt's members, a worker that does not mix
// standing by in the round's collectives, and the one retry-and-agreement loop: a round's
// collective part (an all-reduce, the delta codec's reference) is attempted over the view and,
// when a member dies there, retried over the survivors; one whose failure only its ends see
// (a compressed exchange) is agreed by a one-float vote, an aborted attempt putting the inner
// Mix's state back. Its edge part (gossip) drops a failed edge instead. Stop-and-resume
// (faults.restart_all) keeps every worker and prices its restarts on the clock at ended().
// Without faults (a trivial membership) every call goes to the inner Mix unchanged, bit for bit.
#pragma once
#include "gasloc/algo/mix/mix.hpp"

namespace gasloc::algo {

class ElasticMix final : public MixWrapper {
 public:
  // membership outlives the Mix; world: the workers' count.
  ElasticMix(std::unique_ptr<Mix> inner, const Membership& membership, int world);

  MixFlight start(const MixRound& r, comm::Communicator& comm) override;
  bool stand_by(int64_t t, comm::Communicator& comm) override;
  bool mixes(int id, int64_t t) const override;
  bool computes(int id, int64_t t) const override;
  std::optional<View> view(int64_t t) const override;
  std::optional<std::vector<int>> holders(int64_t t) const override;
  void ended(int64_t t, comm::Communicator& comm) override;
  StateDict state() const override;
  void load_state(const StateDict& s) override;

 private:
  // Round t over its view: x undefined for a worker that does not mix. Undefined for a non-mixer.
  torch::Tensor round(const MixRound& r, comm::Communicator& comm);
  // The collective part of round r over the view v, retried and agreed (see the file comment).
  MixAttempt agreed(const View& v, const MixRound& r, bool mixes, comm::Communicator& comm);

  const Membership* views_;     // a membership that changes (nullptr: every worker every round)
  const Membership* restarts_;  // stop-and-resume (nullptr: none)
  int world_;
  double checkpoint_clock_ = 0;  // stop-and-resume: the clock when the last checkpoint committed
};

}  // namespace gasloc::algo
