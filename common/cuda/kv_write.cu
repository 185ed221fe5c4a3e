#include "common/cuda/kernels/common.cuh"
#include "common/cuda/kernels/kv_write.cuh"
#include "common/cuda/kv_write.h"
#include "common/cuda/launch_util.h"

namespace treespec::gpu {
namespace {

// Launches KvWriteKernel<kVec, kGroup> with the smallest group of lanes per head (4 ... 32)
// that gives each lane at most one pack of the half head (more only beyond 32 packs).
template <int kVec>
cudaError_t LaunchGrouped(int rows, int total_heads, int head_dim, size_t shared_bytes,
                          cudaStream_t stream, const __nv_bfloat16* qkv, int num_q_heads,
                          int num_kv_heads, const int32_t* positions, const int32_t* slots,
                          const float* inv_freq, float attention_factor,
                          const __nv_bfloat16* q_norm, const __nv_bfloat16* k_norm, float eps,
                          __nv_bfloat16* q_out, const KvLayerView& layer) {
  // 512 threads cover a row of 48 heads of 128 (Llama 3 8B: 32 q + 2 × 8 kv) in one pass.
  constexpr int kMaxThreads = 512;
  const int packs = head_dim / 2 / kVec;
  auto launch = [&](auto kernel, int group) {
    const int threads =
        internal::RowBlockThreads(static_cast<int64_t>(total_heads) * group, kMaxThreads);
    kernel<<<rows, threads, shared_bytes, stream>>>(qkv, num_q_heads, num_kv_heads, head_dim,
                                                    positions, slots, inv_freq, attention_factor,
                                                    q_norm, k_norm, eps, q_out, layer);
  };
  if (packs <= 4) {
    launch(kernels::KvWriteKernel<kVec, 4>, 4);
  } else if (packs <= 8) {
    launch(kernels::KvWriteKernel<kVec, 8>, 8);
  } else if (packs <= 16) {
    launch(kernels::KvWriteKernel<kVec, 16>, 16);
  } else {
    launch(kernels::KvWriteKernel<kVec, 32>, 32);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchKvWrite(const __nv_bfloat16* qkv, int rows, int num_q_heads, int num_kv_heads,
                          int head_dim, const int32_t* positions, const int32_t* slots,
                          const float* inv_freq, float attention_factor,
                          const __nv_bfloat16* q_norm, const __nv_bfloat16* k_norm, float eps,
                          __nv_bfloat16* q_out, const KvLayerView& layer, cudaStream_t stream) {
  // 12288 floats (48 KiB) is the default dynamic shared memory limit.
  if (rows < 0 || num_q_heads < 1 || num_kv_heads < 1 || head_dim < 2 || head_dim % 2 != 0 ||
      head_dim > 12288 || layer.num_kv_heads != num_kv_heads || layer.head_dim != head_dim ||
      layer.page_size < 1 || layer.num_pages < 0) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  const int total_heads = num_q_heads + 2 * num_kv_heads;
  const size_t shared_bytes = sizeof(float) * head_dim;
  // The 16-byte path loads a pack of 8 from each half of a head: h = head_dim / 2 must be a
  // multiple of 8 (then so are the row and slot strides).
  const bool vec = head_dim % (2 * kernels::kBf16PerPack) == 0 && internal::Aligned16(qkv) &&
                   internal::Aligned16(q_out) && internal::Aligned16(layer.k) &&
                   internal::Aligned16(layer.v) &&
                   (q_norm == nullptr || internal::Aligned16(q_norm)) &&
                   (k_norm == nullptr || internal::Aligned16(k_norm));
  if (vec) {
    return LaunchGrouped<kernels::kBf16PerPack>(
        rows, total_heads, head_dim, shared_bytes, stream, qkv, num_q_heads, num_kv_heads,
        positions, slots, inv_freq, attention_factor, q_norm, k_norm, eps, q_out, layer);
  }
  return LaunchGrouped<1>(rows, total_heads, head_dim, shared_bytes, stream, qkv, num_q_heads,
                          num_kv_heads, positions, slots, inv_freq, attention_factor, q_norm,
                          k_norm, eps, q_out, layer);
}

}  // namespace treespec::gpu
