// The algorithms that communicate at every step; see step_sync.hpp.
#include "gasloc/algo/step_sync.hpp"

#include <torch/torch.h>

namespace gasloc::algo {

bool StepSync::enter_round(int64_t step, FlatParams& params, comm::Communicator& comm) {
  handled_ = step - 1;
  return stood_by(step - 1, params, comm);
}

void StepSync::end_step(int64_t step, FlatParams& params, comm::Communicator& comm) {
  const int64_t t = step - 1;
  if (handled_ != t) stood_by(t, params, comm);  // a step it did not compute: dead or joining
  ended(t, comm);
  steps_ = step;
}

AllReduceSync::AllReduceSync(int world, const Membership* membership)
    : StepSync(MixOptions{.topology = topology::Topology(topology::Kind::complete, world, 0), .membership = membership}) {}

void AllReduceSync::after_backward(int64_t step, FlatParams& params, comm::Communicator& comm) {
  if (!elastic()) {
    enter_round(step, params, comm);  // mixes: a fixed world has nobody to stand by
    comm.all_reduce_mean(params.grad());
    return;
  }
  if (enter_round(step, params, comm)) return;
  torch::NoGradGuard no_grad;
  params.grad().copy_(mix().mix({.t = step - 1, .x = params.grad()}, comm));
}

void DAdamSync::after_backward(int64_t step, FlatParams& params, comm::Communicator& comm) {
  // Round t = step - 1: the gradient was taken at the pre-mixing x_i; mix x before AdamW moves it.
  if (enter_round(step, params, comm)) return;
  optim::EvalScope at_x(optimizer());
  auto m = mix().mix({.t = step - 1, .x = params.data(), .wire = wire_}, comm);
  torch::NoGradGuard no_grad;
  params.data().copy_(m);
}

}  // namespace gasloc::algo
