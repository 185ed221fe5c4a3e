// fp32 CPU operators of the reference forward pass (DESIGN §5): matmul, RMSNorm, RoPE,
// SiLU·mul, softmax. Plain functions over row-major arrays; the callers own the memory.
//
// Batch invariance (DESIGN §3): every output element is computed by one fixed sequence of
// floating-point operations that depends only on the inputs of its own row, never on how many
// rows are in the call. This is what makes a chain prefill equal token-by-token decoding and a
// batch of sequences equal each sequence alone, bit for bit. It is also why MatMul is
// hand-written: a BLAS sgemm picks its kernel (and so its summation order) from the shape.
#ifndef TREESPEC_COMMON_MODEL_CPU_OPS_H_
#define TREESPEC_COMMON_MODEL_CPU_OPS_H_

#include <cstdint>

#include "absl/types/span.h"

namespace treespec {

// y = x · wᵀ.
//   x [m, k], w [n, k] (Hugging Face [out_features, in_features]), y [m, n].
// y[i, j] = sum over k of x[i, :] * w[j, :] accumulated in 8 independent lanes (lane l takes
// the products with index ≡ l mod 8, in increasing index order; the last partial group is
// zero-padded), then the lanes combined as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
// The lane update is a fused multiply-add on CPUs with AVX2+FMA and a multiply then an add
// elsewhere; the choice is made once per process (TREESPEC_CPU_MATMUL=portable forces the
// portable kernel), so results are reproducible within a machine, not across ISAs.
// Blocked over rows and columns: a block of w is read once per block of up to 64 rows of x.
void MatMul(const float* x, const float* w, int m, int n, int k, float* y);

// The two MatMul kernels, for tests. MatMulAvx2 returns false (and writes nothing) when the
// CPU or the compiler lacks AVX2+FMA.
namespace internal {
void MatMulPortable(const float* x, const float* w, int m, int n, int k, float* y);
bool MatMulAvx2(const float* x, const float* w, int m, int n, int k, float* y);
}  // namespace internal

// Attention helpers over rows that are not evenly strided (K/V slots of a paged cache).
// scores[c] = x · rows[c][offset : offset + k] for c in [0, count), with exactly MatMul's
// arithmetic (same kernel, same lane order): x [k], rows [count] pointers, scores [count].
void DotRows(const float* x, const float* const* rows, int offset, int count, int k, float* scores);
// out = Σ_c weights[c] * rows[c][offset : offset + k], accumulated in increasing c (one fused
// multiply-add per term with the AVX2 kernel, a multiply then an add otherwise). out [k].
void WeightedSumRows(const float* weights, const float* const* rows, int offset, int count, int k,
                     float* out);

// x[i, :] += bias for every row. x [m, n], bias [n].
void AddBias(const float* bias, int m, int n, float* x);

// x += y elementwise. x, y [count].
void AddInPlace(const float* y, int64_t count, float* x);

// Hugging Face LlamaRMSNorm over the last dimension:
//   y[i, :] = weight * (x[i, :] / sqrt(mean(x[i, :]²) + eps)).
// The mean of squares is accumulated in double, in index order. x, y [m, n] (may alias),
// weight [n].
void RmsNorm(const float* x, const float* weight, int m, int n, float eps, float* y);

// cos/sin tables for rotary embeddings at `positions`:
//   angle[i, f] = float(positions[i]) * inv_freq[f]  (an fp32 product, as Hugging Face does),
//   cos[i, f] = attention_factor * cos(angle), sin likewise (yarn's mscale; 1 elsewhere).
// inv_freq [head_dim / 2], positions [m], cos/sin [m, head_dim / 2].
void RopeTables(absl::Span<const float> inv_freq, float attention_factor,
                absl::Span<const int> positions, float* cos, float* sin);

// Rotary embedding, rotate-half convention (Hugging Face Llama): with h = head_dim / 2,
//   out[f]     = x[f] * cos[f] - x[f + h] * sin[f]
//   out[f + h] = x[f + h] * cos[f] + x[f] * sin[f]        for f in [0, h).
// x [m, num_heads, head_dim] in place; cos/sin [m, head_dim / 2] (row i for every head of x[i]).
void ApplyRope(const float* cos, const float* sin, int m, int num_heads, int head_dim, float* x);

// out = silu(gate) * up with silu(g) = g / (1 + exp(-g)). gate, up, out [count] (out may
// alias gate or up).
void SiluMul(const float* gate, const float* up, int64_t count, float* out);

// In-place softmax of x [n]: exp(x - max) / sum, the sum taken in index order in fp32.
// Returns the sum of exponentials (>= 1).
float SoftmaxInPlace(absl::Span<float> x);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_CPU_OPS_H_
