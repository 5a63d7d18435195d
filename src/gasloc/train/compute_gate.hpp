// The cores of an in-process cluster shared by its workers: at most `slots` of them compute (a
// step's forward, backward and optimizer, an evaluation) at once, the others wait for a slot, and
// a free slot goes to the waiting worker furthest behind on its clock (lowest virtual time, then
// lowest rank). The worker threads stay; what is pooled is the cores.
//
// Why: a worker is a thread, and Debian's OpenBLAS terminates the process when more threads call
// it at once than it was built for (128): 1,024 in-process nano workers died at their first
// evaluation, where they all compute together. Gated, only `slots` threads are ever inside BLAS.
// The gate changes when a worker computes, never what: the bits are the ungated run's (a test),
// and the virtual clock does not see it. Nothing that communicates may run inside a slot (a
// holder that waits for a peer that waits for its slot would never return).
//
// With as many slots as CPUs this process may run on, each slot is one CPU: a holder runs on its
// slot's CPU and returns to all of them when it lets go. Why: unpinned, the worker woken for a
// freed slot is often queued behind the other holder while the freed CPU idles (256 nano
// workers on 2 cores kept 1.74 of them busy; pinned, 1.90; bench_cluster --scale).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <map>
#include <utility>
#include <vector>

namespace gasloc::train {

class ComputeGate {
 public:
  // slots >= 1.
  explicit ComputeGate(int slots);
  int slots() const { return slots_; }
  // Whether each slot is pinned to a CPU of its own (slots == the CPUs this process may use).
  bool pinned() const { return !cpus_.empty(); }

  // One worker's slot for a scope: waits until it is this worker's turn.
  class Slot {
   public:
    Slot(ComputeGate* gate, double clock, int rank);  // a null gate: no wait, no slot
    ~Slot();
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    ComputeGate* gate_;
    int index_ = -1;  // which slot: with pinned slots, which CPU
  };

  // The most workers that held a slot at once, and how many wait now (for tests).
  int most_held() const;
  int waiting() const;

 private:
  int acquire(double clock, int rank);  // the slot's index
  void release(int index);

  const int slots_;
  std::vector<int> cpus_;  // slot k runs on CPU cpus_[k]; empty: slots are not pinned
  mutable std::mutex mu_;
  int held_ = 0, most_held_ = 0;
  std::vector<int> free_;  // the indices of the slots not held
  // (clock, rank), the first served first, and the condition its waiter sleeps on: a release
  // wakes the next in line only, not every waiter (1,024 of them would all wake to see it).
  std::map<std::pair<double, int>, std::condition_variable*> waiting_;
};

}  // namespace gasloc::train
