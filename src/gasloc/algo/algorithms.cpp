// What the synchronizers share; see algorithms.hpp.
#include "gasloc/algo/algorithms.hpp"

#include "gasloc/algo/mix/make_mix.hpp"

namespace gasloc::algo {

const config::Choices& wire_dtype_choices() {
  static const config::Choices c("wire dtype", {{"fp32", ""}, {"bf16", "half the bytes"}});
  return c;
}

torch::ScalarType parse_wire_dtype(const std::string& name) {
  constexpr torch::ScalarType kTypes[] = {torch::kFloat, torch::kBFloat16};  // in wire_dtype_choices() order
  return kTypes[wire_dtype_choices().index(name)];
}

torch::Tensor gossip_mix(const topology::Topology& topo, int64_t round, const torch::Tensor& phi,
                         comm::Communicator& comm, torch::ScalarType wire) {
  return make_mix({.topology = topo})->mix({.t = round, .x = phi, .wire = wire}, comm);
}

}  // namespace gasloc::algo
