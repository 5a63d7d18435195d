// The cores shared by an in-process cluster's workers; see compute_gate.hpp.
#include "gasloc/train/compute_gate.hpp"

#include <sched.h>

#include <algorithm>
#include <string>

#include "gasloc/core/cpus.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::train {

namespace {
// Confines the calling thread to `cpus`. A failure (a cpuset changed under the process) leaves
// the thread where it was: pinning is for speed, never for correctness.
void run_on(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int c : cpus) CPU_SET(c, &set);
  (void)sched_setaffinity(0, sizeof(set), &set);
}
}  // namespace

ComputeGate::ComputeGate(int slots) : slots_(slots) {
  if (slots < 1) throw Error("ComputeGate: slots must be >= 1, got " + std::to_string(slots));
  for (int k = slots - 1; k >= 0; --k) free_.push_back(k);
  cpus_ = usable_cpu_ids();
  if (static_cast<int>(cpus_.size()) != slots) cpus_.clear();
}

int ComputeGate::acquire(double clock, int rank) {
  std::unique_lock lk(mu_);
  const std::pair<double, int> me{clock, rank};
  std::condition_variable mine;
  waiting_.emplace(me, &mine);
  mine.wait(lk, [&] { return held_ < slots_ && waiting_.begin()->first == me; });
  waiting_.erase(waiting_.begin());
  most_held_ = std::max(most_held_, ++held_);
  // Another slot may be free for the next in line.
  if (held_ < slots_ && !waiting_.empty()) waiting_.begin()->second->notify_one();
  const int index = free_.back();
  free_.pop_back();
  lk.unlock();
  if (pinned()) run_on({cpus_[static_cast<size_t>(index)]});
  return index;
}

void ComputeGate::release(int index) {
  if (pinned()) run_on(cpus_);
  std::lock_guard lk(mu_);
  --held_;
  free_.push_back(index);
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
  if (gate_) index_ = gate_->acquire(clock, rank);
}

ComputeGate::Slot::~Slot() {
  if (gate_) gate_->release(index_);
}

}  // namespace gasloc::train
