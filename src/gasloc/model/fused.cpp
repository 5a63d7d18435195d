#include "gasloc/model/fused.hpp"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <spdlog/spdlog.h>

#include <bit>
#include <cmath>
#include <vector>

#include "gasloc/core/error.hpp"

// The loops below are written so that GCC vectorizes them (no calls, no branches in the inner
// loops); target_clones builds an AVX2+FMA version next to the baseline one and picks at load
// time, so the binary still runs on any x86-64.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GASLOC_VEC __attribute__((target_clones("avx2", "default")))
#else
#define GASLOC_VEC
#endif

namespace gasloc::model::fused {
using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

namespace {

inline float exp_inline(float x) {
  // exp(x) = 2^n * exp(r), n = round(x / ln 2), |r| <= ln(2)/2, Cephes' degree-6 polynomial.
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  float fx = x * 1.44269504088896341f;
  // Round to nearest by the 1.5 * 2^23 trick (no branch, no call): the low mantissa bits hold n.
  const int32_t n = std::bit_cast<int32_t>(fx + 12582912.0f) - 0x4B400000;
  const float nf = static_cast<float>(n);
  float r = x - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  return y * std::bit_cast<float>((n + 127) << 23);
}

// Rows per parallel task so that each task has some 16K elements of work.
int64_t grain_rows(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols)); }

// Float reductions vectorize only as explicit partial sums (the compiler may not reorder them).
inline float lanes_sum(const float (&a)[8]) { return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])); }

// ---- RMSNorm ------------------------------------------------------------------------------
GASLOC_VEC void rms_fwd_rows(const float* x, const float* w, float* y, float* rstd, int64_t r0, int64_t r1, int64_t C,
                             float eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // eight partial sums, so the reduction vectorizes
    int64_t c = 0;
    for (; c + 8 <= C; c += 8)
      for (int j = 0; j < 8; ++j) acc[j] += xr[c + j] * xr[c + j];
    float ss = lanes_sum(acc);
    for (; c < C; ++c) ss += xr[c] * xr[c];
    const float rs = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    rstd[r] = rs;
    for (c = 0; c < C; ++c) yr[c] = w[c] * (xr[c] * rs);
  }
}

GASLOC_VEC void rms_bwd_rows(const float* g, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                             int64_t r0, int64_t r1, int64_t C) {
  const float invC = 1.0f / static_cast<float>(C);
  for (int64_t r = r0; r < r1; ++r) {
    const float* gr = g + r * C;
    const float* xr = x + r * C;
    float* dxr = dx + r * C;
    const float rs = rstd[r];
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t c = 0;
    for (; c + 8 <= C; c += 8)
      for (int j = 0; j < 8; ++j) acc[j] += gr[c + j] * w[c + j] * xr[c + j];
    float dot = lanes_sum(acc);
    for (; c < C; ++c) dot += gr[c] * w[c] * xr[c];
    // y = w * x * rs, rs = (mean x^2 + eps)^-1/2: dx = rs * (g w - x rs^2 mean(g w x)).
    const float k = dot * invC * rs * rs;
    for (c = 0; c < C; ++c) {
      dxr[c] = rs * (gr[c] * w[c] - xr[c] * k);
      dw[c] += gr[c] * (xr[c] * rs);
    }
  }
}

struct RMSNormFn : torch::autograd::Function<RMSNormFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x_in, const Tensor& w, double eps) {
    const Tensor x = x_in.contiguous();
    const int64_t C = x.size(-1), R = x.numel() / C;
    Tensor y = torch::empty_like(x), rstd = torch::empty({R}, x.options());
    const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
    float *yp = y.data_ptr<float>(), *rp = rstd.data_ptr<float>();
    at::parallel_for(0, R, grain_rows(C), [&](int64_t b, int64_t e) {
      rms_fwd_rows(xp, wp, yp, rp, b, e, C, static_cast<float>(eps));
    });
    ctx->save_for_backward({x, w, rstd});
    return y;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &w = saved[1], &rstd = saved[2];
    const Tensor g = grads[0].contiguous();
    const int64_t C = x.size(-1), R = x.numel() / C;
    Tensor dx = torch::empty_like(x);
    // One partial weight gradient per thread, summed after: no races, deterministic for a
    // given thread count.
    Tensor dw_parts = torch::zeros({at::get_num_threads(), C}, x.options());
    const float *gp = g.data_ptr<float>(), *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>(), *rp = rstd.data_ptr<float>();
    float *dxp = dx.data_ptr<float>(), *dwp = dw_parts.data_ptr<float>();
    at::parallel_for(0, R, grain_rows(C), [&](int64_t b, int64_t e) {
      rms_bwd_rows(gp, xp, wp, rp, dxp, dwp + at::get_thread_num() * C, b, e, C);
    });
    return {dx, dw_parts.sum(0), Tensor()};
  }
};

// ---- SwiGLU -------------------------------------------------------------------------------
GASLOC_VEC void swiglu_fwd_span(const float* g, const float* u, float* y, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) y[i] = g[i] / (1.0f + exp_inline(-g[i])) * u[i];
}

GASLOC_VEC void swiglu_bwd_span(const float* dy, const float* g, const float* u, float* dg, float* du, int64_t b,
                                int64_t e) {
  for (int64_t i = b; i < e; ++i) {
    const float s = 1.0f / (1.0f + exp_inline(-g[i]));
    const float silu = g[i] * s;
    du[i] = dy[i] * silu;
    // d silu / dg = s (1 + g (1 - s))
    dg[i] = dy[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
  }
}

struct SwiGLUFn : torch::autograd::Function<SwiGLUFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& g_in, const Tensor& u_in) {
    const Tensor g = g_in.contiguous(), u = u_in.contiguous();
    Tensor y = torch::empty_like(g);
    const float *gp = g.data_ptr<float>(), *up = u.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, g.numel(), 16384, [&](int64_t b, int64_t e) { swiglu_fwd_span(gp, up, yp, b, e); });
    ctx->save_for_backward({g, u});
    return y;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &g = saved[0], &u = saved[1];
    const Tensor dy = grads[0].contiguous();
    Tensor dg = torch::empty_like(g), du = torch::empty_like(u);
    const float *dyp = dy.data_ptr<float>(), *gp = g.data_ptr<float>(), *up = u.data_ptr<float>();
    float *dgp = dg.data_ptr<float>(), *dup = du.data_ptr<float>();
    at::parallel_for(0, g.numel(), 16384, [&](int64_t b, int64_t e) { swiglu_bwd_span(dyp, gp, up, dgp, dup, b, e); });
    return {dg, du};
  }
};

// ---- RoPE with the head split -------------------------------------------------------------
// Rows are (b, t) pairs; in holds [B, T, H, D], out [B, H, T, D]. `sign` = -1 applies the
// inverse rotation, which is the backward pass (the rotation is orthogonal).
GASLOC_VEC void rope_rows(const float* in, float* out, const float* cos, const float* sin, int64_t r0, int64_t r1,
                          int64_t T, int64_t H, int64_t D, bool to_heads, float sign) {
  const int64_t half = D / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t b = r / T, t = r % T;
    const float* c = cos + t * D;
    const float* s = sin + t * D;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t bthd = ((b * T + t) * H + h) * D, bhtd = ((b * H + h) * T + t) * D;
      const float* x = in + (to_heads ? bthd : bhtd);
      float* y = out + (to_heads ? bhtd : bthd);
      // Forward: y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2 (HF: x * cos + rotate_half(x) * sin).
      // Backward (transpose): dx1 = g1 c1 + g2 s2, dx2 = g2 c2 - g1 s1.
      if (sign > 0) {
        for (int64_t i = 0; i < half; ++i) {
          y[i] = x[i] * c[i] + (-x[i + half]) * s[i];
          y[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];
        }
      } else {
        for (int64_t i = 0; i < half; ++i) {
          y[i] = x[i] * c[i] + x[i + half] * s[i + half];
          y[i + half] = x[i + half] * c[i + half] - x[i] * s[i];
        }
      }
    }
  }
}

struct RopeFn : torch::autograd::Function<RopeFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x_in, int64_t H, const Tensor& cos_in, const Tensor& sin_in) {
    const Tensor x = x_in.contiguous();
    const int64_t B = x.size(0), T = x.size(1), D = x.size(2) / H;
    const Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
    Tensor y = torch::empty({B, H, T, D}, x.options());
    const float *xp = x.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, B * T, grain_rows(H * D), [&](int64_t b, int64_t e) {
      rope_rows(xp, yp, cp, sp, b, e, T, H, D, true, 1.0f);
    });
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["H"] = H;
    return y;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t H = ctx->saved_data["H"].toInt();
    const Tensor g = grads[0].contiguous();
    const int64_t B = g.size(0), T = g.size(2), D = g.size(3);
    Tensor dx = torch::empty({B, T, H * D}, g.options());
    const float *gp = g.data_ptr<float>(), *cp = saved[0].data_ptr<float>(), *sp = saved[1].data_ptr<float>();
    float* dxp = dx.data_ptr<float>();
    at::parallel_for(0, B * T, grain_rows(H * D), [&](int64_t b, int64_t e) {
      rope_rows(gp, dxp, cp, sp, b, e, T, H, D, false, -1.0f);
    });
    return {dx, Tensor(), Tensor(), Tensor()};
  }
};

// ---- Causal softmax -----------------------------------------------------------------------
GASLOC_VEC void softmax_rows(const float* s, float* p, int64_t r0, int64_t r1, int64_t R, int64_t T, float scale) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = (r % R) % T + 1;  // keys 0..q are visible to query position q
    const int64_t n8 = n / 8 * 8;
    const float* sr = s + r * T;
    float* pr = p + r * T;
    float mx8[8];
    for (int j = 0; j < 8; ++j) mx8[j] = sr[0];
    for (int64_t j = 0; j < n8; j += 8)
      for (int l = 0; l < 8; ++l) mx8[l] = mx8[l] > sr[j + l] ? mx8[l] : sr[j + l];
    float mx = mx8[0];
    for (int l = 1; l < 8; ++l) mx = mx > mx8[l] ? mx : mx8[l];
    for (int64_t j = n8; j < n; ++j) mx = mx > sr[j] ? mx : sr[j];
    mx *= scale;  // scale > 0, so the largest scaled score is the scaled largest score
    for (int64_t j = 0; j < n; ++j) pr[j] = exp_inline(sr[j] * scale - mx);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j < n8; j += 8)
      for (int l = 0; l < 8; ++l) acc[l] += pr[j + l];
    float sum = lanes_sum(acc);
    for (int64_t j = n8; j < n; ++j) sum += pr[j];
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; ++j) pr[j] *= inv;
    for (int64_t j = n; j < T; ++j) pr[j] = 0.0f;
  }
}

GASLOC_VEC void softmax_bwd_rows(const float* dp, const float* p, float* ds, int64_t r0, int64_t r1, int64_t R,
                                 int64_t T, float scale) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = (r % R) % T + 1;
    const int64_t n8 = n / 8 * 8;
    const float* dpr = dp + r * T;
    const float* pr = p + r * T;
    float* dsr = ds + r * T;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j < n8; j += 8)
      for (int l = 0; l < 8; ++l) acc[l] += dpr[j + l] * pr[j + l];
    float dot = lanes_sum(acc);
    for (int64_t j = n8; j < n; ++j) dot += dpr[j] * pr[j];
    for (int64_t j = 0; j < n; ++j) dsr[j] = scale * pr[j] * (dpr[j] - dot);
    for (int64_t j = n; j < T; ++j) dsr[j] = 0.0f;
  }
}

struct CausalSoftmaxFn : torch::autograd::Function<CausalSoftmaxFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& s_in, double scale) {
    const Tensor s = s_in.contiguous();
    const int64_t T = s.size(-1), R = s.size(-2), rows = s.numel() / T;
    Tensor p = torch::empty_like(s);
    const float* sp = s.data_ptr<float>();
    float* pp = p.data_ptr<float>();
    at::parallel_for(0, rows, grain_rows(T), [&](int64_t b, int64_t e) {
      softmax_rows(sp, pp, b, e, R, T, static_cast<float>(scale));
    });
    ctx->save_for_backward({p});
    ctx->saved_data["scale"] = scale;
    return p;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const Tensor p = ctx->get_saved_variables()[0];
    const float scale = static_cast<float>(ctx->saved_data["scale"].toDouble());
    const Tensor dp = grads[0].contiguous();
    const int64_t T = p.size(-1), R = p.size(-2), rows = p.numel() / T;
    Tensor ds = torch::empty_like(p);
    const float *dpp = dp.data_ptr<float>(), *pp = p.data_ptr<float>();
    float* dsp = ds.data_ptr<float>();
    at::parallel_for(0, rows, grain_rows(T), [&](int64_t b, int64_t e) { softmax_bwd_rows(dpp, pp, dsp, b, e, R, T, scale); });
    return {ds, Tensor()};
  }
};

// ---- LM head + cross-entropy --------------------------------------------------------------
// Per-thread scratch for one step's logit gradients [N, V]: reused across steps, because an
// allocation this large would be mapped fresh (and zeroed by the kernel) on every step.
Tensor& logits_workspace(int64_t numel, const torch::TensorOptions& opts) {
  thread_local Tensor ws;
  if (!ws.defined() || ws.numel() < numel) ws = torch::empty({numel}, opts);
  return ws;
}

struct LinearCrossEntropyFn : torch::autograd::Function<LinearCrossEntropyFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x_in, const Tensor& w, const Tensor& targets_in,
                        bool need_grad) {
    const Tensor x = x_in.contiguous(), targets = targets_in.contiguous();
    const int64_t N = x.size(0), V = w.size(0);
    Tensor G = logits_workspace(N * V, x.options()).narrow(0, 0, N * V).view({N, V});
    Tensor loss_rows = torch::empty({N}, x.options());
    const int64_t* tp = targets.data_ptr<int64_t>();
    for (int64_t i = 0; i < N; ++i)
      if (tp[i] < 0 || tp[i] >= V)
        throw Error("target token " + std::to_string(tp[i]) + " is outside the vocabulary [0, " + std::to_string(V) + ")",
                    "the dataset's tokenizer must match model.vocab_size");
    // Chunks of about 1 MB of logits, so that the softmax passes stay in cache.
    const int64_t rows = std::clamp<int64_t>((int64_t{1} << 18) / V, 8, N);
    const float inv_n = 1.0f / static_cast<float>(N);
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
      const int64_t n = std::min(rows, N - r0);
      Tensor Gc = G.narrow(0, r0, n);
      at::mm_out(Gc, x.narrow(0, r0, n), w.t());
      float* g = Gc.data_ptr<float>();
      float* lr = loss_rows.data_ptr<float>() + r0;
      for (int64_t i = 0; i < n; ++i) lr[i] = -g[i * V + tp[r0 + i]];
      Tensor mx = std::get<0>(Gc.max(1, /*keepdim=*/true));
      Gc.sub_(mx).exp_();
      Tensor sum = Gc.sum(1, /*keepdim=*/true);
      loss_rows.narrow(0, r0, n).add_(sum.log().squeeze(1)).add_(mx.squeeze(1));
      if (need_grad) {
        Gc.mul_(sum.reciprocal_().mul_(inv_n));  // softmax / N
        for (int64_t i = 0; i < n; ++i) g[i * V + tp[r0 + i]] -= inv_n;
      }
    }
    if (need_grad) {
      ctx->saved_data["dx"] = torch::mm(G, w);
      ctx->saved_data["dw"] = torch::mm(G.t(), x);
    }
    return loss_rows.mean();
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    Tensor dx = ctx->saved_data["dx"].toTensor(), dw = ctx->saved_data["dw"].toTensor();
    const Tensor& go = grads[0];
    if (go.item<float>() != 1.0f) {  // loss scaled before backward (rare): scale the gradients
      dx = dx * go;
      dw = dw * go;
    }
    return {dx, dw, Tensor(), Tensor()};
  }
};

// ---- Projections sharing an input ----------------------------------------------------------
// The weights as one [sum O_i, C] matrix: in place when they are consecutive in one storage.
Tensor stacked_weights(const std::vector<Tensor>& ws) {
  bool adjacent = true;
  for (size_t i = 0; i < ws.size(); ++i) {
    adjacent = adjacent && ws[i].is_contiguous();
    if (i > 0)
      adjacent = adjacent && ws[i].storage().is_alias_of(ws[0].storage()) &&
                 ws[i].data_ptr<float>() == ws[i - 1].data_ptr<float>() + ws[i - 1].numel();
  }
  int64_t rows = 0;
  for (const auto& w : ws) rows += w.size(0);
  if (!adjacent) return torch::cat(ws, 0);
  return ws[0].as_strided({rows, ws[0].size(1)}, {ws[0].size(1), 1});
}

struct LinearGroupFn : torch::autograd::Function<LinearGroupFn> {
  // LibTorch 1.13 cannot take an undefined tensor as an input: with two weights, wc repeats wb
  // and `three` is false.
  static tensor_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& wa, const Tensor& wb, const Tensor& wc,
                             bool three) {
    std::vector<Tensor> ws = {wa, wb};
    if (three) ws.push_back(wc);
    const int64_t C = x.size(-1);
    const Tensor x2 = x.reshape({-1, C}).contiguous();
    const Tensor y = torch::mm(x2, stacked_weights(ws).t());
    auto lead = x.sizes().vec();
    lead.pop_back();
    tensor_list out;
    int64_t o = 0;
    for (const auto& w : ws) {
      auto shape = lead;
      shape.push_back(w.size(0));
      out.push_back(y.narrow(1, o, w.size(0)).contiguous().view(shape));
      o += w.size(0);
    }
    ctx->save_for_backward({x2, wa, wb, wc});
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["three"] = three;
    return out;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor& x2 = saved[0];
    std::vector<Tensor> ws = {saved[1], saved[2]};
    const bool three = ctx->saved_data["three"].toBool();
    if (three) ws.push_back(saved[3]);
    std::vector<Tensor> gs;
    for (size_t i = 0; i < ws.size(); ++i)
      gs.push_back(grads[i].defined() ? grads[i].reshape({-1, ws[i].size(0)}) : torch::zeros({x2.size(0), ws[i].size(0)}, x2.options()));
    const Tensor g = torch::cat(gs, 1);
    const Tensor dx = torch::mm(g, stacked_weights(ws)).view(ctx->saved_data["x_sizes"].toIntVector());
    const Tensor dw = torch::mm(g.t(), x2);
    tensor_list r = {dx};
    int64_t o = 0;
    for (const auto& w : ws) {
      r.push_back(dw.narrow(0, o, w.size(0)));
      o += w.size(0);
    }
    if (!three) r.push_back(Tensor());
    r.push_back(Tensor());  // the flag
    return r;
  }
};

}  // namespace

std::vector<torch::Tensor> linear_group(const torch::Tensor& x, const torch::Tensor& wa, const torch::Tensor& wb,
                                        const torch::Tensor& wc) {
  return LinearGroupFn::apply(x, wa, wb, wc.defined() ? wc : wb, wc.defined());
}

bool eligible(const torch::Tensor& t) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  const bool autocast = at::autocast::is_autocast_enabled(at::kCPU);  // 2.4+; the old name warns
#else
  const bool autocast = at::autocast::is_cpu_enabled();
#endif
  return t.scalar_type() == torch::kFloat32 && t.device().is_cpu() && !autocast;
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return RMSNormFn::apply(x, weight, eps);
}

torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up) { return SwiGLUFn::apply(gate, up); }

torch::Tensor rope_heads(const torch::Tensor& x, int64_t heads, const torch::Tensor& cos, const torch::Tensor& sin) {
  return RopeFn::apply(x, heads, cos.narrow(0, 0, x.size(1)), sin.narrow(0, 0, x.size(1)));
}

torch::Tensor causal_softmax(const torch::Tensor& scores, double scale) { return CausalSoftmaxFn::apply(scores, scale); }

torch::Tensor linear_cross_entropy(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& targets) {
  const bool need_grad = torch::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  return LinearCrossEntropyFn::apply(x, weight, targets, need_grad);
}

float exp_approx(float x) { return exp_inline(x); }

bool cpu_has_native_bf16() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  const bool amx_bf16 = (d >> 22) & 1u;
  __cpuid_count(7, 1, a, b, c, d);
  const bool avx512_bf16 = (a >> 5) & 1u;
  return amx_bf16 || avx512_bf16;
#else
  return true;  // not x86: nothing known to warn about
#endif
}

void warn_if_emulated_bf16() {
  static const bool warned = [] {
    if (!cpu_has_native_bf16())
      spdlog::warn(
          "train.dtype = bf16 on a CPU without native bf16 (no AVX512-BF16 or AMX): LibTorch emulates it, and a "
          "step runs at about 0.04x of fp32's speed (tiny: 80 against 1900 tokens/s on an AVX2 EPYC). Use "
          "train.dtype = fp32, the CPU default; bf16 is for GPUs and CPUs with AMX.");
    return true;
  }();
  (void)warned;
}

void keep_freed_memory() {
#if defined(__GLIBC__)
  static const bool done = [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest allowed value
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    return true;
  }();
  (void)done;
#endif
}

}  // namespace gasloc::model::fused
