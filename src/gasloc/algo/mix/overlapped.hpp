// Overlapped rounds of a mix that makes several exchanges in turn (the compressed exchanges, the
// clipped all-reduce): the blocking mix, written once, runs against a relay of the communicator
// (RelayedMix, relayed_mix.hpp), which starts each exchange and lands it between inner steps. The
// order of every collective, and so every bit, is the blocking round's.
#pragma once
#include "gasloc/algo/mix/mix.hpp"

namespace gasloc::algo {

class OverlappedMix final : public MixWrapper {
 public:
  using MixWrapper::MixWrapper;
  // r.overlapped: the inner mix's blocking round, relayed; else the inner mix's own start.
  MixFlight start(const MixRound& r, comm::Communicator& comm) override;
  void progress(MixFlight& f) override;
  torch::Tensor finish(MixFlight& f) override;
};

}  // namespace gasloc::algo
