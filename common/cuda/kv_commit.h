// The accepted-path KV commit (DESIGN §3 step 5) of a batch on the GPU, every layer in one
// launch. Kernel: kernels/kv_commit.cuh; CPU reference: CommitPath (common/model/kv_cache.h).
#ifndef TREESPEC_COMMON_CUDA_KV_COMMIT_H_
#define TREESPEC_COMMON_CUDA_KV_COMMIT_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/cuda/paged_kv.h"

namespace treespec::gpu {

// For every sequence b with L = committed_len[b], n = path_len[b] and accepted path
// c = path[b, 0 .. n) (c_0 = 0 < c_1 < ... < c_{n-1}, tree node indices): for j = 1 .. n - 1
// with c_j != j, copies K and V of logical slot L + c_j to logical slot L + j, for every KV
// head of every layer — with the result of doing it in ascending j in place (which reads only
// original values since c_j >= j; kernels/kv_commit.cuh says why the kernel's parallel order
// gives the same). Logical slot s of b lives at page page_table[page_offsets[b] + s /
// page_size], offset s % page_size. The page table is not touched: the host truncates it to
// L + n slots afterwards, as CommitPath does.
//
// A row with n = 0 or 1 does nothing, so a fixed-size batch can carry idle rows. A row whose
// path is invalid — n > max_path, L < 0, c_0 != 0, not strictly increasing, a slot beyond its
// page table or a page id outside [0, num_pages) — is left untouched as a whole (CommitPath
// aborts instead; the GPU cannot report it). Sequences must not share the pages of their tree
// slots [L, L + c_{n-1}].
//
// Layers: the pool is addressed as layer 0's view plus a stride, so one launch with plain
// kernel arguments commits every layer; layer l's K is layer0.k + l * layer_stride and its V
// layer0.v + l * layer_stride (elements). For a DeviceKvPool, layer0 = pool.Layer(0) and
// layer_stride = pool.Layer(1).k - pool.Layer(0).k (any value when num_layers == 1).
//
// Graph-friendly: every per-step input is read on the device and the launch configuration
// depends only on num_seqs, max_path, num_layers and the pool's shape, so a captured graph is
// replayed after rewriting the arrays in place.
//   committed_len  [num_seqs] int32, device
//   path           [num_seqs, max_path] int32, device: row b's first path_len[b] entries
//   path_len       [num_seqs] int32, device: k + 1 for k accepted drafted nodes, or 0
//   page_tables    the batch's page tables (device CSR, num_seqs + 1 offsets)
// Returns cudaErrorInvalidValue (nothing launched) for num_layers < 1, num_seqs < 0 or
// > 65535, max_path outside [1, 1024], a pool shape below 1 (num_pages, page_size,
// num_kv_heads, head_dim), null layer0.k or .v, or a negative layer_stride with num_layers > 1;
// cudaSuccess without a launch for num_seqs == 0; else the launch's error.
cudaError_t LaunchKvCommit(const KvLayerView& layer0, int num_layers, int64_t layer_stride,
                           const int32_t* committed_len, const int32_t* path, int max_path,
                           const int32_t* path_len, int num_seqs, DevicePageTables page_tables,
                           cudaStream_t stream);

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_KV_COMMIT_H_
