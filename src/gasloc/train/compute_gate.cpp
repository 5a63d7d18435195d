// The cores shared by an in-process cluster's workers; see compute_gate.hpp.
#include "gasloc/train/compute_gate.hpp"

#include <algorithm>
#include <string>

#include "gasloc/core/error.hpp"

namespace gasloc::train {

ComputeGate::ComputeGate(int slots) : slots_(slots) {
  if (slots < 1) throw Error("ComputeGate: slots must be >= 1, got " + std::to_string(slots));
}

void ComputeGate::acquire(double clock, int rank) {
  std::unique_lock lk(mu_);
  const std::pair<double, int> me{clock, rank};
  std::condition_variable mine;
  waiting_.emplace(me, &mine);
  mine.wait(lk, [&] { return held_ < slots_ && waiting_.begin()->first == me; });
  waiting_.erase(waiting_.begin());
  most_held_ = std::max(most_held_, ++held_);
  // Another slot may be free for the next in line.
  if (held_ < slots_ && !waiting_.empty()) waiting_.begin()->second->notify_one();
}

void ComputeGate::release() {
  std::lock_guard lk(mu_);
  --held_;
  if (!waiting_.empty()) waiting_.begin()->second->notify_one();
}

int ComputeGate::most_held() const {
  std::lock_guard lk(mu_);
  return most_held_;
}

int ComputeGate::waiting() const {
  std::lock_guard lk(mu_);
  return static_cast<int>(waiting_.size());
}

ComputeGate::Slot::Slot(ComputeGate* gate, double clock, int rank) : gate_(gate) {
  if (gate_) gate_->acquire(clock, rank);
}

ComputeGate::Slot::~Slot() {
  if (gate_) gate_->release();
}

}  // namespace gasloc::train
