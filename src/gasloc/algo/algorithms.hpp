// The synchronizers of docs/design.md section 3, by family; all run unchanged on any
// Communicator backend:
//   step_sync.hpp    every step: All-Reduce AdamW (allreduce), DAdam (dadam)
//   round_sync.hpp   rounds of H local steps: DiLoCo (diloco), GASLoC (gasloc), Local-DAdam
//                    (local_dadam), one round path, blocking or overlapped
//   round_forms.hpp  the forms of a round, shared with the consensus simulation (consensus.hpp)
// and what they share here: the gossip mix as one call (gossip_mix), the wire dtype. Every exchange
// a round can make is a Mix (mix/mix.hpp).
#pragma once
#include <torch/types.h>

#include "gasloc/algo/consensus.hpp"
#include "gasloc/algo/round_sync.hpp"
#include "gasloc/algo/step_sync.hpp"

namespace gasloc::algo {

// m = sum_j W_t[rank, j] phi_j over the row (self included), in the row's order (j ascending)
// so that every backend gives the same bits. phi is sent as `wire` and what arrives is mixed
// in phi's dtype. Rejects non-finite tensors from peers with a CommError naming the peer,
// before anything is modified.
torch::Tensor gossip_mix(const topology::Topology& topo, int64_t round, const torch::Tensor& phi,
                         comm::Communicator& comm, torch::ScalarType wire = torch::kFloat);
// The dtypes parameter messages may travel in (algo.wire_dtype, `gasloc topo --wire-dtype`).
const config::Choices& wire_dtype_choices();
// "fp32" -> kFloat, "bf16" -> kBFloat16; ConfigError listing the choices otherwise.
torch::ScalarType parse_wire_dtype(const std::string& name);

}  // namespace gasloc::algo
