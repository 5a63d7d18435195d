// Model tests: causality, rotary embeddings, GQA, gradients (finite differences in float64),
// the ability to fit a batch, presets, the flat parameter buffer, and BLAS thread control.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <dlfcn.h>

#include <array>
#include <cmath>

#include "gasloc/core/blas_threads.hpp"
#include "gasloc/core/error.hpp"
#include "gasloc/core/flat_params.hpp"
#include "gasloc/model/llama.hpp"

using namespace gasloc;
using model::Llama;
using model::LlamaConfig;

namespace {
LlamaConfig nano(int64_t vocab = 64) {
  auto c = LlamaConfig::preset("nano");
  c.vocab_size = vocab;
  return c;
}
}  // namespace

TEST(Model, CausalMaskFutureTokensNeverChangePastLogits) {
  torch::manual_seed(0);
  Llama m(nano());
  torch::NoGradGuard ng;
  auto tokens = torch::randint(0, 64, {2, 24}, torch::kInt64);
  auto base = m->forward(tokens);
  for (int64_t t : {0, 5, 17}) {
    for (int64_t k : {1, 3}) {
      if (t + k >= 24) continue;
      auto changed = tokens.clone();
      changed.index_put_({torch::indexing::Slice(), t + k}, (tokens.index({torch::indexing::Slice(), t + k}) + 7) % 64);
      auto out = m->forward(changed);
      auto past = torch::indexing::Slice(0, t + 1);
      // Same inputs at positions <= t: identical up to float rounding of differently shaped work.
      EXPECT_TRUE(torch::allclose(out.index({torch::indexing::Slice(), past}), base.index({torch::indexing::Slice(), past}), 0, 1e-5))
          << "t=" << t << " k=" << k;
      // The changed position itself must see the change (the test can fail).
      EXPECT_GT((out.index({torch::indexing::Slice(), t + k}) - base.index({torch::indexing::Slice(), t + k})).abs().max().item<double>(), 1e-4);
    }
  }
}

TEST(Model, RotaryMatchesHandComputedRotation) {
  // D = 4, theta = 10000: inv_freq = [1, 1/100]; rotate-half pairs (x0, x2) and (x1, x3).
  const double theta = 10000.0;
  auto [cos, sin] = model::rope_tables(5, 4, theta, torch::TensorOptions().dtype(torch::kFloat64));
  auto x = torch::tensor({0.3, -1.2, 0.7, 2.0}, torch::kFloat64).view({1, 1, 1, 4}).expand({1, 1, 5, 4}).contiguous();
  auto y = model::apply_rope(x, cos, sin);
  for (int p = 0; p < 5; ++p) {
    const double a = p * 1.0, b = p * 0.01;
    const double e0 = 0.3 * std::cos(a) - 0.7 * std::sin(a);
    const double e2 = 0.7 * std::cos(a) + 0.3 * std::sin(a);
    const double e1 = -1.2 * std::cos(b) - 2.0 * std::sin(b);
    const double e3 = 2.0 * std::cos(b) + -1.2 * std::sin(b);
    auto row = y[0][0][p];
    EXPECT_NEAR(row[0].item<double>(), e0, 1e-12);
    EXPECT_NEAR(row[1].item<double>(), e1, 1e-12);
    EXPECT_NEAR(row[2].item<double>(), e2, 1e-12);
    EXPECT_NEAR(row[3].item<double>(), e3, 1e-12);
  }
  // Rotation preserves the norm of each pair.
  EXPECT_NEAR(y.pow(2).sum(-1)[0][0][3].item<double>(), x.pow(2).sum(-1)[0][0][3].item<double>(), 1e-12);
}

namespace {
// Reference multi-head causal attention written out head by head.
torch::Tensor reference_mha(model::AttentionImpl& a, const torch::Tensor& x, int64_t H, int64_t K, const torch::Tensor& cos,
                            const torch::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1), D = a.q_proj->weight.size(0) / H;
  auto q = a.q_proj(x).view({B, T, H, D}).transpose(1, 2);
  auto k = a.k_proj(x).view({B, T, K, D}).transpose(1, 2);
  auto v = a.v_proj(x).view({B, T, K, D}).transpose(1, 2);
  q = model::apply_rope(q, cos, sin);
  k = model::apply_rope(k, cos, sin);
  std::vector<torch::Tensor> heads;
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / (H / K);
    auto s = torch::matmul(q.select(1, h), k.select(1, g).transpose(-2, -1)) / std::sqrt(double(D));
    auto mask = torch::ones({T, T}, torch::kBool).triu(1);
    s = s.masked_fill(mask, -INFINITY);
    heads.push_back(torch::matmul(torch::softmax(s, -1), v.select(1, g)));
  }
  auto y = torch::stack(heads, 1).transpose(1, 2).reshape({B, T, H * D});
  return a.o_proj(y);
}
}  // namespace

TEST(Model, AttentionEqualsReferenceForMHAAndGQA) {
  torch::manual_seed(1);
  for (int64_t K : {4, 2, 1}) {
    auto c = nano();
    c.n_kv_heads = K;
    model::Attention a(c);
    torch::NoGradGuard ng;
    auto x = torch::randn({2, 9, c.dim});
    auto [cos, sin] = model::rope_tables(9, c.head_dim(), c.rope_theta, x.options());
    auto got = a->forward(x, cos, sin);
    auto want = reference_mha(*a, x, c.n_heads, K, cos, sin);
    EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-6)) << "n_kv_heads=" << K << " max diff "
                                                         << (got - want).abs().max().item<double>();
  }
}

TEST(Model, GQAEqualsMHAWithSharedKeyValueWeights) {
  // GQA with K groups == MHA whose per-head k/v weights are copies of their group's.
  torch::manual_seed(2);
  auto cg = nano();
  cg.n_kv_heads = 2;
  auto cm = cg;
  cm.n_kv_heads = cm.n_heads;
  model::Attention g(cg), m(cm);
  torch::NoGradGuard ng;
  const int64_t D = cg.head_dim(), rep = cg.n_heads / cg.n_kv_heads;
  m->q_proj->weight.copy_(g->q_proj->weight);
  m->o_proj->weight.copy_(g->o_proj->weight);
  m->k_proj->weight.copy_(g->k_proj->weight.view({cg.n_kv_heads, D, cg.dim}).repeat_interleave(rep, 0).reshape({-1, cg.dim}));
  m->v_proj->weight.copy_(g->v_proj->weight.view({cg.n_kv_heads, D, cg.dim}).repeat_interleave(rep, 0).reshape({-1, cg.dim}));
  auto x = torch::randn({3, 7, cg.dim});
  auto [cos, sin] = model::rope_tables(7, D, cg.rope_theta, x.options());
  EXPECT_TRUE(torch::allclose(g->forward(x, cos, sin), m->forward(x, cos, sin), 1e-5, 1e-6));
}

TEST(Model, FiniteDifferenceGradientsFloat64) {
  torch::manual_seed(3);
  auto c = nano(32);
  c.n_layers = 1;
  Llama m(c);
  m->to(torch::kFloat64);
  // Larger init than Llama's so that every path contributes visibly to the loss.
  {
    torch::NoGradGuard ng;
    for (auto& p : m->parameters())
      if (p.dim() >= 2) p.normal_(0, 0.2);
      else p.uniform_(0.5, 1.5);
  }
  auto x = torch::randint(0, 32, {2, 6}, torch::kInt64);
  auto y = torch::randint(0, 32, {2, 6}, torch::kInt64);
  m->zero_grad();
  m->loss(x, y).backward();
  torch::NoGradGuard ng;
  int checked = 0;
  double worst = 0;
  for (auto& [name, p] : m->hf_parameters()) {
    auto flat = p.view({-1});
    auto grad = p.grad().view({-1});
    for (int64_t idx : {int64_t(0), flat.numel() / 3, flat.numel() - 1}) {
      const double orig = flat[idx].item<double>();
      const double h = 1e-6;
      flat[idx] = orig + h;
      const double lp = m->loss(x, y).item<double>();
      flat[idx] = orig - h;
      const double lm = m->loss(x, y).item<double>();
      flat[idx] = orig;
      const double fd = (lp - lm) / (2 * h);
      const double an = grad[idx].item<double>();
      const double err = std::abs(fd - an) / std::max(1e-6, std::abs(fd) + std::abs(an));
      worst = std::max(worst, err);
      // Central differences in float64 are accurate to ~1e-8 relative here; 1e-5 leaves margin.
      EXPECT_LT(err, 1e-5) << name << "[" << idx << "] fd=" << fd << " analytic=" << an;
      ++checked;
    }
  }
  EXPECT_GE(checked, 27);
}

TEST(Model, NanoOverfitsOneBatch) {
  torch::manual_seed(4);
  Llama m(nano(64));
  m->init_weights(4);
  FlatParams flat(m->hf_parameters());
  torch::optim::AdamW opt(std::vector<torch::Tensor>{flat.data()}, torch::optim::AdamWOptions(1e-2).weight_decay(0));
  // Reuse torch's AdamW over the flat buffer: its grad is the flat grad.
  flat.data().mutable_grad() = flat.grad();
  auto x = torch::randint(0, 64, {4, 32}, torch::kInt64);
  auto y = torch::randint(0, 64, {4, 32}, torch::kInt64);
  double loss = 0;
  for (int i = 0; i < 300; ++i) {
    flat.zero_grad();
    auto l = m->loss(x, y);
    l.backward();
    opt.step();
    loss = l.item<double>();
  }
  EXPECT_LT(loss, 0.1);
}

TEST(Model, PresetsHaveTheDocumentedSizes) {
  // micro: the research preset (dim 128, 4 layers, 4 heads, a 1024-token vocabulary), about 1M.
  EXPECT_NEAR(LlamaConfig::preset("micro").num_params() / 1e6, 1.0, 0.05);
  EXPECT_EQ(LlamaConfig::preset("micro").vocab_size, 1024);
  EXPECT_EQ(LlamaConfig::preset("micro").dim, 128);
  EXPECT_EQ(LlamaConfig::preset("micro").n_heads, 4);
  EXPECT_GE(LlamaConfig::preset("tiny").num_params(), 5'000'000);
  EXPECT_LE(LlamaConfig::preset("tiny").num_params(), 10'000'000);
  EXPECT_GE(LlamaConfig::preset("small").num_params(), 25'000'000);
  EXPECT_LE(LlamaConfig::preset("small").num_params(), 40'000'000);
  EXPECT_NEAR(LlamaConfig::preset("134m").num_params() / 1e6, 134, 3);
  EXPECT_NEAR(LlamaConfig::preset("160m").num_params() / 1e6, 160, 5);
  EXPECT_NEAR(LlamaConfig::preset("551m").num_params() / 1e6, 551, 15);
  EXPECT_NEAR(LlamaConfig::preset("1b").num_params() / 1e9, 1.24, 0.05);
  EXPECT_THROW(LlamaConfig::preset("huge"), ConfigError);
  // The count formula agrees with a built model, tied and untied.
  for (bool tie : {false, true}) {
    auto c = nano();
    c.tie_embeddings = tie;
    Llama m(c);
    int64_t n = 0;
    for (auto& p : m->parameters()) n += p.numel();
    EXPECT_EQ(n, c.num_params()) << "tie=" << tie;
  }
}

TEST(Model, LlamaHiddenSizeRounding) {
  LlamaConfig c;
  c.dim = 4096;
  c.multiple_of = 256;
  c.ffn_dim_multiplier = 1.3;
  EXPECT_EQ(c.ffn_hidden(), 14336);  // Llama 3 8B
  c.dim = 2048;
  c.ffn_dim_multiplier = 1.5;
  EXPECT_EQ(c.ffn_hidden(), 8192);  // Llama 3.2 1B
}

TEST(Model, BadShapesAreConfigErrors) {
  auto c = nano();
  c.n_kv_heads = 3;
  EXPECT_THROW(c.validate(), ConfigError);
  c = nano();
  c.n_heads = 5;
  EXPECT_THROW(c.validate(), ConfigError);
}

TEST(FlatParams, ParametersAreViewsAndDecayedFirst) {
  auto c = nano();
  c.tie_embeddings = true;
  Llama m(c);
  FlatParams flat(m->hf_parameters());
  EXPECT_EQ(flat.numel(), c.num_params());
  // Writing the flat buffer changes the module's parameters (views, not copies).
  flat.data().fill_(0.25);
  for (auto& p : m->parameters()) EXPECT_EQ(p.min().item<float>(), 0.25f);
  // Decayed (matrix) segments form the prefix.
  bool seen_vector = false;
  for (const auto& s : flat.segments()) {
    if (!s.decay) seen_vector = true;
    else EXPECT_FALSE(seen_vector) << s.name;
  }
  EXPECT_EQ(flat.decay_numel(), c.num_params() - (2 * c.n_layers + 1) * c.dim);
  // Gradients accumulate into the flat grad buffer.
  auto x = torch::randint(0, c.vocab_size, {1, 8}, torch::kInt64);
  flat.data().normal_(0, 0.02);
  m->loss(x, x).backward();
  EXPECT_GT(flat.grad().abs().sum().item<double>(), 0);
  for (auto& p : m->parameters()) EXPECT_EQ(p.grad().data_ptr<float>() >= flat.grad().data_ptr<float>(), true);
}

// The in-process cluster runs its workers with one BLAS thread each (core/blas_threads.hpp). That
// may change the last bits of a product (OpenBLAS picks other kernels for another split) but
// nothing more, and at a fixed count a product is reproducible bit for bit. Shapes are the model's
// (forward and the backward product with a transpose) and odd ones, large enough to be threaded.
TEST(BlasThreads, ProductsAgreeToRoundingAcrossCountsAndRepeatExactlyAtOne) {
  torch::manual_seed(3);
  const std::vector<std::array<int64_t, 3>> shapes = {{64, 256, 768}, {128, 256, 8192}, {37, 129, 515}, {512, 512, 512}};
  for (const auto& [m, k, n] : shapes) {
    const auto a = torch::randn({m, k}), b = torch::randn({k, n}), g = torch::randn({m, n});
    const auto reference = a.to(torch::kFloat64).matmul(b.to(torch::kFloat64));
    const auto reference_ga = g.to(torch::kFloat64).matmul(b.t().to(torch::kFloat64));
    torch::Tensor one, one_ga, again, again_ga, many, many_ga;
    {
      const BlasThreads blas(1);
      if (!blas.active()) GTEST_SKIP() << "the BLAS LibTorch loaded has no thread control";
      one = a.matmul(b);
      one_ga = g.matmul(b.t());
      again = a.matmul(b);
      again_ga = g.matmul(b.t());
    }
    {
      const BlasThreads blas(4);
      many = a.matmul(b);
      many_ga = g.matmul(b.t());
    }
    const std::string shape = std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
    EXPECT_TRUE(torch::equal(one, again)) << shape;
    EXPECT_TRUE(torch::equal(one_ga, again_ga)) << shape;
    // fp32 sums of k products of unit normals: error grows like sqrt(k) * 2^-24 per entry.
    const double tol = 1e-5 * std::sqrt(static_cast<double>(k)) * 4;
    for (const auto& [x, ref] : {std::pair{one, reference}, {many, reference}, {one_ga, reference_ga}, {many_ga, reference_ga}})
      EXPECT_LT((x.to(torch::kFloat64) - ref).abs().max().item<double>(), tol) << shape;
  }
}

TEST(BlasThreads, RestoresThePreviousCount) {
  using Get = int (*)();
  auto* get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (get == nullptr) GTEST_SKIP() << "not OpenBLAS";
  const int before = get();
  {
    const BlasThreads blas(1);
    EXPECT_TRUE(blas.active());
    EXPECT_EQ(get(), 1);
    {
      const BlasThreads nested(3);
      EXPECT_EQ(get(), 3);
    }
    EXPECT_EQ(get(), 1);
  }
  EXPECT_EQ(get(), before);
  const BlasThreads none(0);  // 0 = leave it alone
  EXPECT_FALSE(none.active());
  EXPECT_EQ(get(), before);
}
