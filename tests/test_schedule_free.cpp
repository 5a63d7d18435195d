// Schedule-Free AdamW (optim.name = "schedule_free") against the reference algorithm,
// facebookresearch/schedule_free's adamw_schedulefree_reference.py: no first moment, beta1 the
// interpolation weight y = beta1 x + (1 - beta1) z, the lr carrying sqrt(1 - beta2^k), and
// x averaged with c_k = w_k / sum w, w_k = lr_max_k^2. The reference is written out here in
// doubles, with its explicit x, y and z, exactly in the order of that file's step().
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "gasloc/core/error.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/optim/adamw.hpp"
#include "gasloc/optim/gpa.hpp"

using namespace gasloc;

namespace {
// The reference on a flat vector; `decays[k]` says whether entry k receives weight decay.
struct Reference {
  double b1, b2, eps, wd;
  bool decay_at_z;
  std::vector<bool> decays;
  std::vector<double> x, y, z, v;
  double lr_max = -1.0, weight_sum = 0.0, c = 0.0;
  int64_t k = 0;

  void step(const std::vector<double>& grad, double lr_sched) {
    const double bc2 = 1.0 - std::pow(b2, static_cast<double>(k + 1));
    const double lr = lr_sched * std::sqrt(bc2);
    lr_max = std::max(lr, lr_max);
    const double weight = lr_max * lr_max;  // r = 0, weight_lr_power = 2
    weight_sum += weight;
    c = weight_sum > 0 ? weight / weight_sum : 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (wd != 0 && decays[i]) z[i] -= lr * wd * (decay_at_z ? z[i] : y[i]);
      v[i] = v[i] * b2 + (1 - b2) * grad[i] * grad[i];
      z[i] -= lr * grad[i] / (std::sqrt(v[i]) + eps);
      x[i] = x[i] * (1 - c) + c * z[i];
      y[i] = x[i] * b1 + (1 - b1) * z[i];
    }
    ++k;
  }
};

std::vector<double> to_vec(const torch::Tensor& t) {
  auto d = t.to(torch::kFloat64).contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}
}  // namespace

TEST(ScheduleFree, MatchesTheReferenceAlgorithm) {
  // L = 1/2 sum a_i (p_i - t_i)^2 on a 2x3 matrix (weight decay) and a 3-vector (none); 60 steps
  // with a linear warmup over 5 steps, then a constant lr that drops to half at step 40 (lr_max
  // keeps the weights uniform then). Cases: no decay, decay at y, decay at z, beta1 = 0.5.
  // y after every step and x at every tenth, against the doubles: 2e-5 (float32 state).
  struct Case {
    double b1, wd;
    bool at_z;
  };
  for (const auto& cs : {Case{0.9, 0.0, false}, Case{0.9, 0.1, false}, Case{0.9, 0.1, true}, Case{0.5, 0.05, false}}) {
    SCOPED_TRACE("beta1 " + std::to_string(cs.b1) + " wd " + std::to_string(cs.wd) + (cs.at_z ? " at z" : " at y"));
    torch::manual_seed(3);
    auto w = torch::randn({2, 3}), g = torch::randn({3});
    FlatParams flat({{"w", w}, {"g", g}});
    const int64_t n = flat.numel();
    ASSERT_EQ(flat.decay_numel(), 6);
    const auto a = torch::linspace(0.5, 3.0, n);
    const auto target = torch::linspace(-1.0, 1.0, n);
    optim::GpaOptions o;
    o.schedule_free = true;
    o.adam.beta1 = cs.b1;
    o.adam.weight_decay = cs.wd;
    o.decay_on_y = !cs.at_z;
    o.mu_y = 0.3;  // GPA's setting: Schedule-Free must not use it
    optim::Gpa sf(flat, o);
    Reference ref{cs.b1, o.adam.beta2, o.adam.eps, cs.wd, cs.at_z, {}, to_vec(flat.data()), to_vec(flat.data()),
                  to_vec(flat.data()), std::vector<double>(n, 0.0)};
    for (int64_t i = 0; i < n; ++i) ref.decays.push_back(i < flat.decay_numel());
    for (int k = 1; k <= 60; ++k) {
      const double lr = k <= 5 ? 0.05 * k / 5 : k <= 40 ? 0.05 : 0.025;
      std::vector<double> grad(n);
      const auto y = to_vec(flat.data());
      for (int64_t i = 0; i < n; ++i) grad[i] = a[i].item<double>() * (y[i] - target[i].item<double>());
      flat.grad().copy_(a * (flat.data() - target));
      sf.step(lr);
      ref.step(grad, lr);
      ASSERT_NEAR(sf.last_c(), ref.c, 1e-12) << "step " << k;
      const auto got_y = to_vec(flat.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(got_y[i], ref.y[i], 2e-5) << "y, step " << k << " entry " << i;
      if (k % 10 == 0) {
        optim::EvalScope at_x(&sf);
        const auto got_x = to_vec(flat.data());
        for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(got_x[i], ref.x[i], 2e-5) << "x, step " << k << " entry " << i;
        const auto got_z = to_vec(sf.z_buffer());
        for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(got_z[i], ref.z[i], 2e-5) << "z, step " << k << " entry " << i;
      }
    }
  }
}

TEST(ScheduleFree, FirstStepsByHand) {
  // L(p) = p^2, p0 = 1, lr 0.1 constant, beta1 0.9, beta2 0.95, eps 1e-8, no decay.
  // Step 1: g = 2, v = 0.2, lr_1 = 0.1 sqrt(0.05); z = 1 - lr_1 * 2 / sqrt(0.2) = 0.9 (Adam's
  //   first step is lr in size), c_1 = 1, x = z, y = 0.9.
  // Step 2: g = 1.8, v = 0.95 * 0.2 + 0.05 * 3.24 = 0.352, lr_2 = 0.1 sqrt(0.0975);
  //   c_2 = 0.000975 / (0.0005 + 0.000975) = 0.661017; z = 0.9 - lr_2 * 1.8 / sqrt(0.352) = 0.805267;
  //   x = (1 - c) 0.9 + c z = 0.837380; y = 0.9 x + 0.1 z = 0.834168.
  // Step 3: c_3 = 0.491598, z = 0.713710, x = 0.776584, y = 0.770296.
  FlatParams flat({{"p", torch::ones({1})}});
  optim::GpaOptions o;
  o.schedule_free = true;
  o.adam.weight_decay = 0.0;
  optim::Gpa sf(flat, o);
  const double c[] = {1.0, 0.661017, 0.491598}, z[] = {0.9, 0.805267, 0.713710}, x[] = {0.9, 0.837380, 0.776584},
               y[] = {0.9, 0.834168, 0.770296};
  for (int k = 0; k < 3; ++k) {
    flat.grad().copy_(2 * flat.data());
    sf.step(0.1);
    EXPECT_NEAR(sf.last_c(), c[k], 1e-6) << "step " << k + 1;
    EXPECT_NEAR(flat.data().item<double>(), y[k], 1e-6) << "step " << k + 1;
    EXPECT_NEAR(sf.z_buffer().item<double>(), z[k], 1e-6) << "step " << k + 1;
    optim::EvalScope at_x(&sf);
    EXPECT_NEAR(flat.data().item<double>(), x[k], 1e-6) << "step " << k + 1;
  }
}

TEST(ScheduleFree, KeepsNoFirstMomentAndAdamWsMemory) {
  FlatParams flat({{"w", torch::randn({4, 5})}, {"g", torch::ones({5})}});
  optim::AdamW adamw(flat, {});
  optim::GpaOptions o;
  o.schedule_free = true;
  optim::Gpa sf(flat, o);
  EXPECT_EQ(sf.state_bytes(), adamw.state_bytes());  // v and z against m and v
  flat.grad().fill_(0.5);
  sf.step(0.01);
  optim::TensorMap s;
  {
    optim::EvalScope at_x(&sf);
    s = sf.state();
  }
  EXPECT_EQ(s.count("exp_avg"), 0u);
  for (const char* k : {"exp_avg_sq", "z", "y", "sf_lr_max", "sf_weight_sum", "step"}) EXPECT_EQ(s.count(k), 1u) << k;
  optim::Gpa again(flat, o);
  again.load_state(s);
  EXPECT_EQ(again.steps(), 1);
  // A GPA state (with its first moment) is refused.
  optim::Gpa gpa(flat, {});
  optim::TensorMap gs;
  {
    optim::EvalScope at_x(&gpa);
    gs = gpa.state();
  }
  EXPECT_THROW(again.load_state(gs), CheckpointError);
}

TEST(ScheduleFree, InterpolationWeightOutOfRangeIsRefused) {
  FlatParams flat({{"p", torch::ones({3})}});
  for (double b1 : {0.0, -0.1, 1.5}) {
    optim::GpaOptions o;
    o.schedule_free = true;
    o.adam.beta1 = b1;
    try {
      optim::Gpa sf(flat, o);
      ADD_FAILURE() << "beta1 " << b1 << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("beta1"), std::string::npos) << e.what();
    }
  }
}
