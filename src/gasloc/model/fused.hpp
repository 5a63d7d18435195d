// Fused CPU kernels for the Llama step (forward and hand-written backward as autograd functions).
//
// Why: at the sizes gasloc trains on a CPU, a step is GEMMs plus many small element-wise ops,
// each a pass over memory, an allocation and a trip through the dispatcher. These functions do
// each layer's element-wise work in one pass forward and one backward, and the LM head with
// cross-entropy without keeping the logits for autograd. The reference formulas stay in
// llama.cpp (LlamaConfig::fused = false selects them); tests/test_fused.cpp compares the two on
// values and gradients and checks the backward passes by finite differences.
//
// All of them take fp32 CPU tensors only: callers test eligible() and use the reference ops
// otherwise (bf16 autocast, CUDA, float64 gradient checks).
#pragma once
#include <torch/types.h>

#include <vector>

namespace gasloc::model::fused {

// True when t is fp32 on CPU and CPU autocast is off: the fused kernels apply.
bool eligible(const torch::Tensor& t);

// weight * x / sqrt(mean(x^2) + eps) over the last dimension; x [..., C], weight [C].
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// silu(gate) * up, elementwise (same shapes).
torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up);

// Rotary embedding fused with the head split: x [B, T, heads * D] (a projection's output) to the
// rotated heads [B, heads, T, D], contiguous. cos, sin [T', D] with T' >= T (HF rotate-half).
torch::Tensor rope_heads(const torch::Tensor& x, int64_t heads, const torch::Tensor& cos, const torch::Tensor& sin);

// softmax(scale * s) over the last dimension with the causal mask: s [..., R, T], where row r is
// query position r % T (R = T, or R = G * T for G query heads stacked over one key head).
torch::Tensor causal_softmax(const torch::Tensor& scores, double scale);

// Mean cross-entropy of the logits x @ weight^T against targets, x [N, C], weight [V, C],
// targets [N] int64, computed in row chunks; when gradients are needed they are computed in the
// same pass and the logits are never kept.
torch::Tensor linear_cross_entropy(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& targets);

// x @ wa^T, x @ wb^T (and x @ wc^T when wc is defined) as one matrix product: the projections
// that read the same input (q, k, v; gate, up). When the weights lie back to back in memory (as
// FlatParams stores a layer's matrices) the product reads them in place; otherwise they are
// concatenated first. x [..., C], weights [O_i, C]; returns [..., O_i] each, contiguous.
std::vector<torch::Tensor> linear_group(const torch::Tensor& x, const torch::Tensor& wa, const torch::Tensor& wb,
                                        const torch::Tensor& wc = {});

// Keeps freed activation memory in the process (glibc malloc: no trimming, and mmap only above
// 32 MB). A training step frees and re-allocates the same megabytes every step; by default glibc
// returns them to the kernel, which zeroes every page again on the next step (11% of a tiny step
// in PyTorch eager, in perf). Called once by the Llama constructor; a no-op off glibc.
void keep_freed_memory();

// Whether this CPU computes bf16 natively (AVX512-BF16 or AMX-BF16, by cpuid). Without either,
// LibTorch emulates bf16 matmuls and a CPU step runs far slower than fp32.
bool cpu_has_native_bf16();
// Logs a warning, once per process, when bf16 training is asked for on such a CPU: it names the
// measured cost and suggests fp32.
void warn_if_emulated_bf16();

// Vectorizable exp (Cephes polynomial, about 1 ulp on [-87, 88]; clamps outside), exposed for tests.
float exp_approx(float x);

}  // namespace gasloc::model::fused
