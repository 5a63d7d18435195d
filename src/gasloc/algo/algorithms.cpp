#include "gasloc/algo/algorithms.hpp"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "gasloc/core/error.hpp"

namespace gasloc::algo {

StateDict StepSync::state() const {
  StateDict s;
  save_restart_clock(s);
  return s;
}

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
    : StepSync(RoundMixer(topology::Topology(topology::Kind::complete, world, 0), membership)) {}

void AllReduceSync::after_backward(int64_t step, FlatParams& params, comm::Communicator& comm) {
  if (!mixer_.elastic()) {
    enter_round(step, params, comm);  // mixes: a fixed world has nobody to stand by
    comm.all_reduce_mean(params.grad());
    return;
  }
  if (enter_round(step, params, comm)) return;
  torch::NoGradGuard no_grad;
  params.grad().copy_(mixer_.mix(step - 1, params.grad(), comm, torch::kFloat));
}

bool RoundCounter::step_done() { return ++steps_ >= policy_.H(); }

bool RoundCounter::computes_next(int rank, int64_t message_bytes) {
  if (planned_round_ != round_) {
    bool clamped = false;
    planned_steps_ = policy_.steps(rank, round_, message_bytes, &clamped);
    planned_round_ = round_;
    if (clamped && !warned_) {
      warned_ = true;
      spdlog::warn("worker {}: its predicted exchange ({:.1f} s) leaves no time for a local step in the {:.1f} s round "
                   "budget (round {}); it takes 1 step per such round and its peers wait for it",
                   rank, policy_.exchange_seconds(rank, round_, message_bytes), policy_.round_seconds(message_bytes), round_);
    }
  }
  return steps_ < planned_steps_;
}

void RoundCounter::save(StateDict& s) const {
  s["round"] = torch::tensor(round_, torch::kInt64);
  s["steps_in_round"] = torch::tensor(steps_, torch::kInt64);
}

void RoundCounter::load(const StateDict& s) {
  auto get = [&](const char* k) {
    auto it = s.find(k);
    if (it == s.end()) throw CheckpointError(std::string("checkpoint lacks the algorithm's '") + k + "'",
                                             "it was written by another algorithm; resume with the same algo.name");
    return it->second.item<int64_t>();
  };
  round_ = get("round");
  steps_ = get("steps_in_round");
}

namespace {
void save_outer(const std::unique_ptr<OuterNesterov>& outer, StateDict& s) {
  if (!outer) return;
  s["theta"] = outer->theta();
  if (outer->momentum().defined()) s["momentum"] = outer->momentum();
}

void load_outer(std::unique_ptr<OuterNesterov>& outer, const OuterOptions& opts, const StateDict& s) {
  auto it = s.find("theta");
  if (it == s.end()) throw CheckpointError("checkpoint lacks the outer anchor theta", "resume with the same algo.name");
  outer = std::make_unique<OuterNesterov>(it->second, opts);
  if (outer->momentum().defined()) {
    auto m = s.find("momentum");
    if (m == s.end()) throw CheckpointError("checkpoint lacks the outer momentum", "resume with the same algo settings");
    outer->momentum().copy_(m->second);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void RoundSync::init(FlatParams& params) { bytes_ = params.numel() * static_cast<int64_t>(c10::elementSize(wire_)); }

bool RoundSync::wants_compute(int64_t, comm::Communicator& comm) {
  return mixer_.computes(comm.rank(), rounds_.round()) && rounds_.computes_next(comm.rank(), bytes_);
}

bool RoundSync::sat_out(FlatParams& params, comm::Communicator& comm) {
  if (!stood_by(rounds_.round(), params, comm)) return false;
  end_round(comm);
  return true;
}

void OuterSync::init(FlatParams& params) {
  RoundSync::init(params);
  outer_ = std::make_unique<OuterNesterov>(params.data(), outer_opts_);
}

void OuterSync::finish_round(const torch::Tensor& mixed, FlatParams& params, comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  outer_->step(mixed);
  params.data().copy_(outer_->theta());
  end_round(comm);
}

StateDict OuterSync::state() const {
  StateDict s;
  rounds_.save(s);
  save_restart_clock(s);
  save_outer(outer_, s);
  return s;
}

void OuterSync::load_state(const StateDict& s) {
  rounds_.load(s);
  load_restart_clock(s);
  load_outer(outer_, outer_opts_, s);
}

DiLoCoSync::DiLoCoSync(LocalSteps steps, OuterOptions outer, int world, const Membership* membership, torch::ScalarType wire)
    : OuterSync(std::move(steps), outer, RoundMixer(topology::Topology(topology::Kind::complete, world, 0), membership), wire) {}

bool DiLoCoSync::after_step(int64_t, FlatParams& params, comm::Communicator& comm) {
  TORCH_CHECK(outer_, "DiLoCoSync::init was not called");
  if (!rounds_.step_done()) return false;
  if (sat_out(params, comm)) return true;
  optim::EvalScope at_x(optimizer());
  torch::NoGradGuard no_grad;
  // Elastic: the mean over the round's members, retried over the survivors when one dies.
  finish_round(mixer_.elastic() ? mixer_.mix(rounds_.round(), params.data(), comm, wire_)
                                : all_reduce_mix(params.data(), comm, wire_, "diloco all-reduce"),
               params, comm);
  return true;
}

// ---------------------------------------------------------------------------------------------

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
  return RoundMixer(topo, nullptr).mix(round, phi, comm, wire);
}

namespace {
// The accelerated form's outer state is theta alone: its momentum acts on u, not through b.
OuterOptions anchor_options(OuterOptions outer, const GossipForm& form) {
  if (form.form == Form::accelerated) outer.momentum = 0.0;
  return outer;
}
}  // namespace

GossipSync::GossipSync(LocalSteps steps, OuterOptions outer, topology::Topology topo, GossipForm form,
                       torch::ScalarType wire, const Membership* membership)
    : OuterSync(std::move(steps), anchor_options(outer, form), RoundMixer(std::move(topo), membership), wire), form_(form) {
  if (form_.form == Form::accelerated) gamma_ = outer.momentum;
}

void GossipSync::init(FlatParams& params) {
  OuterSync::init(params);
  // u^prev starts at theta_0, so round 0's momentum term is 0 (PyTorch's Nesterov at Lambda = 0).
  if (gamma_ != 0.0) u_prev_ = params.data().detach().clone();
}

bool GossipSync::after_step(int64_t, FlatParams& params, comm::Communicator& comm) {
  TORCH_CHECK(outer_, "GossipSync::init was not called");
  if (!rounds_.step_done()) return false;
  if (sat_out(params, comm)) return true;
  optim::EvalScope at_x(optimizer());
  torch::NoGradGuard no_grad;
  const int64_t t = rounds_.round();
  const auto& phi = params.data();
  switch (form_.form) {
    case Form::anchor:
      finish_round(mixer_.mix(t, phi, comm, wire_), params, comm);
      return true;
    case Form::mix_after: {
      torch::Tensor b_next;
      const auto v = outer_->propose(phi, b_next);
      const auto mixed = mixer_.mix(t, v, comm, wire_);
      outer_->commit(mixed, b_next);
      break;
    }
    case Form::accelerated: {
      auto& theta = outer_->theta();
      // lerp with weight 1 returns its end exactly: eta = alpha = 1, gamma = 0 is Local-DAdam bit for bit.
      const auto u = theta.lerp(phi, outer_opts_.lr);
      const auto m = mixer_.mix(t, u, comm, wire_);
      auto next = u.lerp(m, form_.gossip_step);
      if (gamma_ != 0.0) {
        next.add_(u - u_prev_, gamma_);
        u_prev_.copy_(u);
      }
      theta.copy_(next);
      break;
    }
  }
  params.data().copy_(outer_->theta());
  end_round(comm);
  return true;
}

StateDict GossipSync::state() const {
  auto s = OuterSync::state();
  if (u_prev_.defined()) s["u_prev"] = u_prev_;
  return s;
}

void GossipSync::load_state(const StateDict& s) {
  OuterSync::load_state(s);
  if (gamma_ == 0.0) return;
  auto it = s.find("u_prev");
  if (it == s.end())
    throw CheckpointError("checkpoint lacks the accelerated form's u_prev",
                          "it was written with another algo.form or algo.outer_momentum = 0; resume with the same algo settings");
  u_prev_ = it->second.detach().clone();
}

// ---------------------------------------------------------------------------------------------

bool LocalDAdamSync::after_step(int64_t, FlatParams& params, comm::Communicator& comm) {
  if (!rounds_.step_done()) return false;
  if (sat_out(params, comm)) return true;
  optim::EvalScope at_x(optimizer());
  auto m = mixer_.mix(rounds_.round(), params.data(), comm, wire_);
  torch::NoGradGuard no_grad;
  params.data().copy_(m);
  end_round(comm);
  return true;
}

StateDict LocalDAdamSync::state() const {
  StateDict s;
  rounds_.save(s);
  save_restart_clock(s);
  return s;
}

void LocalDAdamSync::load_state(const StateDict& s) {
  rounds_.load(s);
  load_restart_clock(s);
}

// ---------------------------------------------------------------------------------------------

void DAdamSync::after_backward(int64_t step, FlatParams& params, comm::Communicator& comm) {
  // Round t = step - 1: the gradient was taken at the pre-mixing x_i; mix x before AdamW moves it.
  if (enter_round(step, params, comm)) return;
  optim::EvalScope at_x(optimizer());
  auto m = mixer_.mix(step - 1, params.data(), comm, wire_);
  torch::NoGradGuard no_grad;
  params.data().copy_(m);
}

}  // namespace gasloc::algo
