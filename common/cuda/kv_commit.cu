#include <cstdint>

#include "common/cuda/kernels/common.cuh"
#include "common/cuda/kernels/kv_commit.cuh"
#include "common/cuda/kv_commit.h"
#include "common/cuda/launch_util.h"

namespace treespec::gpu {

cudaError_t LaunchKvCommit(const KvLayerView& layer0, int num_layers, int64_t layer_stride,
                           const int32_t* committed_len, const int32_t* path, int max_path,
                           const int32_t* path_len, int num_seqs, DevicePageTables page_tables,
                           cudaStream_t stream) {
  // 65535 is the grid's y limit; 1024 path entries take 16 KiB of shared memory per block.
  constexpr int kMaxSeqs = 65535, kMaxPath = 1024;
  if (num_layers < 1 || num_seqs < 0 || num_seqs > kMaxSeqs || max_path < 1 ||
      max_path > kMaxPath || layer0.num_pages < 1 || layer0.page_size < 1 ||
      layer0.num_kv_heads < 1 || layer0.head_dim < 1 || layer0.k == nullptr ||
      layer0.v == nullptr || (num_layers > 1 && layer_stride < 0)) {
    return cudaErrorInvalidValue;
  }
  if (num_seqs == 0) return cudaSuccess;
  if (num_layers == 1) layer_stride = 0;
  constexpr int kThreads = 256;
  const size_t shared_bytes = sizeof(int2) * 2 * max_path;
  const bool vec = layer0.head_dim % kernels::kBf16PerPack == 0 &&
                   layer_stride % kernels::kBf16PerPack == 0 && internal::Aligned16(layer0.k) &&
                   internal::Aligned16(layer0.v);
  const int vec_width = vec ? kernels::kBf16PerPack : 1;
  const int64_t packs =
      static_cast<int64_t>(num_layers) * 2 * layer0.num_kv_heads * (layer0.head_dim / vec_width);
  const int64_t blocks = internal::CeilDiv(packs, kThreads);
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(num_seqs));
  if (vec) {
    kernels::KvCommitKernel<kernels::kBf16PerPack><<<grid, kThreads, shared_bytes, stream>>>(
        layer0, layer_stride, num_layers, committed_len, path, max_path, path_len, page_tables);
  } else {
    kernels::KvCommitKernel<1><<<grid, kThreads, shared_bytes, stream>>>(
        layer0, layer_stride, num_layers, committed_len, path, max_path, path_len, page_tables);
  }
  return cudaGetLastError();
}

}  // namespace treespec::gpu
