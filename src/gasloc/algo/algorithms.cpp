#include "gasloc/algo/algorithms.hpp"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "gasloc/core/error.hpp"

namespace gasloc::algo {

void AllReduceSync::after_backward(int64_t, FlatParams& params, comm::Communicator& comm) {
  comm.all_reduce_mean(params.grad());
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

// peer < 0: the tensor is an all-reduce result, so the sender is not known.
void check_finite(const torch::Tensor& t, int peer, const char* what) {
  if (!torch::isfinite(t).all().item<bool>())
    throw CommError(std::string(what) + ": " + (peer >= 0 ? "rank " + std::to_string(peer) : std::string("a worker")) +
                        " sent non-finite values (NaN or Inf); the round was rejected and the parameters are unchanged",
                    "that worker diverged: lower optim.lr or restart it from its last checkpoint");
}
}  // namespace

// ---------------------------------------------------------------------------------------------

void OuterSync::init(FlatParams& params) {
  outer_ = std::make_unique<OuterNesterov>(params.data(), outer_opts_);
  bytes_ = params.numel() * static_cast<int64_t>(c10::elementSize(wire_));
}

void OuterSync::finish_round(const torch::Tensor& mixed, FlatParams& params) {
  torch::NoGradGuard no_grad;
  outer_->step(mixed);
  params.data().copy_(outer_->theta());
  rounds_.next_round();
}

StateDict OuterSync::state() const {
  StateDict s;
  rounds_.save(s);
  save_outer(outer_, s);
  return s;
}

void OuterSync::load_state(const StateDict& s) {
  rounds_.load(s);
  load_outer(outer_, outer_opts_, s);
}

bool DiLoCoSync::after_step(int64_t, FlatParams& params, comm::Communicator& comm) {
  TORCH_CHECK(outer_, "DiLoCoSync::init was not called");
  if (!rounds_.step_done()) return false;
  optim::EvalScope at_x(optimizer());
  torch::NoGradGuard no_grad;
  finish_round(all_reduce_mix(params.data(), comm, wire_, "diloco all-reduce"), params);
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

torch::Tensor all_reduce_mix(const torch::Tensor& x, comm::Communicator& comm, torch::ScalarType wire, const char* what) {
  torch::NoGradGuard no_grad;
  auto buf = x.to(wire, /*non_blocking=*/false, /*copy=*/true);
  comm.all_reduce_mean(buf);
  check_finite(buf, -1, what);
  return buf.scalar_type() == x.scalar_type() ? buf : buf.to(x.scalar_type());
}

torch::Tensor gossip_mix(const topology::Topology& topo, int64_t round, const torch::Tensor& phi,
                         comm::Communicator& comm, torch::ScalarType wire) {
  torch::NoGradGuard no_grad;
  if (topo.is_all_reduce()) return all_reduce_mix(phi, comm, wire, "all-reduce");
  const int me = comm.rank();
  const auto peers = topo.peers(me, round);
  std::vector<torch::Tensor> recv;
  comm.exchange(peers, wire == phi.scalar_type() ? phi : phi.to(wire), recv);
  for (size_t k = 0; k < peers.size(); ++k) {
    check_finite(recv[k], peers[k], "gossip exchange");
    if (recv[k].scalar_type() != phi.scalar_type()) recv[k] = recv[k].to(phi.scalar_type());
  }
  torch::Tensor m;
  for (const auto& [j, w] : topo.mixing_row(me, round)) {
    const torch::Tensor* src = &phi;
    if (j != me) src = &recv[std::find(peers.begin(), peers.end(), j) - peers.begin()];
    if (!m.defined()) m = *src * w;
    else m.add_(*src, w);
  }
  return m;
}

namespace {
// The accelerated form's outer state is theta alone: its momentum acts on u, not through b.
OuterOptions anchor_options(OuterOptions outer, const GossipForm& form) {
  if (form.form == Form::accelerated) outer.momentum = 0.0;
  return outer;
}
}  // namespace

GossipSync::GossipSync(LocalSteps steps, OuterOptions outer, topology::Topology topo, GossipForm form,
                       torch::ScalarType wire)
    : OuterSync(std::move(steps), anchor_options(outer, form), wire), topo_(std::move(topo)), form_(form) {
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
  optim::EvalScope at_x(optimizer());
  torch::NoGradGuard no_grad;
  const int64_t t = rounds_.round();
  const auto& phi = params.data();
  switch (form_.form) {
    case Form::anchor:
      finish_round(gossip_mix(topo_, t, phi, comm, wire_), params);
      return true;
    case Form::mix_after: {
      torch::Tensor b_next;
      const auto v = outer_->propose(phi, b_next);
      const auto mixed = gossip_mix(topo_, t, v, comm, wire_);
      outer_->commit(mixed, b_next);
      break;
    }
    case Form::accelerated: {
      auto& theta = outer_->theta();
      // lerp with weight 1 returns its end exactly: eta = alpha = 1, gamma = 0 is Local-DAdam bit for bit.
      const auto u = theta.lerp(phi, outer_opts_.lr);
      const auto m = gossip_mix(topo_, t, u, comm, wire_);
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
  rounds_.next_round();
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
  optim::EvalScope at_x(optimizer());
  auto m = gossip_mix(topo_, rounds_.round(), params.data(), comm, wire_);
  torch::NoGradGuard no_grad;
  params.data().copy_(m);
  rounds_.next_round();
  return true;
}

StateDict LocalDAdamSync::state() const {
  StateDict s;
  rounds_.save(s);
  return s;
}

void LocalDAdamSync::load_state(const StateDict& s) { rounds_.load(s); }

// ---------------------------------------------------------------------------------------------

void DAdamSync::after_backward(int64_t step, FlatParams& params, comm::Communicator& comm) {
  // Round t = step - 1: the gradient was taken at the pre-mixing x_i; mix x before AdamW moves it.
  optim::EvalScope at_x(optimizer());
  auto m = gossip_mix(topo_, step - 1, params.data(), comm, wire_);
  torch::NoGradGuard no_grad;
  params.data().copy_(m);
}

}  // namespace gasloc::algo
