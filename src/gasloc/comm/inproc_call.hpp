// Internal to the in-process backend (inproc.cpp): one collective call as seen by all ranks,
// and the pure step that checks it and decides its outcome once every rank has arrived.
// Kept apart from the threading so the rules (what must match, what each rank pays) read on
// their own.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gasloc/comm/network_model.hpp"

namespace gasloc::comm::inproc {

enum class Op { AllReduceMean, AllReduceOver, Exchange, Broadcast, Barrier };
const char* op_name(Op op);

// What one rank brought to a call.
struct Entry {
  bool present = false;    // the rank has entered the call
  bool data_done = false;  // the rank has finished reading the others' tensors
  Op op = Op::Barrier;
  torch::Tensor tensor;    // all_reduce_mean: flat input; exchange: send; broadcast: the tensor
  std::vector<int> peers;  // exchange
  std::vector<int> members;  // all_reduce_mean_over: the round's members, ascending
  int root = -1;           // broadcast
  double clock = 0.0;      // the rank's virtual clock at entry
  bool counted = true;     // false: a call on the control channel (priced at nothing)
};

// What the call gives back to one rank.
struct Outcome {
  ClockUpdate clock;
  int64_t sent = 0;
  int64_t received = 0;
};

// Call #seq of all n ranks. Lives from the first arrival until the last rank leaves.
struct Call {
  Call(int n, int64_t seq) : seq(seq), entries(n), out(n) {}
  int64_t seq;
  std::vector<Entry> entries;
  std::vector<Outcome> out;
  int arrived = 0, data_done = 0, left = 0;
  bool ready = false;    // everyone arrived and settle() ran
  bool aborted = false;  // all_reduce_mean_over: a member left; nobody's tensor changes
  std::string error;     // what settle() found wrong, if anything (the call then fails everywhere)
  torch::Tensor result;  // all_reduce_mean: the flat mean, filled chunk by chunk by the ranks
};

// Elastic rounds (docs/design.md section 10): heartbeat_timeout_s >= 0 allows a rank to leave at
// an exchange or a member all-reduce (an undefined tensor: it dies there) and prices its
// partners' wait until the failure is detected; < 0, a cluster that is not elastic, makes that
// an error.
struct Elastic {
  double heartbeat_timeout_s = -1.0;
  bool enabled() const { return heartbeat_timeout_s >= 0; }
};

// Run by the last rank to arrive, under the cluster's lock: checks that the ranks agree (sets
// call.error naming the operation and ranks if not), then prices the call on the virtual clocks
// (call.out) and allocates call.result for an all-reduce. Sets call.ready. An all-reduce over
// members that one of them left sets call.aborted instead of a result.
void settle(Call& call, const NetworkModel& model, Elastic elastic = {});

}  // namespace gasloc::comm::inproc
