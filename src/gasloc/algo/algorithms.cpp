#include "gasloc/algo/algorithms.hpp"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "gasloc/core/error.hpp"

namespace gasloc::algo {

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

// ---------------------------------------------------------------------------------------------
// Overlapped rounds (docs/design.md section 11).

const config::Choices& overlap_choices() {
  static const config::Choices c("overlap variant",
                                 {{"eager", "the overlapped steps start from a provisional outer step (own value for the mix)"},
                                  {"delayed", "the overlapped steps start from the sent parameters"}});
  return c;
}

Overlap parse_overlap(int64_t steps, const std::string& variant) {
  constexpr OverlapVariant kVariants[] = {OverlapVariant::eager, OverlapVariant::delayed};  // overlap_choices() order
  return {steps, kVariants[overlap_choices().index(variant)]};
}

bool RoundSync::overlapped_step(FlatParams& params, comm::Communicator& comm) {
  const bool round_end = rounds_.step_done();
  // tau < H_i: round t's merge comes before round t + 1's send, so one exchange is in flight at most.
  if (flight_.active && rounds_.steps_in_round() == overlap_.steps) {
    optim::EvalScope at_x(optimizer());
    merge(params, comm);
  }
  if (!round_end) return false;
  optim::EvalScope at_x(optimizer());
  send(params, comm);
  end_round(comm);
  return true;
}

void RoundSync::send(FlatParams& params, comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  // A snapshot: the live parameters keep training while the message travels.
  const torch::Tensor phi_sent = params.data().clone();
  Sent s = prepare(phi_sent);
  flight_.mix = mixer_.start_mix(rounds_.round(), s.x, comm, wire_);
  const bool eager = overlap_.variant == OverlapVariant::eager;
  flight_.base = eager ? s.provisional : phi_sent;
  if (eager) params.data().copy_(s.provisional);
  flight_.sent = std::move(s);
  flight_.active = true;
}

void RoundSync::settle(comm::Communicator& comm) {
  if (!flight_.active || flight_.mixed.defined()) return;
  flight_.mixed = mixer_.finish_mix(flight_.mix, comm.rank());
  flight_.mix = {};
}

void RoundSync::merge(FlatParams& params, comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  settle(comm);
  const torch::Tensor theta = land(flight_.mixed, flight_.sent);
  // Keeps what the overlapped steps did on top of where they started (eager: theta' - E_i added;
  // delayed: the steps moved onto theta').
  auto& phi = params.data();
  const torch::Tensor drift = phi - flight_.base;
  phi.copy_(theta).add_(drift);
  flight_ = {};
}

bool RoundSync::flush(FlatParams& params, comm::Communicator& comm) {
  if (!flight_.active) return false;
  optim::EvalScope at_x(optimizer());
  merge(params, comm);
  return true;
}

void RoundSync::save_flight(StateDict& s) const {
  if (!flight_.active) return;
  TORCH_CHECK(flight_.mixed.defined(), "RoundSync::state: an exchange is in flight; settle() it first");
  s["overlap_mixed"] = flight_.mixed;
  s["overlap_sent"] = flight_.sent.x;
  s["overlap_base"] = flight_.base;
  if (flight_.sent.b_next.defined()) s["overlap_b_next"] = flight_.sent.b_next;
}

void RoundSync::load_flight(const StateDict& s) {
  flight_ = {};
  const auto it = s.find("overlap_mixed");
  if (it == s.end()) return;
  auto get = [&](const char* k) {
    const auto at = s.find(k);
    if (at == s.end()) throw CheckpointError(std::string("checkpoint lacks the overlapped round's '") + k + "'",
                                             "it is damaged or from another gasloc; resume from an older step");
    return at->second.detach().clone();
  };
  flight_.active = true;
  flight_.mixed = it->second.detach().clone();
  flight_.sent.x = get("overlap_sent");
  flight_.base = get("overlap_base");
  if (s.count("overlap_b_next")) flight_.sent.b_next = get("overlap_b_next");
}

RoundSync::Sent OuterSync::prepare(const torch::Tensor& phi_sent) {
  torch::Tensor unused;  // the momentum commits at the merge, from the true difference
  return {phi_sent, outer_->propose(phi_sent, unused), {}};
}

torch::Tensor OuterSync::land(const torch::Tensor& mixed, const Sent&) {
  outer_->step(mixed);
  return outer_->theta();
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
  save_flight(s);
  return s;
}

void OuterSync::load_state(const StateDict& s) {
  rounds_.load(s);
  load_restart_clock(s);
  load_outer(outer_, outer_opts_, s);
  load_flight(s);
}

DiLoCoSync::DiLoCoSync(LocalSteps steps, OuterOptions outer, int world, const Membership* membership, torch::ScalarType wire,
                       Overlap overlap)
    : OuterSync(std::move(steps), outer, RoundMixer(topology::Topology(topology::Kind::complete, world, 0), membership), wire,
                overlap) {}

bool DiLoCoSync::after_step(int64_t, FlatParams& params, comm::Communicator& comm) {
  TORCH_CHECK(outer_, "DiLoCoSync::init was not called");
  if (overlapping()) return overlapped_step(params, comm);
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
                       torch::ScalarType wire, const Membership* membership, Overlap overlap)
    : OuterSync(std::move(steps), anchor_options(outer, form), RoundMixer(std::move(topo), membership), wire, overlap),
      form_(form) {
  if (form_.form == Form::accelerated) gamma_ = outer.momentum;
}

void GossipSync::init(FlatParams& params) {
  OuterSync::init(params);
  // u^prev starts at theta_0, so round 0's momentum term is 0 (PyTorch's Nesterov at Lambda = 0).
  if (gamma_ != 0.0) u_prev_ = params.data().detach().clone();
}

bool GossipSync::after_step(int64_t, FlatParams& params, comm::Communicator& comm) {
  TORCH_CHECK(outer_, "GossipSync::init was not called");
  if (overlapping()) return overlapped_step(params, comm);
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

RoundSync::Sent GossipSync::prepare(const torch::Tensor& phi_sent) {
  switch (form_.form) {
    case Form::anchor: break;
    case Form::mix_after: {
      Sent s;
      s.x = outer_->propose(phi_sent, s.b_next);
      s.provisional = s.x;
      return s;
    }
    case Form::accelerated: {
      const auto u = outer_->theta().lerp(phi_sent, outer_opts_.lr);
      // Every term but alpha's: u.lerp(u, alpha) is u.
      auto e = u.clone();
      if (gamma_ != 0.0) e.add_(u - u_prev_, gamma_);
      return {u, e, {}};
    }
  }
  return OuterSync::prepare(phi_sent);
}

torch::Tensor GossipSync::land(const torch::Tensor& mixed, const Sent& sent) {
  switch (form_.form) {
    case Form::anchor: break;
    case Form::mix_after:
      outer_->commit(mixed, sent.b_next);
      return outer_->theta();
    case Form::accelerated: {
      const auto& u = sent.x;
      auto next = u.lerp(mixed, form_.gossip_step);
      if (gamma_ != 0.0) {
        next.add_(u - u_prev_, gamma_);
        u_prev_.copy_(u);
      }
      outer_->theta().copy_(next);
      return outer_->theta();
    }
  }
  return OuterSync::land(mixed, sent);
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
  if (overlapping()) return overlapped_step(params, comm);
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
  save_flight(s);
  return s;
}

void LocalDAdamSync::load_state(const StateDict& s) {
  rounds_.load(s);
  load_restart_clock(s);
  load_flight(s);
}

}  // namespace gasloc::algo
