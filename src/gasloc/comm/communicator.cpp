#include "gasloc/comm/communicator.hpp"

#include <chrono>
#include <utility>

#include "gasloc/core/error.hpp"

namespace gasloc::comm {

static int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool Communicator::all_reduce_mean_over(torch::Tensor&, const std::vector<int>&, int64_t) {
  throw CommError("all_reduce_mean_over: this backend has no elastic rounds yet",
                  "elastic runs (cluster.elastic = true) need cluster.backend = \"inproc\" for now");
}

namespace {
// An operation performed at its start: wait() only reports how it ended.
class Completed final : public Pending {
 public:
  explicit Completed(std::exception_ptr failure) : failure_(std::move(failure)) {}
  void wait() override {
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }
  bool completed() const override { return true; }
  void abort() override {}  // done already: nothing to stop

 private:
  std::exception_ptr failure_;
};

template <class F>
std::unique_ptr<Pending> perform_now(F&& f) {
  try {
    f();
  } catch (const CommError&) {
    return std::make_unique<Completed>(std::current_exception());
  }
  return std::make_unique<Completed>(nullptr);
}
}  // namespace

std::unique_ptr<Pending> Communicator::start_exchange(const std::vector<int>& peers, const torch::Tensor& send,
                                                      std::vector<torch::Tensor>& recv) {
  return perform_now([&] { exchange(peers, send, recv); });
}

std::unique_ptr<Pending> Communicator::start_all_reduce_mean(torch::Tensor& t) {
  return perform_now([&] { all_reduce_mean(t); });
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
