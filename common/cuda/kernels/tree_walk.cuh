// The accept walk (DESIGN §3 step 4), one thread per request. Launcher: tree_walk.{h,cu}; CPU
// reference: WalkTree (common/tree/token_tree.cc), whose forward scan this is.
#ifndef TREESPEC_COMMON_CUDA_KERNELS_TREE_WALK_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_TREE_WALK_CUH_

#include <cstdint>

namespace treespec::gpu::kernels {

// Nodes read per batch of independent loads: the scan's loads do not depend on the walk's
// state, so issuing them together hides most of the memory latency of a serial scan.
inline constexpr int kWalkBatch = 16;

// Thread b walks sequence b. Children follow their parent and the next accepted node follows
// the current one, so one forward scan over j = 1..n-1 finds the path: j is accepted when its
// parent is the current node and its token is the current node's choice; the first such j wins
// (duplicate sibling tokens), as in WalkTree.
//   node_offsets [batch + 1]; tokens, parents, choice [node_offsets[batch]];
//   path, emitted [batch, max_path]; path_len [batch]
__global__ void TreeWalkKernel(const int32_t* __restrict__ node_offsets,
                               const int32_t* __restrict__ tokens,
                               const int32_t* __restrict__ parents,
                               const int32_t* __restrict__ choice, int batch, int max_path,
                               int32_t* __restrict__ path, int32_t* __restrict__ path_len,
                               int32_t* __restrict__ emitted) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  const int32_t begin = node_offsets[b];
  const int32_t n = node_offsets[b + 1] - begin;
  int32_t* path_b = path + static_cast<int64_t>(b) * max_path;
  int32_t* emitted_b = emitted + static_cast<int64_t>(b) * max_path;

  int len = 0;
  if (n > 0) {
    const int32_t* tok = tokens + begin;
    const int32_t* par = parents + begin;
    const int32_t* cho = choice + begin;
    int32_t cur = 0;
    int32_t want = cho[0];  // the token a child of cur must carry
    path_b[0] = 0;
    len = 1;
    for (int j0 = 1; j0 < n && len < max_path; j0 += kWalkBatch) {
      int32_t t[kWalkBatch], p[kWalkBatch];
#pragma unroll
      for (int u = 0; u < kWalkBatch; ++u) {
        const int j = j0 + u;
        t[u] = j < n ? tok[j] : 0;
        p[u] = j < n ? par[j] : -2;  // matches no node
      }
#pragma unroll
      for (int u = 0; u < kWalkBatch; ++u) {
        if (p[u] == cur && t[u] == want && len < max_path) {
          cur = j0 + u;
          want = cho[cur];
          path_b[len] = cur;
          emitted_b[len - 1] = t[u];
          ++len;
        }
      }
    }
    emitted_b[len - 1] = want;  // choice at the last accepted node: the next bonus
  }
  for (int j = len; j < max_path; ++j) {
    path_b[j] = -1;
    emitted_b[j] = -1;
  }
  path_len[b] = len;
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_TREE_WALK_CUH_
