// Flat AdamW against LibTorch's own torch::optim::AdamW (the reference), schedules, clipping.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "gasloc/core/flat_params.hpp"
#include "gasloc/model/llama.hpp"
#include "gasloc/optim/adamw.hpp"
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
