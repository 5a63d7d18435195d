// The forms of a round; see round_forms.hpp.
#include "gasloc/algo/round_forms.hpp"

#include <torch/torch.h>

#include "gasloc/algo/outer.hpp"
#include "gasloc/core/error.hpp"

namespace gasloc::algo {

const config::Choices& form_choices() {
  static const config::Choices c("GASLoC form", {{"anchor", "mix phi, outer step on theta"},
                                                 {"mix_after", "outer step, then mix"},
                                                 {"accelerated", "mix u, momentum on iterates"}});
  return c;
}

Form parse_form(const std::string& name) { return static_cast<Form>(form_choices().index(name)); }

std::string to_string(Form form) { return form_choices().options().at(static_cast<size_t>(form)).name; }

namespace {

torch::Tensor theta_of(const StateDict& s) {
  const auto it = s.find("theta");
  if (it == s.end()) throw CheckpointError("checkpoint lacks the outer anchor theta", "resume with the same algo.name");
  return it->second;
}

// What anchor and mix_after share: theta and b in an outer Nesterov optimizer.
class OuterForm : public RoundForm {
 public:
  OuterForm(const torch::Tensor& theta0, OuterOptions o) : outer_(theta0, o) {}

  StateDict state() const override {
    StateDict s{{"theta", outer_.theta()}};
    if (outer_.momentum().defined()) s["momentum"] = outer_.momentum();
    return s;
  }

  void load_state(const StateDict& s) override {
    outer_ = OuterNesterov(theta_of(s), outer_.options());
    if (!outer_.momentum().defined()) return;
    const auto m = s.find("momentum");
    if (m == s.end()) throw CheckpointError("checkpoint lacks the outer momentum", "resume with the same algo settings");
    outer_.momentum().copy_(m->second);
  }

 protected:
  OuterNesterov outer_;
};

class AnchorForm final : public OuterForm {
 public:
  using OuterForm::OuterForm;
  Sent send(const torch::Tensor& phi) const override { return {phi, {}}; }
  torch::Tensor provisional(const torch::Tensor& phi, const Sent&) const override {
    torch::Tensor unused;  // the momentum commits at the landing, from the true difference
    return outer_.propose(phi, unused);
  }
  torch::Tensor land(const torch::Tensor& m, const Sent&) override {
    outer_.step(m);
    return outer_.theta();
  }
};

class MixAfterForm final : public OuterForm {
 public:
  using OuterForm::OuterForm;
  Sent send(const torch::Tensor& phi) const override {
    Sent s;
    s.x = outer_.propose(phi, s.b_next);
    return s;
  }
  torch::Tensor provisional(const torch::Tensor&, const Sent& sent) const override { return sent.x; }
  torch::Tensor land(const torch::Tensor& m, const Sent& sent) override {
    outer_.commit(m, sent.b_next);
    return outer_.theta();
  }
};

class AcceleratedForm final : public RoundForm {
 public:
  AcceleratedForm(const torch::Tensor& theta0, const OuterStep& step)
      : theta_(theta0.detach().clone()), eta_(step.lr), alpha_(step.gossip_step), gamma_(step.momentum) {
    // u^prev starts at theta_0, so round 0's momentum term is 0 (PyTorch's Nesterov at Lambda = 0).
    if (gamma_ != 0.0) u_prev_ = theta0.detach().clone();
  }

  Sent send(const torch::Tensor& phi) const override {
    torch::NoGradGuard no_grad;
    // lerp with weight 1 returns its end exactly: eta = alpha = 1, gamma = 0 is Local-DAdam bit for bit.
    return {theta_.lerp(phi, eta_), {}};
  }

  torch::Tensor provisional(const torch::Tensor&, const Sent& sent) const override {
    torch::NoGradGuard no_grad;
    const auto& u = sent.x;
    auto e = u.clone();  // u.lerp(u, alpha) is u
    if (gamma_ != 0.0) e.add_(u - u_prev_, gamma_);
    return e;
  }

  torch::Tensor land(const torch::Tensor& m, const Sent& sent) override {
    torch::NoGradGuard no_grad;
    const auto& u = sent.x;
    auto next = u.lerp(m, alpha_);
    if (gamma_ != 0.0) {
      next.add_(u - u_prev_, gamma_);
      u_prev_.copy_(u);
    }
    theta_.copy_(next);
    return theta_;
  }

  StateDict state() const override {
    StateDict s{{"theta", theta_}};
    if (u_prev_.defined()) s["u_prev"] = u_prev_;
    return s;
  }

  void load_state(const StateDict& s) override {
    theta_ = theta_of(s).detach().clone();
    if (gamma_ == 0.0) return;
    const auto it = s.find("u_prev");
    if (it == s.end())
      throw CheckpointError("checkpoint lacks the accelerated form's u_prev",
                            "it was written with another algo.form or algo.outer_momentum = 0; resume with the same algo settings");
    u_prev_ = it->second.detach().clone();
  }

 private:
  torch::Tensor theta_, u_prev_;  // u_prev: only when gamma != 0
  double eta_, alpha_, gamma_;
};

class MixOnlyForm final : public RoundForm {
 public:
  Sent send(const torch::Tensor& phi) const override { return {phi, {}}; }
  // theta' = m: nothing to propose, so E = phi and both overlap variants are one.
  torch::Tensor provisional(const torch::Tensor& phi, const Sent&) const override { return phi; }
  torch::Tensor land(const torch::Tensor& m, const Sent&) override { return m; }
};

}  // namespace

std::unique_ptr<RoundForm> make_round_form(const OuterStep& step, const torch::Tensor& theta0) {
  const OuterOptions outer{step.lr, step.momentum};
  switch (step.form) {
    case Form::anchor: return std::make_unique<AnchorForm>(theta0, outer);
    case Form::mix_after: return std::make_unique<MixAfterForm>(theta0, outer);
    case Form::accelerated: return std::make_unique<AcceleratedForm>(theta0, step);
  }
  throw Error("make_round_form: unknown form " + std::to_string(static_cast<int>(step.form)));
}

std::unique_ptr<RoundForm> make_mix_only_form() { return std::make_unique<MixOnlyForm>(); }

}  // namespace gasloc::algo
