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
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <map>
#include <utility>

namespace gasloc::train {

class ComputeGate {
 public:
  // slots >= 1.
  explicit ComputeGate(int slots);
  int slots() const { return slots_; }

  // One worker's slot for a scope: waits until it is this worker's turn.
  class Slot {
   public:
    Slot(ComputeGate* gate, double clock, int rank);  // a null gate: no wait, no slot
    ~Slot();
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    ComputeGate* gate_;
  };

  // The most workers that held a slot at once, and how many wait now (for tests).
  int most_held() const;
  int waiting() const;

 private:
  void acquire(double clock, int rank);
  void release();

  const int slots_;
  mutable std::mutex mu_;
  int held_ = 0, most_held_ = 0;
  // (clock, rank), the first served first, and the condition its waiter sleeps on: a release
  // wakes the next in line only, not every waiter (1,024 of them would all wake to see it).
  std::map<std::pair<double, int>, std::condition_variable*> waiting_;
};

}  // namespace gasloc::train
