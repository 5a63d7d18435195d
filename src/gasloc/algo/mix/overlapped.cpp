// Overlapped rounds of several exchanges; see overlapped.hpp.
#include "gasloc/algo/mix/overlapped.hpp"

#include "gasloc/algo/relayed_mix.hpp"

namespace gasloc::algo {

MixFlight OverlappedMix::start(const MixRound& r, comm::Communicator& comm) {
  if (!r.overlapped) return inner_->start(r, comm);
  MixRound blocking = r;
  blocking.overlapped = false;
  // The anchor (theta) is copied: the relayed mix reads it while the worker trains.
  if (r.anchor.defined()) blocking.anchor = r.anchor.clone();
  MixFlight f;
  f.x = r.x;
  Mix* inner = inner_.get();
  f.relay = std::make_shared<RelayedMix>(comm, [inner, blocking](comm::Communicator& relay) { return inner->mix(blocking, relay); });
  return f;
}

void OverlappedMix::progress(MixFlight& f) {
  if (f.relay) f.relay->progress();
}

torch::Tensor OverlappedMix::finish(MixFlight& f) {
  if (!f.relay) return inner_->finish(f);
  torch::Tensor m = f.relay->finish();
  f.relay.reset();
  return m;
}

}  // namespace gasloc::algo
