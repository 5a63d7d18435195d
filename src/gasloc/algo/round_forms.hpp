// The forms of a round (algo.form, docs/design.md section 3), each written once as two halves
// around the round's mix: what a worker sends at the round's end, and how the finished mix lands
// as its new anchor theta'. RoundSync (round_sync.hpp) runs them on one worker's parameters,
// blocking or overlapped; the consensus simulation (consensus.hpp) runs the same code on every
// worker's vectors at once, which it can because every form acts entry by entry.
// Notation: phi the live parameters (phi_sent at the send), theta the anchor, b the outer
// momentum, s the message, m = sum_j W_t[i,j] s_j the round's mix (own term s_i).
#pragma once
#include <torch/types.h>

#include <map>
#include <memory>
#include <string>

#include "gasloc/core/choice.hpp"

namespace gasloc::algo {

using StateDict = std::map<std::string, torch::Tensor>;  // as in synchronizer.hpp

// The GASLoC forms, in the order of form_choices().
enum class Form { anchor, mix_after, accelerated };
// The names of the forms, in the order of Form (algo.form, `gasloc topo --form`).
const config::Choices& form_choices();
// A name of form_choices() to its Form; ConfigError listing them otherwise.
Form parse_form(const std::string& name);
std::string to_string(Form form);

// A form with its outer step: lr eta and momentum mu (gamma, for accelerated) of the outer
// optimizer (outer.hpp), alpha for accelerated. {1, 0} in the anchor form is the consensus
// simulation's plain averaging (consensus.hpp).
struct OuterStep {
  double lr = 1.0;
  double momentum = 0.0;
  Form form = Form::anchor;
  double gossip_step = 1.0;  // alpha, accelerated only
};

// What a round sends, with what its landing needs besides the mix.
struct Sent {
  torch::Tensor x;       // s: the message
  torch::Tensor b_next;  // mix_after: the outer momentum after this round (undefined otherwise)
};

// One form's round:
//   anchor (DiLoCo's round too): s = phi; theta' = the outer Nesterov step on theta towards m.
//   mix_after:   s = v = theta - eta N(theta - phi), N the Nesterov direction with b; theta' = m,
//                and b commits as proposed with v.
//   accelerated: s = u = theta + eta (phi - theta); theta' = u - alpha (u - m) + gamma (u - u^prev),
//                u^prev <- u (its momentum acts on u: it keeps u^prev, no b).
//   mix only (Local-DAdam): s = phi; theta' = m; no state.
// send() and provisional() change nothing, so a round that fails in its exchange leaves the form
// as it was; land() commits.
class RoundForm {
 public:
  virtual ~RoundForm() = default;
  // s from phi_sent.
  virtual Sent send(const torch::Tensor& phi) const = 0;
  // E (overlapped rounds, eager variant): the round's update with the worker's own message
  // standing in for the mix. anchor: the outer step towards phi; mix_after: v; accelerated:
  // every term but alpha's, u + gamma (u - u^prev); mix only: phi.
  virtual torch::Tensor provisional(const torch::Tensor& phi, const Sent& sent) const = 0;
  // theta' from m, the finished mix of sent.x; commits the form's state.
  virtual torch::Tensor land(const torch::Tensor& m, const Sent& sent) = 0;
  // The form's state under its checkpoint names: theta and momentum (anchor, mix_after; momentum
  // only when mu != 0), theta and u_prev (accelerated; u_prev only when gamma != 0). The tensors
  // are the form's own, not copies: the consensus simulation rescales them in place.
  virtual StateDict state() const { return {}; }
  // Replaces the state by a checkpoint's; CheckpointError naming what it lacks.
  virtual void load_state(const StateDict&) {}
};

// The form of `step` with its anchor at theta0 (cloned). The accelerated form keeps no b: its
// momentum is gamma on u.
std::unique_ptr<RoundForm> make_round_form(const OuterStep& step, const torch::Tensor& theta0);
// Local-DAdam's round: theta' = m exactly.
std::unique_ptr<RoundForm> make_mix_only_form();

}  // namespace gasloc::algo
