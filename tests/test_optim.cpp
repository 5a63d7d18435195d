// Flat AdamW against LibTorch's own torch::optim::AdamW (the reference), schedules, clipping;
// GPA and Schedule-Free against AdamW, the explicit three-sequence form and hand-computed values.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "gasloc/core/error.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/optim/adamw.hpp"
#include "gasloc/optim/gpa.hpp"
#include "gasloc/optim/schedule.hpp"

using namespace gasloc;

TEST(AdamW, MatchesTorchAdamWWithDecayOnMatricesOnly) {
  auto c = model::LlamaConfig::preset("nano");
  c.vocab_size = 48;
  model::Llama ours(c), ref(c);
  ours->init_weights(7);
  ref->init_weights(7);
  FlatParams flat(ours->hf_parameters());
  optim::AdamWOptions o;
  o.weight_decay = 0.1;
  optim::AdamW opt(flat, o);

  std::vector<torch::Tensor> decay, no_decay;
  for (auto& [n, p] : ref->hf_parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0)));
  torch::optim::AdamW topt(groups, torch::optim::AdamWOptions(1));

  torch::manual_seed(0);
  for (int step = 1; step <= 20; ++step) {
    const double lr = 1e-3 * (1 + step % 3);
    for (auto& g : topt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    auto x = torch::randint(0, 48, {2, 16}, torch::kInt64);
    flat.zero_grad();
    ours->loss(x, x.roll(1, 1)).backward();
    opt.step(lr);
    topt.zero_grad();
    ref->loss(x, x.roll(1, 1)).backward();
    topt.step();
  }
  auto ours_p = ours->hf_parameters();
  auto ref_p = ref->hf_parameters();
  double worst = 0;
  for (size_t i = 0; i < ours_p.size(); ++i) worst = std::max(worst, (ours_p[i].second - ref_p[i].second).abs().max().item<double>());
  // Same operations in the same order; only fused-vs-per-tensor summation order can differ.
  EXPECT_LT(worst, 1e-6);
  EXPECT_EQ(opt.steps(), 20);
  // And the parameters did move (the comparison is not vacuous).
  model::Llama init(c);
  init->init_weights(7);
  EXPECT_GT((ours_p[0].second - init->hf_parameters()[0].second).abs().max().item<double>(), 1e-3);
}

TEST(Schedule, WarmupThenCosineToMin) {
  optim::Schedule s;
  s.lr = 1.0;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(s.at(1), 0.1);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  EXPECT_NEAR(s.at(500), 0.1, 1e-12);
  s.decay = "linear";
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);
  s.decay = "constant";
  EXPECT_DOUBLE_EQ(s.at(60), 1.0);
}

TEST(ClipGradNorm, ScalesToMaxNorm) {
  auto g = torch::tensor({3.0f, 4.0f});
  EXPECT_NEAR(optim::clip_grad_norm(g, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(g.norm().item<double>(), 1.0, 1e-5);
  auto h = torch::tensor({0.3f, 0.4f});
  optim::clip_grad_norm(h, 1.0);
  EXPECT_NEAR(h.norm().item<double>(), 0.5, 1e-7);
}

// ---------------------------------------------------------------------------------------------
// GPA and Schedule-Free (docs/design.md section 3).

namespace {
double max_abs(const torch::Tensor& t) { return t.abs().max().item<double>(); }

// A small flat buffer: a [6, 4] "matrix" (decayed) and a [5] gain vector (not decayed).
struct Toy {
  torch::Tensor w = torch::randn({6, 4}), g = torch::randn({5});
  FlatParams flat;
  Toy() : flat({{"w", w}, {"g", g}}) {}
};

// A smooth non-quadratic loss with a known gradient, so the test needs no autograd:
// L(p) = sum(a * (p - b)^2 / 2 + 0.1 * cos(3 p)), grad = a * (p - b) - 0.3 * sin(3 p).
torch::Tensor toy_grad(const torch::Tensor& p, const torch::Tensor& a, const torch::Tensor& b) {
  return a * (p - b) - 0.3 * torch::sin(3 * p);
}

// The three sequences of GPA written out plainly, in float64: gradients at y, AdamW's direction
// moves z, x averages z, y interpolates. With decay on z, z shrinks in place first and the
// implied x moves with it (x = (y - (1 - mu_y) z) / mu_y stays the definition).
struct ExplicitGpa {
  double mu_x, mu_y, wd, b1 = 0.9, b2 = 0.95, eps = 1e-8;
  int64_t decay_numel;
  torch::Tensor x, y, z, m, v;
  int64_t k = 0;
  ExplicitGpa(const torch::Tensor& p0, double mx, double my, double w, int64_t dn)
      : mu_x(mx), mu_y(my), wd(w), decay_numel(dn) {
    x = p0.to(torch::kFloat64);
    y = x.clone();
    z = x.clone();
    m = torch::zeros_like(x);
    v = torch::zeros_like(x);
  }
  void step(const torch::Tensor& g32, double lr) {
    ++k;
    auto g = g32.to(torch::kFloat64);
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    auto d = (m / (1 - std::pow(b1, k))) / (torch::sqrt(v / (1 - std::pow(b2, k))) + eps);
    if (wd != 0) {
      auto zd = z.clone();
      zd.narrow(0, 0, decay_numel).mul_(1 - lr * wd);
      x = x + (1 - mu_y) / mu_y * (z - zd);  // y fixed, z shrunk: the implied x moves
      z = zd;
    }
    z = z - lr * d;
    x = mu_x * x + (1 - mu_x) * z;
    y = mu_y * x + (1 - mu_y) * z;
  }
};
}  // namespace

TEST(Gpa, MuXZeroIsAdamW) {
  // mu_x = 0 makes x = z = y: AdamW with the same decoupled decay. Over 100 steps of the nano
  // model the two differ only by the rounding of y += -lr*d versus addcdiv: 2e-5 absolute.
  auto c = model::LlamaConfig::preset("nano");
  c.vocab_size = 48;
  model::Llama a(c), b(c);
  a->init_weights(3);
  b->init_weights(3);
  FlatParams fa(a->hf_parameters()), fb(b->hf_parameters());
  optim::AdamWOptions o;
  o.weight_decay = 0.1;
  optim::AdamW adamw(fa, o);
  optim::GpaOptions go;
  go.adam = o;
  go.mu_x = 0.0;
  go.mu_y = 0.7;
  optim::Gpa gpa(fb, go);
  torch::manual_seed(1);
  for (int step = 1; step <= 100; ++step) {
    auto x = torch::randint(0, 48, {2, 16}, torch::kInt64);
    const double lr = 3e-3 * std::min(1.0, step / 10.0);
    fa.zero_grad();
    a->loss(x, x.roll(1, 1)).backward();
    adamw.step(lr);
    fb.zero_grad();
    b->loss(x, x.roll(1, 1)).backward();
    gpa.step(lr);
    // y and z coincide bitwise at every step.
    ASSERT_TRUE(torch::equal(fb.data(), gpa.z_buffer())) << "step " << step;
  }
  EXPECT_LT(max_abs(fa.data() - fb.data()), 2e-5);
  model::Llama init(c);
  init->init_weights(3);
  EXPECT_GT(max_abs(fa.data() - FlatParams(init->hf_parameters()).data()), 1e-2);  // it moved
  // The evaluation point is the same parameters.
  auto y = fb.data().clone();
  {
    optim::EvalScope at_x(&gpa);
    EXPECT_TRUE(torch::equal(fb.data(), y));
  }
}

TEST(Gpa, MemoryEfficientFormEqualsThreeSequences) {
  // Float32 two-buffer form against the float64 three-sequence form over 100 steps: 1e-5.
  struct Case { double mu_x, mu_y, wd; };
  for (const Case cs : {Case{0.9, 0.7, 0.0}, Case{0.9967, 0.7, 0.0}, Case{0.5, 1.0, 0.0}, Case{0.99, 0.3, 0.0},
                        Case{0.0, 0.5, 0.0}, Case{0.95, 0.8, 0.1}, Case{0.9, 1.0, 0.1}}) {
    SCOPED_TRACE(::testing::Message() << "mu_x " << cs.mu_x << " mu_y " << cs.mu_y << " wd " << cs.wd);
    torch::manual_seed(5);
    Toy toy;
    const auto a = torch::rand({toy.flat.numel()}) + 0.5, b = torch::randn({toy.flat.numel()});
    optim::GpaOptions o;
    o.adam.weight_decay = cs.wd;
    o.mu_x = cs.mu_x;
    o.mu_y = cs.mu_y;
    optim::Gpa gpa(toy.flat, o);
    ExplicitGpa ref(toy.flat.data(), cs.mu_x, cs.mu_y, cs.wd, toy.flat.decay_numel());
    for (int k = 1; k <= 100; ++k) {
      const double lr = 0.05 * std::min(1.0, k / 10.0);
      toy.flat.grad().copy_(toy_grad(toy.flat.data(), a, b));
      gpa.step(lr);
      ref.step(toy_grad(ref.y, a, b), lr);
      ASSERT_LT(max_abs(toy.flat.data() - ref.y), 1e-5) << "y at step " << k;
      if (k % 10 == 0) {  // the evaluation point is the explicit x
        optim::EvalScope at_x(&gpa);
        ASSERT_LT(max_abs(toy.flat.data() - ref.x), 1e-5) << "x at step " << k;
      }
    }
    // The sequences are apart (unless mu_x = 0): the comparison is not of three equal tensors.
    if (cs.mu_x > 0) EXPECT_GT(max_abs(ref.x - ref.z), 1e-2);
  }
}

TEST(Gpa, EvalTrainSwitchIsARoundTripAndEvaluatesX) {
  auto c = model::LlamaConfig::preset("nano");
  c.vocab_size = 48;
  model::Llama m(c), probe(c);
  m->init_weights(4);
  FlatParams flat(m->hf_parameters());
  optim::GpaOptions o;
  o.mu_x = 0.9;
  o.mu_y = 0.7;
  optim::Gpa gpa(flat, o);
  torch::manual_seed(2);
  auto batch = torch::randint(0, 48, {2, 16}, torch::kInt64);
  for (int k = 0; k < 20; ++k) {
    flat.zero_grad();
    m->loss(batch, batch.roll(1, 1)).backward();
    gpa.step(3e-3);
  }
  torch::NoGradGuard no_grad;
  const auto y = flat.data().clone(), z = gpa.z_buffer().clone();
  const auto x = (y - (1 - o.mu_y) * z) / o.mu_y;  // x computed explicitly from y = mu_y x + (1-mu_y) z
  FlatParams probe_flat(probe->hf_parameters());
  probe_flat.data().copy_(x);
  const double loss_explicit = probe->loss(batch, batch.roll(1, 1)).item<double>();
  double loss_eval = 0;
  {
    optim::EvalScope at_x(&gpa);
    EXPECT_LT(max_abs(flat.data() - x), 1e-6);
    loss_eval = m->loss(batch, batch.roll(1, 1)).item<double>();
    optim::EvalScope nested(&gpa);  // nested scopes do not switch again
    EXPECT_LT(max_abs(flat.data() - x), 1e-6);
    EXPECT_THROW(gpa.step(1e-3), Error);  // stepping the evaluation point is refused
  }
  EXPECT_NEAR(loss_eval, loss_explicit, 1e-6);
  EXPECT_GT(max_abs(x - y), 1e-4);  // x and y differ: the switch matters
  // An evaluation that leaves x alone gives y and z back bit for bit: it never perturbs training.
  EXPECT_TRUE(torch::equal(flat.data(), y));
  EXPECT_TRUE(torch::equal(gpa.z_buffer(), z));

  // Replacing x in evaluation mode (as a synchronizer does) translates y and z along with it.
  const auto shift = torch::full_like(x, 0.25);
  {
    optim::EvalScope at_x(&gpa);
    flat.data().add_(shift);
  }
  EXPECT_LT(max_abs(flat.data() - (y + shift)), 1e-6);
  EXPECT_LT(max_abs(gpa.z_buffer() - (z + shift)), 1e-6);
}

// Schedule-Free against its reference algorithm: tests/test_schedule_free.cpp.

TEST(Gpa, HoldsExactlyOneParameterBufferMoreThanAdamW) {
  Toy toy;
  optim::AdamW adamw(toy.flat, {});
  const int64_t n = toy.flat.numel();
  EXPECT_EQ(adamw.state_bytes(), 2 * n * 4);
  optim::Gpa gpa(toy.flat, {});
  EXPECT_EQ(gpa.state_bytes() - adamw.state_bytes(), n * 4);
  optim::GpaOptions sfo;
  sfo.schedule_free = true;
  optim::Gpa sf(toy.flat, sfo);
  EXPECT_EQ(sf.state_bytes(), adamw.state_bytes());  // no first moment: v and z
}

TEST(Gpa, BadSettingsAndForeignCheckpointsAreRefused) {
  Toy toy;
  for (double mu_y : {0.0, -0.1, 1.5}) {
    optim::GpaOptions o;
    o.mu_y = mu_y;
    EXPECT_THROW(optim::Gpa(toy.flat, o), ConfigError) << mu_y;
  }
  for (double mu_x : {-0.01, 1.01}) {
    optim::GpaOptions o;
    o.mu_x = mu_x;
    EXPECT_THROW(optim::Gpa(toy.flat, o), ConfigError) << mu_x;
  }
  // An AdamW checkpoint has no z: GPA refuses it rather than starting z over; and the reverse.
  optim::AdamW adamw(toy.flat, {});
  optim::TensorMap adam_state;
  {
    optim::EvalScope s(&adamw);
    adam_state = adamw.state();
  }
  optim::Gpa gpa(toy.flat, {});
  try {
    gpa.load_state(adam_state);
    ADD_FAILURE() << "GPA loaded an AdamW state";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'optim.y'"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("another optimizer"), std::string::npos) << e.hint();
  }
  optim::TensorMap gpa_state;
  {
    optim::EvalScope s(&gpa);
    gpa_state = gpa.state();
  }
  EXPECT_THROW(adamw.load_state(gpa_state), CheckpointError);
  optim::GpaOptions sfo;
  sfo.schedule_free = true;
  optim::Gpa sf(toy.flat, sfo);
  EXPECT_THROW(sf.load_state(gpa_state), CheckpointError);
  EXPECT_THROW(gpa.state(), Error);  // state outside evaluation mode
}
