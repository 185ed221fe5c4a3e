// Accepted-path KV commit of a batch, every layer in one launch (DESIGN §3 step 5). Launcher:
// kv_commit.{h,cu}.
#ifndef TREESPEC_COMMON_CUDA_KERNELS_KV_COMMIT_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_KV_COMMIT_CUH_

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda/paged_kv.h"

namespace treespec::gpu::kernels {

// Copies a thread keeps in flight before storing them (registers: kCommitChunk packs).
inline constexpr int kCommitChunk = 4;

// Why the copies may run in any order across threads and in chunks within one, yet give the
// ascending in-place result of CommitPath (common/model/kv_cache.h). Path c_0 = 0 < c_1 < ... <
// c_k, so c_j >= j; copy j reads slot L + c_j and writes slot L + j.
//  (1) Ascending order reads only original values: copy j's source L + c_j was written before
//      only if c_j = i for an earlier copy i < j, impossible since c_j >= j > i.
//  (2) But a destination CAN be the source of an earlier copy: c_i = j for some i < j (path
//      [0, 2, 3]: copy 1 reads slot L + 2, which copy 2 overwrites). So copy j may store only
//      after every copy i < j has loaded: a write-after-read hazard, not a read-after-write one.
// Hence: every element offset (layer, K/V, head, pack) of a slot belongs to one thread, which
// walks j ascending; a chunk of copies loads all its sources before storing any destination.
// Loads of a chunk see originals by (1); its stores come after its own loads and before every
// later chunk's loads, which never read them (a later copy j' reads L + c_j' with c_j' >= j' >
// every destination of the chunk). Threads never touch each other's elements.
//
// Grid: (blocks covering num_layers * 2 * num_kv_heads * head_dim / kVec packs, num_seqs).
// Each block first plans its sequence's moves into shared memory and checks them; a sequence
// with path_len < 2 or an invalid path or page table (see kv_commit.h) is left untouched, as a
// whole: the check is the same in every block.
//   layer0         layer 0's K/V; layer l's K (V) starts layer l * layer_stride elements after
//                  layer0.k (layer0.v)
//   committed_len  [num_seqs], path [num_seqs, max_path], path_len [num_seqs]
// kVec = 8 needs head_dim % 8 == 0, layer_stride % 8 == 0 and 16-byte aligned layer0.k, .v.
// Dynamic shared memory: 2 * max_path int2.
template <int kVec>
__global__ void KvCommitKernel(KvLayerView layer0, int64_t layer_stride, int num_layers,
                               const int32_t* __restrict__ committed_len,
                               const int32_t* __restrict__ path, int max_path,
                               const int32_t* __restrict__ path_len, DevicePageTables tables) {
  // moves[2 j] = (page, offset) of copy j's source, page -1 when c_j == j (nothing to copy);
  // moves[2 j + 1] = (page, offset) of its destination.
  extern __shared__ int2 moves[];
  const int seq = blockIdx.y;
  const int n = path_len[seq];
  if (n < 2) return;  // uniform over the block: nothing accepted beyond node 0

  const int64_t base = committed_len[seq];
  const int32_t* seq_path = path + static_cast<int64_t>(seq) * max_path;
  const int table_begin = tables.page_offsets[seq];
  const int num_table_pages = tables.page_offsets[seq + 1] - table_begin;
  const int32_t* pages = tables.page_table + table_begin;
  const int page_size = layer0.page_size;

  // Plan and check: c_0 = 0, c_j > c_{j-1} (so c_j >= j), every slot within the sequence's
  // page table and every page id within the pool.
  bool ok = n <= max_path && base >= 0;
  for (int j = threadIdx.x; ok && j < n; j += blockDim.x) {
    const int c = seq_path[j];
    if (j == 0) {
      ok = c == 0;
      continue;
    }
    const int64_t src = base + c, dst = base + j;
    if (c < j || c <= seq_path[j - 1] || src / page_size >= num_table_pages) {
      ok = false;
      continue;
    }
    const int src_page = pages[src / page_size], dst_page = pages[dst / page_size];
    ok = src_page >= 0 && src_page < layer0.num_pages && dst_page >= 0 &&
         dst_page < layer0.num_pages;
    moves[2 * j] = make_int2(c == j ? -1 : src_page, static_cast<int>(src % page_size));
    moves[2 * j + 1] = make_int2(dst_page, static_cast<int>(dst % page_size));
  }
  if (__syncthreads_and(ok) == 0) return;

  const int num_heads = layer0.num_kv_heads;
  const int packs_per_head = layer0.head_dim / kVec;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= static_cast<int64_t>(num_layers) * 2 * num_heads * packs_per_head) return;
  const int pack = static_cast<int>(item % packs_per_head);
  const int64_t rest = item / packs_per_head;
  const int head = static_cast<int>(rest % num_heads);
  const int64_t tensor = rest / num_heads;  // layer * 2 + (0 for K, 1 for V)
  __nv_bfloat16* data =
      ((tensor & 1) != 0 ? layer0.v : layer0.k) + (tensor >> 1) * layer_stride + pack * kVec;

  using Pack = std::conditional_t<kVec == 8, uint4, uint16_t>;
  static_assert(sizeof(Pack) == kVec * sizeof(__nv_bfloat16), "kVec is 8 or 1");
  for (int j0 = 1; j0 < n; j0 += kCommitChunk) {
    Pack values[kCommitChunk];
#pragma unroll
    for (int u = 0; u < kCommitChunk; ++u) {
      const int j = j0 + u;
      if (j < n && moves[2 * j].x >= 0) {
        values[u] = *reinterpret_cast<const Pack*>(
            data + layer0.Offset(moves[2 * j].x, head, moves[2 * j].y));
      }
    }
#pragma unroll
    for (int u = 0; u < kCommitChunk; ++u) {
      const int j = j0 + u;
      if (j < n && moves[2 * j].x >= 0) {
        *reinterpret_cast<Pack*>(
            data + layer0.Offset(moves[2 * j + 1].x, head, moves[2 * j + 1].y)) = values[u];
      }
    }
  }
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_KV_COMMIT_CUH_
