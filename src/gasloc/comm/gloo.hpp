// The Gloo backend: one rank per process (or per thread in tests), over c10d's ProcessGroupGloo
// (TCP) with the rendezvous of rendezvous.hpp. All the Communicator contract is in
// ProcessGroupComm (process_group.hpp); this file only builds the Gloo backend, whose buffers
// are CPU tensors.
#pragma once
#include "gasloc/comm/process_group.hpp"
#include "gasloc/comm/token_bucket.hpp"

namespace gasloc::comm {

// Opens the network device (o.interface, or loopback when every rank is on this host) and
// connects to every other rank. Throws CommError naming what to check.
BuiltBackend gloo_backend(const GlooOptions& o, const c10::intrusive_ptr<c10d::Store>& store);

// A Gloo group of `size` ranks over `store`, this process being `rank` (an elastic run's pair
// groups, elastic_gloo.hpp), with `timeout_s` as Gloo's own timeout (its connects retry a refused
// peer until then). Throws what c10d throws when a member never connects.
c10::intrusive_ptr<C10dBackend> gloo_group(const GlooOptions& o, const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, double timeout_s);

class GlooCommunicator final : public ProcessGroupComm {
 public:
  // Joins the process group described by `o` (blocks until all ranks have joined, at most
  // o.timeout_s). Throws CommError on a bad option, a port in use, a missing rank.
  explicit GlooCommunicator(const GlooOptions& o) : ProcessGroupComm(o, gloo_backend) {}
};

}  // namespace gasloc::comm
