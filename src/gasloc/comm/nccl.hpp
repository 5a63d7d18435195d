// The NCCL backend: one rank per process and GPU, over c10d's ProcessGroupNCCL with the same
// rendezvous as Gloo (rendezvous.hpp) and the same Communicator (process_group.hpp): semantics,
// errors, stats and failure records are those of GlooCommunicator. Only nccl.cpp, which builds
// the backend, needs CUDA; it is compiled against a CUDA LibTorch with NCCL (GASLOC_WITH_NCCL,
// see CMakeLists.txt) and left out of CPU builds, where everything else here still compiles.
//
// Rank r uses GPU LOCAL_RANK (or RANK) modulo the visible device count. Tensors may live on that
// GPU (no copy) or on the CPU (staged through the GPU and copied back: handy for checks, slower).
// Every wait has the timeout (c10d's blocking wait is switched on).
//
// NCCL itself refuses two ranks on one GPU ("Duplicate GPU detected"): a real run needs one GPU
// per rank.
#pragma once
#include "gasloc/comm/process_group.hpp"

namespace gasloc::comm {

// Whether this build has the NCCL backend (a CUDA LibTorch with NCCL).
constexpr bool kHaveNccl =
#ifdef GASLOC_WITH_NCCL
    true;
#else
    false;
#endif

// Picks and selects this rank's GPU, then creates the NCCL process group over the store.
// Throws CommError when no GPU is visible; defined only where kHaveNccl.
BuiltBackend nccl_backend(const GlooOptions& o, const c10::intrusive_ptr<c10d::Store>& store);

class NcclCommunicator final : public ProcessGroupComm {
 public:
  explicit NcclCommunicator(const GlooOptions& o) : ProcessGroupComm(o, nccl_backend) {}
};

}  // namespace gasloc::comm
