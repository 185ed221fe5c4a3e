// The target's token choice at every tree node on the GPU (DESIGN §3 step 3): greedy argmax or
// temperature / top-k / top-p sampling by inverse CDF with a counter-based uniform, plus a
// greedy-only argmax over one vocabulary slice for vocab-parallel tensor parallelism. Kernels:
// kernels/choose_token.cuh, kernels/philox.cuh; CPU reference: ChooseToken and UniformAt
// (common/model/sampling.h).
#ifndef TREESPEC_COMMON_CUDA_CHOOSE_TOKEN_H_
#define TREESPEC_COMMON_CUDA_CHOOSE_TOKEN_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace treespec::gpu {

// How one row's token is chosen: SamplingConfig (common/model/sampling.h) plus the position.
// Plain data, 32 bytes, laid out the same on host and device.
struct RowSampling {
  float temperature = 0.0f;  // <= 0: greedy (NaN is treated as greedy too)
  float top_p = 1.0f;        // >= 1 (or NaN): no top-p
  int32_t top_k = 0;         // <= 0 or >= vocab: no top-k
  int32_t reserved = 0;      // padding, ignored
  uint64_t seed = 0;
  // Absolute position of the token being chosen (the engine passes committed length +
  // depth(node) + 1): the uniform is keyed by (seed, position), never by node.
  int64_t position = 0;
};
static_assert(sizeof(RowSampling) == 32, "RowSampling is copied to the device as raw bytes");

// Largest vocabulary LaunchChooseToken takes: token ids fit 21 bits in its sort keys, and its
// fixed-point probability sums (up to vocab * 2^83) fit 128 bits with room to spare.
inline constexpr int kMaxChooseVocab = 1 << 21;

// tokens[r] = ChooseToken(logits[r, :], {temperature, top_p, top_k, seed}, position) for every
// row r, with params[r] giving the row's settings (rows may mix greedy and sampling):
//  * greedy: the argmax, lowest id among equal maxima (+0 and -0 are equal) — bit-exact;
//  * sampling: the same kept set and the same inverse-CDF rule as the CPU (sampling.cc's
//    header comment). Probabilities are exp in double as on the CPU, but all sums are exact
//    (128-bit fixed point, 2^-83 resolution, so independent of summation order, block size
//    and batch) where the CPU rounds a sequential double sum. The two can therefore differ only
//    when the inverse-CDF threshold (or the top-p target) lies within the CPU's rounding error
//    (at most ~vocab * 2^-53 of the kept mass, typically far less) of a cumulative boundary,
//    or through a 1-ulp difference between the device's and glibc's exp.
// The result is deterministic run to run and does not depend on the other rows. One CTA per
// row; sampling rows read the row a few times (one read per 8 bits of sort key for top-k and
// top-p) and take exp only of the tokens still in play.
// Logits may be -inf (masked ids) but not NaN or +inf, and a sampled row not all -inf (the CPU
// result is undefined there too; the token is then some id in [0, vocab)).
//   logits  [rows, vocab] fp32, device (row stride = vocab)
//   params  [rows] RowSampling, device
//   tokens  [rows] int32, device
// Returns cudaErrorInvalidValue for rows < 0, vocab < 1, vocab > kMaxChooseVocab or a null
// pointer with rows > 0 (nothing launched); cudaSuccess without a launch for rows == 0; else the
// launch's error.
cudaError_t LaunchChooseToken(const float* logits, int rows, int vocab, const RowSampling* params,
                              int32_t* tokens, cudaStream_t stream);

// Greedy over one vocabulary slice (vocab-parallel LM head): for every row r,
//   max_out[r] = max_j logits[r, j],  idx_out[r] = vocab_offset + (lowest j attaining it).
// Ranks exchange these pairs (all-gather) and LaunchArgmaxCombine picks the token; that equals
// the greedy token over the whole vocabulary exactly.
//   logits   [rows, vocab_slice] fp32, device (row stride = vocab_slice): this rank's columns
//            [vocab_offset, vocab_offset + vocab_slice) of the full logits
//   max_out  [rows] fp32, device, or nullptr when only the ids are wanted (single rank)
//   idx_out  [rows] int32, device: global token ids
// Returns cudaErrorInvalidValue for rows < 0, vocab_slice < 1, vocab_offset < 0,
// vocab_offset + vocab_slice > INT32_MAX or a null logits / idx_out with rows > 0 (nothing
// launched); cudaSuccess without a launch for rows == 0; else the launch's error.
cudaError_t LaunchArgmaxPartial(const float* logits, int rows, int vocab_slice, int vocab_offset,
                                float* max_out, int32_t* idx_out, cudaStream_t stream);

// tokens[r] = the idx_in[q, r] whose max_in[q, r] is largest over the ranks q, lowest id among
// equal maxima (whatever the order of the ranks' slices). One thread per row.
//   max_in  [ranks, rows] fp32, device (from LaunchArgmaxPartial on every rank)
//   idx_in  [ranks, rows] int32, device
//   tokens  [rows] int32, device
// Returns cudaErrorInvalidValue for ranks < 1, rows < 0 or a null pointer with rows > 0
// (nothing launched); cudaSuccess without a launch for rows == 0; else the launch's error.
cudaError_t LaunchArgmaxCombine(const float* max_in, const int32_t* idx_in, int ranks, int rows,
                                int32_t* tokens, cudaStream_t stream);

// out[i] = UniformAt(seeds[i], positions[i]) computed on the device (kernels/philox.cuh), bit
// for bit the CPU's value; for tests and for any caller that wants the raw uniforms.
//   seeds [n] uint64, positions [n] int64, out [n] fp64, all device
// Returns cudaErrorInvalidValue for n < 0 or a null pointer with n > 0 (nothing launched);
// cudaSuccess without a launch for n == 0; else the launch's error.
cudaError_t LaunchUniformAt(const uint64_t* seeds, const int64_t* positions, int n, double* out,
                            cudaStream_t stream);

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_CHOOSE_TOKEN_H_
