#include "gasloc/optim/adamw.hpp"

#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <cmath>

#include "gasloc/core/error.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GASLOC_VEC __attribute__((target_clones("avx2", "default")))
#else
#define GASLOC_VEC
#endif

namespace gasloc::optim {

namespace {
struct AdamScalars {
  float decay_mul, b1, one_minus_b1, b2, one_minus_b2, sqrt_bc2, eps, step;  // step = -lr / bc1
};

GASLOC_VEC void adamw_span(float* p, const float* g, float* m, float* v, int64_t b, int64_t e, int64_t decay_end,
                           AdamScalars s) {
  for (int64_t i = b; i < e; ++i) {
    // Reference order: p *= 1 - lr wd; m = m b1 + (1 - b1) g; v = v b2 + (1 - b2) g g;
    // p += (-lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps).
    const float pi = i < decay_end ? p[i] * s.decay_mul : p[i];
    const float mi = m[i] * s.b1 + s.one_minus_b1 * g[i];
    const float vi = v[i] * s.b2 + s.one_minus_b2 * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + s.step * mi / (std::sqrt(vi) / s.sqrt_bc2 + s.eps);
  }
}
}  // namespace

void fused_adamw_step(torch::Tensor& p, const torch::Tensor& g, torch::Tensor& m, torch::Tensor& v, int64_t decay_numel,
                      int64_t k, double lr, const AdamWOptions& o) {
  for (const torch::Tensor* t : std::initializer_list<const torch::Tensor*>{&p, &g, &m, &v})
    if (t->scalar_type() != torch::kFloat32 || !t->is_contiguous() || t->numel() != p.numel())
      throw Error("fused AdamW needs contiguous fp32 buffers of one size", "use optim fused = false for this buffer");
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(k));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(k));
  const AdamScalars s{static_cast<float>(1.0 - lr * o.weight_decay), static_cast<float>(o.beta1),
                      static_cast<float>(1.0 - o.beta1),                static_cast<float>(o.beta2),
                      static_cast<float>(1.0 - o.beta2),                static_cast<float>(std::sqrt(bc2)),
                      static_cast<float>(o.eps),                        static_cast<float>(-lr / bc1)};
  const int64_t decay_end = o.weight_decay != 0.0 ? decay_numel : 0;
  float *pp = p.data_ptr<float>(), *mp = m.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  at::parallel_for(0, p.numel(), 1 << 16, [&](int64_t b, int64_t e) { adamw_span(pp, gp, mp, vp, b, e, decay_end, s); });
}

AdamMoments::AdamMoments(const torch::Tensor& like, const AdamWOptions& o)
    : m(torch::zeros_like(like)), v(torch::zeros_like(like)), o_(o) {}

void AdamMoments::update(const torch::Tensor& g) {
  m.mul_(o_.beta1).add_(g, 1.0 - o_.beta1);
  v.mul_(o_.beta2).addcmul_(g, g, 1.0 - o_.beta2);
}

torch::Tensor AdamMoments::direction(int64_t k) const {
  const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(k));
  const double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(k));
  auto d = (v.sqrt() / std::sqrt(bc2)).add_(o_.eps);  // the denominator, then d in place
  return d.reciprocal_().mul_(m).div_(bc1);
}

void AdamMoments::apply(torch::Tensor& y, int64_t k, double lr) const {
  const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(k));
  const double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(k));
  // Same operation order as torch.optim.AdamW's single-tensor path.
  auto denom = (v.sqrt() / std::sqrt(bc2)).add_(o_.eps);
  y.addcdiv_(m, denom, -lr / bc1);
}

AdamW::AdamW(FlatParams& params, AdamWOptions opts) : Optimizer(params), opts_(opts), moments_(params.data(), opts) {}

void AdamW::update(double lr) {
  auto& p = params_.data();
  if (opts_.fused && p.scalar_type() == torch::kFloat32 && p.device().is_cpu()) {
    fused_adamw_step(p, params_.grad(), moments_.m, moments_.v, params_.decay_numel(), step_, lr, opts_);
    return;
  }
  if (opts_.weight_decay != 0.0 && params_.decay_numel() > 0)
    p.narrow(0, 0, params_.decay_numel()).mul_(1.0 - lr * opts_.weight_decay);
  moments_.update(params_.grad());
  moments_.apply(p, step_, lr);
}

}  // namespace gasloc::optim
