// An overlapped round for a mix of several exchanges in sequence (the compressed collectives of
// algo/mix/codec_mix.hpp: an all-to-all then an all-gather, a prelude then residues then resends, a
// reference refresh then the payload), written once as blocking code.
//
// The mix runs on a thread of its own against a relay communicator whose exchange() hands the
// exchange to the worker's thread and sleeps. The worker starts it on the real communicator
// (start_exchange) and goes back to its inner steps; progress(), called between steps, lands
// every exchange that has completed and lets the mix run on to its next one. The two threads
// never run at once: the worker sleeps while the mix computes (decodes, sums, encodes) and the
// mix sleeps while the worker trains. So the order of every collective, and so every bit, is the
// blocking mix's; only the clock differs: an exchange that lands during the inner steps costs
// nothing, and each one starts at the first step boundary after the one before it landed.
//
// The relay communicator offers rank(), world() and exchange() only; a mix that calls anything
// else fails with an internal error. One RelayedMix per round in flight, used from the worker's
// thread; destroying it before finish() (the worker failed) cancels the mix, whose exchange()
// throws, and joins its thread.
#pragma once
#include <torch/types.h>

#include <functional>
#include <memory>

#include "gasloc/comm/communicator.hpp"

namespace gasloc::algo {

class RelayedMix {
 public:
  using Mix = std::function<torch::Tensor(comm::Communicator&)>;
  // Starts `mix` against a relay of `comm` and returns once it has reached its first exchange
  // (started on `comm`) or its end. An error the mix throws comes back from finish().
  RelayedMix(comm::Communicator& comm, Mix mix);
  ~RelayedMix();
  RelayedMix(const RelayedMix&) = delete;
  RelayedMix& operator=(const RelayedMix&) = delete;

  // Lands each exchange that has completed (Pending::completed) and starts the next; never waits
  // for the wire.
  void progress();
  // Waits for every remaining exchange in turn and returns the mix's result (or throws its error).
  torch::Tensor finish();

  struct State;  // relayed_mix.cpp's

 private:
  std::unique_ptr<State> s_;
};

}  // namespace gasloc::algo
