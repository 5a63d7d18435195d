#include "gasloc/comm/communicator.hpp"

#include <chrono>

#include "gasloc/core/error.hpp"

namespace gasloc::comm {

static int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool Communicator::all_reduce_mean_over(torch::Tensor&, const std::vector<int>&, int64_t) {
  throw CommError("all_reduce_mean_over: this backend has no elastic rounds yet",
                  "elastic runs (cluster.elastic = true) need cluster.backend = \"inproc\" for now");
}

SingleRank::SingleRank() : start_ns_(now_ns()) {}

void SingleRank::exchange(const std::vector<int>& peers, const torch::Tensor&, std::vector<torch::Tensor>& recv) {
  if (!peers.empty()) throw CommError("exchange: a single-rank world has no peers");
  recv.clear();
}

void SingleRank::broadcast(torch::Tensor&, int root) {
  if (root != 0) throw CommError("broadcast: root " + std::to_string(root) + " is outside a world of 1");
}

double SingleRank::now() const { return static_cast<double>(now_ns() - start_ns_) * 1e-9; }

}  // namespace gasloc::comm
