// The accept walk of the verify step on the GPU (DESIGN §3 step 4), one thread per request.
// Kernel: kernels/tree_walk.cuh; CPU reference: WalkTree (common/tree/token_tree.h).
#ifndef TREESPEC_COMMON_CUDA_TREE_WALK_H_
#define TREESPEC_COMMON_CUDA_TREE_WALK_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace treespec::gpu {

// For every sequence b of the batch, whose n_b = node_offsets[b + 1] - node_offsets[b] tree
// nodes are packed at rows node_offsets[b] .. node_offsets[b + 1] - 1 (the same packed order as
// the attention queries and the LaunchChooseToken rows), with node indices local to the sequence
// (node 0 = the bonus token, parents[0] = -1):
//   from node 0, move to the first child j (lowest index) with tokens[j] == choice[cur]; stop
//   when there is none. The accepted path is 0 = c0 < c1 < ... < ck, exactly WalkTree's.
// Outputs, rows of max_path entries:
//   path[b, j]    = c_j for j <= k (local node indices; path[b, 0] = 0)     — for the KV commit
//   emitted[b, j] = tokens[c_{j+1}] for j < k, emitted[b, k] = choice[c_k] (the next bonus)
//   path_len[b]   = k + 1, which is also the number of emitted tokens
//   entries j >= path_len[b] of path and emitted are set to -1.
// An empty sequence (n_b <= 0) gets path_len 0 and all -1.
// max_path: a path never exceeds max depth + 1 entries, so max_path >= (largest tree depth) + 1
// (e.g. the node budget) never binds. If it does bind the walk is clamped: it stops after
// max_path accepted nodes (k = max_path - 1) and emits choice[c_k] as the bonus, which is still
// a correct (lossless) step that accepts fewer tokens; no error is reported.
// Nodes are only compared, never followed through parents[], so malformed parents cannot cause
// out-of-bounds reads (the walk then simply stops early).
//   node_offsets  [batch + 1] int32, device, non-decreasing, node_offsets[0] = 0
//   tokens        [node_offsets[batch]] int32, device: node tokens
//   parents       [node_offsets[batch]] int32, device: parent node (local index, -1 for node 0)
//   choice        [node_offsets[batch]] int32, device: the target's choice at each node
//   path          [batch, max_path] int32, device
//   path_len      [batch] int32, device
//   emitted       [batch, max_path] int32, device
// Returns cudaErrorInvalidValue for batch < 0, max_path < 1 or a null pointer with batch > 0
// (nothing launched); cudaSuccess without a launch for batch == 0; else the launch's error.
cudaError_t LaunchTreeWalk(const int32_t* node_offsets, const int32_t* tokens,
                           const int32_t* parents, const int32_t* choice, int batch, int max_path,
                           int32_t* path, int32_t* path_len, int32_t* emitted, cudaStream_t stream);

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_TREE_WALK_H_
