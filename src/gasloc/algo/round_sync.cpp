// The algorithms of rounds and their one round path; see round_sync.hpp.
#include "gasloc/algo/round_sync.hpp"

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

// ---------------------------------------------------------------------------------------------

namespace {
MixOptions overlapped_if(MixOptions o, const Overlap& overlap) {
  o.overlapped = overlap.steps > 0;
  return o;
}
}  // namespace

RoundSync::RoundSync(LocalSteps steps, std::optional<OuterStep> outer_step, MixOptions mix, torch::ScalarType wire,
                     Overlap overlap)
    : MixSync(overlapped_if(std::move(mix), overlap)),
      rounds_(std::move(steps)),
      outer_step_(outer_step),
      wire_(wire),
      overlap_(overlap) {}

void RoundSync::init(FlatParams& params) {
  numel_ = params.numel();
  form_ = outer_step_ ? make_round_form(*outer_step_, params.data()) : make_mix_only_form();
}

torch::Tensor RoundSync::anchor() const {
  // A compressed or a clipped all-reduce works on pseudo-gradients, theta - x.
  if (!mix().needs_anchor()) return {};
  const StateDict s = form().state();
  const auto it = s.find("theta");
  return it == s.end() ? torch::Tensor() : it->second;
}

RoundForm& RoundSync::form() const {
  if (!form_) throw Error(name() + ": init() was not called before its rounds");
  return *form_;
}

bool RoundSync::wants_compute(int64_t, comm::Communicator& comm) {
  const int64_t round = rounds_.round();
  return mix().computes(comm.rank(), round) && rounds_.computes_next(comm.rank(), mix().message_bytes(numel_, wire_, round));
}

bool RoundSync::sat_out(FlatParams& params, comm::Communicator& comm) {
  if (!stood_by(rounds_.round(), params, comm)) return false;
  end_round(comm);
  return true;
}

void RoundSync::end_round(comm::Communicator& comm) {
  ended(rounds_.round(), comm);
  rounds_.next_round();
}

bool RoundSync::after_step(int64_t, FlatParams& params, comm::Communicator& comm) {
  form();  // throws if init() was not called
  const bool round_end = rounds_.step_done();
  // A compressed round in flight moves on to its next exchange once the last one has landed.
  if (flight_.active && !flight_.mixed.defined()) mix().progress(flight_.mix);
  // tau < H_i: round t lands before round t + 1's send, so one round is in flight at most.
  if (flight_.active && rounds_.steps_in_round() == overlap_.steps) {
    optim::EvalScope at_x(optimizer());
    land(params, comm);
  }
  if (!round_end) return false;
  if (sat_out(params, comm)) return true;
  optim::EvalScope at_x(optimizer());
  send(params, comm);
  if (!overlapping()) land(params, comm);  // tau = 0
  end_round(comm);
  return true;
}

void RoundSync::send(FlatParams& params, comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  auto& phi = params.data();
  const int64_t t = rounds_.round();
  if (!overlapping()) {
    // phi stays phi_sent until the landing, which comes at once: no snapshot. Elastic rounds take
    // this path (their mix retries over the survivors); nothing changes if the mix throws.
    Sent sent = form().send(phi);
    flight_.mixed = mix().mix({.t = t, .x = sent.x, .wire = wire_, .anchor = anchor()}, comm);
    flight_.sent = std::move(sent);
    flight_.active = true;
    return;
  }
  // A snapshot: the live parameters keep training while the message travels.
  const torch::Tensor phi_sent = phi.clone();
  flight_.sent = form().send(phi_sent);
  flight_.mix = mix().start({.t = t, .x = flight_.sent.x, .wire = wire_, .anchor = anchor(), .overlapped = true}, comm);
  if (overlap_.variant == OverlapVariant::eager) {
    flight_.base = form().provisional(phi_sent, flight_.sent);
    phi.copy_(flight_.base);
  } else {
    flight_.base = phi_sent;
  }
  flight_.active = true;
}

void RoundSync::settle(comm::Communicator& comm) {
  if (!flight_.active || flight_.mixed.defined()) return;
  flight_.mixed = mix().finish(flight_.mix);
  flight_.mix = {};
}

void RoundSync::land(FlatParams& params, comm::Communicator& comm) {
  torch::NoGradGuard no_grad;
  settle(comm);
  const torch::Tensor theta = form().land(flight_.mixed, flight_.sent);
  auto& phi = params.data();
  if (!flight_.base.defined()) {
    phi.copy_(theta);  // tau = 0: no step ran since the send, so the drift is 0
  } else {
    // Keeps what the tau steps did on top of where they started (eager: theta' - E_i added;
    // delayed: the steps moved onto theta').
    const torch::Tensor drift = phi - flight_.base;
    phi.copy_(theta).add_(drift);
  }
  flight_ = {};
}

bool RoundSync::flush(FlatParams& params, comm::Communicator& comm) {
  if (!flight_.active) return false;
  optim::EvalScope at_x(optimizer());
  land(params, comm);
  return true;
}

StateDict RoundSync::state() const {
  StateDict s = form_ ? form_->state() : StateDict{};
  rounds_.save(s);
  save_flight(s);
  for (auto& [k, t] : mix().state()) s[k] = t;
  return s;
}

void RoundSync::load_state(const StateDict& s) {
  rounds_.load(s);
  form().load_state(s);
  load_flight(s);
  mix().load_state(s);
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

// ---------------------------------------------------------------------------------------------

DiLoCoSync::DiLoCoSync(LocalSteps steps, OuterOptions outer, int world, const Membership* membership, torch::ScalarType wire,
                       Overlap overlap)
    : RoundSync(std::move(steps), OuterStep{outer.lr, outer.momentum},
                MixOptions{.topology = topology::Topology(topology::Kind::complete, world, 0), .membership = membership}, wire,
                overlap) {}

GossipSync::GossipSync(LocalSteps steps, OuterOptions outer, topology::Topology topo, GossipForm form,
                       torch::ScalarType wire, const Membership* membership, Overlap overlap)
    : RoundSync(std::move(steps), OuterStep{outer.lr, outer.momentum, form.form, form.gossip_step},
                MixOptions{.topology = std::move(topo), .membership = membership}, wire, overlap) {}

LocalDAdamSync::LocalDAdamSync(LocalSteps steps, topology::Topology topo, torch::ScalarType wire,
                               const Membership* membership, Overlap overlap)
    : RoundSync(std::move(steps), std::nullopt, MixOptions{.topology = std::move(topo), .membership = membership}, wire,
                overlap) {}

}  // namespace gasloc::algo
