// The fused kernels (model/fused.hpp) and fused AdamW against the reference ops they replace:
// values and gradients on many shapes, the hand-written backward passes by finite differences,
// the whole model, and 50 training steps on real (byte-level) data.
//
// Tolerances: the fused kernels compute in fp32 with another summation order and a polynomial
// exp (1-2 ulp), so values and gradients agree to about 1e-6 relative; the checks use 2e-5 (of
// the reference's largest magnitude) to leave room for the longest reductions. Finite
// differences are fp32 central differences with h = 1e-2, good to about 1e-3 relative.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>

#include "gasloc/core/error.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/data/dataset.hpp"
#include "gasloc/data/sampler.hpp"
#include "gasloc/model/fused.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/optim/adamw.hpp"
#include "test_util.hpp"

using namespace gasloc;
namespace F = torch::nn::functional;
namespace fused = gasloc::model::fused;

namespace {
// max |a - b| / max(max |b|, 1e-30): error relative to the reference's scale.
double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a - b).abs().max().item<double>() / scale;
}

constexpr double kTol = 2e-5;

// Runs f on fresh leaf copies of inputs, backpropagates a fixed random upstream gradient and
// returns {output, grads...}.
template <class Fn>
std::vector<torch::Tensor> value_and_grads(Fn f, const std::vector<torch::Tensor>& inputs, const torch::Tensor& upstream) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().clone().requires_grad_(true));
  auto out = f(leaves);
  (out * upstream).sum().backward();
  std::vector<torch::Tensor> r = {out.detach()};
  for (auto& l : leaves) r.push_back(l.grad());
  return r;
}

template <class Fused, class Ref>
void expect_same(Fused fu, Ref ref, const std::vector<torch::Tensor>& inputs, const std::string& what) {
  torch::manual_seed(11);
  auto probe = ref(inputs);
  auto upstream = torch::randn(probe.sizes());
  auto a = value_and_grads(fu, inputs, upstream);
  auto b = value_and_grads(ref, inputs, upstream);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].sizes(), b[i].sizes()) << what << " item " << i;
    EXPECT_LT(rel_err(a[i], b[i]), kTol) << what << (i == 0 ? " value" : " grad of input " + std::to_string(i - 1));
  }
}

// Directional finite difference of L = sum(f(inputs) * upstream) along a random direction of
// input k, against the autograd gradient's projection on that direction.
template <class Fn>
void expect_fd(Fn f, const std::vector<torch::Tensor>& inputs, size_t k, const std::string& what) {
  torch::manual_seed(5);
  const torch::Tensor probe = f(inputs);
  const torch::Tensor upstream = torch::randn(probe.sizes());
  const torch::Tensor g = value_and_grads(f, inputs, upstream)[k + 1];
  auto dir = torch::randn(inputs[k].sizes());
  const double h = 1e-2;
  auto at = [&](double s) {
    auto in = inputs;
    in[k] = inputs[k] + s * dir;
    const torch::Tensor out = f(in);
    return (out * upstream).sum().item<double>();
  };
  const double fd = (at(h) - at(-h)) / (2 * h);
  const double an = (g * dir).sum().item<double>();
  EXPECT_NEAR(fd, an, 1e-3 * std::max(1.0, std::abs(an))) << what;
}

torch::Tensor ref_rms(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return w * (x * torch::rsqrt(x.pow(2).mean(-1, true) + eps));
}

torch::Tensor ref_causal_softmax(const torch::Tensor& s, double scale) {
  const int64_t R = s.size(-2), T = s.size(-1);
  auto pos = torch::arange(R, torch::kInt64).remainder(T).unsqueeze(1);
  auto mask = torch::arange(T, torch::kInt64).unsqueeze(0) > pos;  // key after the query
  return torch::softmax((s * scale).masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
}
}  // namespace

TEST(Fused, ExpApproxIsWithinTwoUlpOfStdExp) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
    const double e = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(fused::exp_approx(x) - e) / e);
  }
  EXPECT_LT(worst, 2.5e-7);  // 2 ulp of fp32 is 2.4e-7
  EXPECT_GT(fused::exp_approx(-1000.0f), 0.0f);  // clamped, never NaN
  EXPECT_TRUE(std::isfinite(fused::exp_approx(1000.0f)));
}

TEST(Fused, RMSNormMatchesReferenceOnManyShapes) {
  // Not C = 1: there y = w sign(x) and dx is O(eps), pure cancellation in either implementation.
  for (int64_t C : {3, 7, 8, 64, 130})
    for (std::vector<int64_t> lead : {std::vector<int64_t>{1}, {3}, {2, 17}}) {
      auto shape = lead;
      shape.push_back(C);
      auto x = torch::randn(shape) * 3, w = torch::randn({C});
      const std::string what = "rms C=" + std::to_string(C) + " rows=" + std::to_string(x.numel() / C);
      expect_same([](auto& in) { return fused::rms_norm(in[0], in[1], 1e-5); },
                  [](auto& in) { return ref_rms(in[0], in[1], 1e-5); }, {x, w}, what);
    }
  auto x = torch::randn({5, 33}), w = torch::randn({33});
  auto f = [](const auto& in) { return fused::rms_norm(in[0], in[1], 1e-5); };
  expect_fd(f, {x, w}, 0, "rms dx");
  expect_fd(f, {x, w}, 1, "rms dw");
}

TEST(Fused, RMSNormWeightGradientIsTheSameWithTwoThreads) {
  const int before = torch::get_num_threads();
  auto x = torch::randn({300, 64}), w = torch::randn({64});
  torch::set_num_threads(2);
  expect_same([](auto& in) { return fused::rms_norm(in[0], in[1], 1e-5); },
              [](auto& in) { return ref_rms(in[0], in[1], 1e-5); }, {x, w}, "rms, 2 threads");
  torch::set_num_threads(before);
}

TEST(Fused, SwiGLUMatchesReferenceIncludingLargeInputs) {
  for (int64_t n : {1, 7, 100, 4099}) {
    auto g = torch::randn({n}) * 4, u = torch::randn({n});
    if (n > 10) g.narrow(0, 0, 4).copy_(torch::tensor({-60.f, 60.f, -100.f, 100.f}));
    expect_same([](auto& in) { return fused::swiglu(in[0], in[1]); },
                [](auto& in) { return F::silu(in[0]) * in[1]; }, {g, u}, "swiglu n=" + std::to_string(n));
  }
  auto f = [](const auto& in) { return fused::swiglu(in[0], in[1]); };
  auto g = torch::randn({3, 50}), u = torch::randn({3, 50});
  expect_fd(f, {g, u}, 0, "swiglu dgate");
  expect_fd(f, {g, u}, 1, "swiglu dup");
}

TEST(Fused, RopeHeadsMatchesApplyRopeOnTransposedHeads) {
  for (auto [B, T, H, D] : std::vector<std::array<int64_t, 4>>{{1, 1, 1, 2}, {2, 5, 3, 8}, {3, 17, 4, 32}}) {
    auto [cos, sin] = model::rope_tables(T + 3, D, 10000.0, torch::TensorOptions().dtype(torch::kFloat32));
    auto x = torch::randn({B, T, H * D});
    const int64_t h = H, d = D, t = T;
    auto c = cos, s = sin;
    expect_same([&](auto& in) { return fused::rope_heads(in[0], h, c, s); },
                [&](auto& in) {
                  return model::apply_rope(in[0].view({B, t, h, d}).transpose(1, 2), c.narrow(0, 0, t), s.narrow(0, 0, t));
                },
                {x}, "rope T=" + std::to_string(T) + " D=" + std::to_string(D));
    expect_fd([&](const auto& in) { return fused::rope_heads(in[0], h, c, s); }, {x}, 0, "rope dx");
  }
}

TEST(Fused, CausalSoftmaxMatchesMaskedSoftmaxForStackedGroups) {
  for (int64_t T : {1, 5, 16, 33})
    for (int64_t G : {1, 2, 4}) {
      auto s = torch::randn({2, 3, G * T, T}) * 3;
      const double scale = 0.3;
      expect_same([&](auto& in) { return fused::causal_softmax(in[0], scale); },
                  [&](auto& in) { return ref_causal_softmax(in[0], scale); }, {s},
                  "softmax T=" + std::to_string(T) + " G=" + std::to_string(G));
    }
  auto s = torch::randn({2, 2 * 9, 9});
  expect_fd([](const auto& in) { return fused::causal_softmax(in[0], 0.5); }, {s}, 0, "softmax ds");
}

TEST(Fused, LinearCrossEntropyMatchesLogitsThenCrossEntropy) {
  for (auto [N, C, V] : std::vector<std::array<int64_t, 3>>{{1, 4, 3}, {5, 8, 17}, {300, 32, 1000}, {40, 16, 20000}}) {
    auto x = torch::randn({N, C}), w = torch::randn({V, C}) * 0.5;
    auto t = torch::randint(0, V, {N}, torch::kInt64);
    const std::string what = "lce N=" + std::to_string(N) + " V=" + std::to_string(V);
    expect_same([&](auto& in) { return fused::linear_cross_entropy(in[0], in[1], t); },
                [&](auto& in) { return F::cross_entropy(torch::matmul(in[0], in[1].t()), t); }, {x, w}, what);
  }
  auto x = torch::randn({6, 8}), w = torch::randn({11, 8});
  auto t = torch::randint(0, 11, {6}, torch::kInt64);
  auto f = [&](const auto& in) { return fused::linear_cross_entropy(in[0], in[1], t); };
  expect_fd(f, {x, w}, 0, "lce dx");
  expect_fd(f, {x, w}, 1, "lce dw");
  // Without gradients (evaluation) the loss is the same.
  torch::NoGradGuard no_grad;
  EXPECT_NEAR(fused::linear_cross_entropy(x, w, t).item<double>(),
              F::cross_entropy(torch::matmul(x, w.t()), t).item<double>(), 1e-5);
  EXPECT_THROW(fused::linear_cross_entropy(x, w, torch::full({6}, 11, torch::kInt64)), Error);
}

TEST(Fused, LinearGroupMatchesSeparateProductsInPlaceAndConcatenated) {
  for (bool adjacent : {true, false})
    for (int n : {2, 3}) {
      const int64_t C = 24, oa = 32, ob = 16, oc = 8;
      auto buf = torch::randn({(oa + ob + oc) * C + 7});  // + 7: the block ends before the buffer
      auto wa = buf.narrow(0, 0, oa * C).view({oa, C});
      auto wb = buf.narrow(0, oa * C, ob * C).view({ob, C});
      auto wc = buf.narrow(0, (oa + ob) * C, oc * C).view({oc, C});
      if (!adjacent) wb = wb.clone();
      auto x = torch::randn({3, 5, C});
      auto run = [&](bool group) {
        auto xl = x.clone().requires_grad_(true);
        std::vector<torch::Tensor> w = {wa.detach().requires_grad_(true), wb.detach().requires_grad_(true),
                                        wc.detach().requires_grad_(true)};
        std::vector<torch::Tensor> ys;
        if (group) ys = fused::linear_group(xl, w[0], w[1], n == 3 ? w[2] : torch::Tensor());
        else for (int i = 0; i < n; ++i) ys.push_back(torch::matmul(xl, w[i].t()));
        torch::Tensor loss = torch::zeros({});
        for (size_t i = 0; i < ys.size(); ++i) loss = loss + (ys[i] * ys[i]).sum() * (1.0 + static_cast<double>(i));
        loss.backward();
        std::vector<torch::Tensor> r = ys;
        r.push_back(xl.grad());
        for (int i = 0; i < n; ++i) r.push_back(w[i].grad());
        return r;
      };
      auto a = run(true), b = run(false);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_LT(rel_err(a[i], b[i]), kTol) << "adjacent=" << adjacent << " n=" << n << " item " << i;
    }
}

TEST(Fused, ModelLossAndGradientsMatchTheReferencePath) {
  for (bool tie : {false, true})
    for (int64_t kv : {1, 2, 4}) {
      auto c = model::LlamaConfig::preset("nano");
      c.vocab_size = 300;
      c.n_kv_heads = kv;
      c.tie_embeddings = tie;
      auto cr = c;
      cr.fused = false;
      model::Llama a(c), b(cr);
      a->init_weights(3);
      b->init_weights(3);
      auto x = torch::randint(0, 300, {3, 20}, torch::kInt64);
      auto la = a->loss(x, x.roll(1, 1)), lb = b->loss(x, x.roll(1, 1));
      la.backward();
      lb.backward();
      const std::string what = "kv=" + std::to_string(kv) + " tie=" + std::to_string(tie);
      EXPECT_NEAR(la.item<double>(), lb.item<double>(), 1e-5 * lb.item<double>()) << what;
      auto pa = a->hf_parameters(), pb = b->hf_parameters();
      for (size_t i = 0; i < pa.size(); ++i)
        EXPECT_LT(rel_err(pa[i].second.grad(), pb[i].second.grad()), 1e-4) << what << " " << pa[i].first;
      // forward() (logits) is unchanged by the flag.
      torch::NoGradGuard ng;
      EXPECT_LT(rel_err(a->forward(x), b->forward(x)), kTol) << what;
    }
}

TEST(Fused, AdamWFusedStepMatchesReferenceOps) {
  const int64_t n = 100003, decay = 70001;
  torch::manual_seed(2);
  auto p0 = torch::randn({n});
  optim::AdamWOptions o;
  o.weight_decay = 0.1;
  auto pf = p0.clone(), pr = p0.clone();
  auto mf = torch::zeros({n}), vf = torch::zeros({n}), mr = torch::zeros({n}), vr = torch::zeros({n});
  for (int k = 1; k <= 30; ++k) {
    auto g = torch::randn({n}) * (k % 4 == 0 ? 1e-4 : 1.0);
    const double lr = 1e-3 * (1 + k % 3);
    optim::fused_adamw_step(pf, g, mf, vf, decay, k, lr, o);
    // The reference operations (AdamW::update with fused = false).
    pr.narrow(0, 0, decay).mul_(1.0 - lr * o.weight_decay);
    mr.mul_(o.beta1).add_(g, 1.0 - o.beta1);
    vr.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
    const double bc1 = 1.0 - std::pow(o.beta1, k), bc2 = 1.0 - std::pow(o.beta2, k);
    pr.addcdiv_(mr, (vr.sqrt() / std::sqrt(bc2)).add_(o.eps), -lr / bc1);
  }
  EXPECT_LT((pf - pr).abs().max().item<double>(), 1e-6);
  EXPECT_LT(rel_err(vf, vr), 1e-6);
  EXPECT_GT((pf - p0).abs().max().item<double>(), 1e-2);  // it moved
  // Decay reaches exactly the prefix: with zero gradients only decayed entries change.
  auto p = torch::ones({10}), z = torch::zeros({10}), m = torch::zeros({10}), v = torch::zeros({10});
  optim::fused_adamw_step(p, z, m, v, 4, 1, 0.5, o);
  EXPECT_FLOAT_EQ(p[3].item<float>(), 0.95f);
  EXPECT_FLOAT_EQ(p[4].item<float>(), 1.0f);
  EXPECT_THROW(optim::fused_adamw_step(p, z.to(torch::kFloat64), m, v, 4, 1, 0.5, o), Error);
}

// The acceptance check of the fast path: 50 steps on real data, fused model and fused AdamW
// against the reference model and reference AdamW, losses within 1e-4 relative at every step.
TEST(Fused, FiftyTrainingStepsFollowTheReferenceLossCurve) {
  const auto dir = test_util::temp_root("fused_curve");
  const auto ds = data::Dataset::open(test_util::make_byte_dataset(dir));
  auto run = [&](bool fast) {
    auto c = model::LlamaConfig::preset("nano");
    c.vocab_size = ds.vocab_size;
    c.fused = fast;
    model::Llama m(c);
    m->init_weights(1);
    FlatParams flat(m->hf_parameters());
    optim::AdamWOptions o;
    o.fused = fast;
    optim::AdamW opt(flat, o);
    data::WindowSampler sampler(ds.train, 4, 32, 9);
    std::vector<double> losses;
    for (int k = 0; k < 50; ++k) {
      auto b = sampler.next();
      flat.zero_grad();
      auto loss = m->loss(b.inputs, b.targets);
      loss.backward();
      optim::clip_grad_norm(flat.grad(), 1.0);
      opt.step(3e-3);
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  const auto fast = run(true), ref = run(false);
  double worst = 0;
  for (size_t k = 0; k < ref.size(); ++k) worst = std::max(worst, std::abs(fast[k] - ref[k]) / ref[k]);
  EXPECT_LT(worst, 1e-4);
  EXPECT_LT(ref.back(), ref.front() - 0.5);  // it learned: the comparison is not of flat curves
  std::filesystem::remove_all(dir);
}

TEST(Fused, NativeBf16DetectionAgreesWithProcCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line) && line.rfind("flags", 0) != 0) {
  }
  if (line.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line";
  line += " ";
  const bool listed = line.find(" avx512_bf16 ") != std::string::npos || line.find(" amx_bf16 ") != std::string::npos;
  EXPECT_EQ(fused::cpu_has_native_bf16(), listed) << line;
}
