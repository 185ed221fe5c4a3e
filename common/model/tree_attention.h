// CPU reference tree attention over the paged KV cache (DESIGN §3 step 2). fp32, one fixed
// order of operations per query row, so a node's output depends only on its own query and the
// slots it attends to — never on the other nodes of the tree or batch.
#ifndef TREESPEC_COMMON_MODEL_TREE_ATTENTION_H_
#define TREESPEC_COMMON_MODEL_TREE_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/model/kv_cache.h"

namespace treespec {

// One sequence's tree as attention sees it.
struct TreeAttentionSeq {
  absl::Span<const int> pages;  // the sequence's page table; slots [0, L + n) are reserved
  int prefix_len = 0;           // L: committed slots [0, L), attended by every node
  int num_nodes = 0;            // n: node i's K/V is in slot L + i
  int first_query = 0;          // nodes [first_query, n) are queries
  // [n, ceil(n / 64)]: bit j of row i is set iff node j is node i or one of its ancestors.
  absl::Span<const uint64_t> ancestor_mask;
};

// Reusable buffers of TreeAttention (no allocation once the longest row has been seen).
struct TreeAttentionScratch {
  std::vector<float> scores;         // [attended slots]
  std::vector<const float*> k_rows;  // [attended slots] K of each slot, all KV heads
  std::vector<const float*> v_rows;  // [attended slots]
};

// Which cached entries a rank's query heads read, and how wide they are.
struct AttentionHeads {
  absl::Span<const int> kv_head_of_q;  // [num_q_heads] the pool head each q head reads
  int key_dim = 0;    // per head: q and K (K of pool head g at [g·key_dim, (g+1)·key_dim))
  int value_dim = 0;  // per head: V and out (V of pool head g at [g·value_dim, ...))
  // MLA's latent cache: a head's values are the first value_dim of its key entry (c_kv);
  // the layer caches no V.
  bool values_in_keys = false;
};

// out = softmax(q·Kᵀ * scale) · V for the query nodes of `seq` in layer `layer` of `pool`.
//   q    [num_queries, num_q_heads, key_dim]     num_queries = n - first_query
//   out  [num_queries, num_q_heads, value_dim]
// Query node i, head h, attends to the slots S(i) = [0, L) ∪ {L + j : bit j of row i}, in
// increasing slot order: scores s = (q·k) * scale (DotRows: MatMul's lane order),
// p = softmax(s) (two passes: max, then exp and an fp32 sum in slot order), out = Σ p_s v_s
// accumulated in slot order (WeightedSumRows). A chain (causal) tree therefore gives
// bit-identical rows to decoding one token at a time.
void TreeAttention(const KvPool& pool, int layer, int page_size, const TreeAttentionSeq& seq,
                   const AttentionHeads& heads, float scale, const float* q, float* out,
                   TreeAttentionScratch* scratch);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_TREE_ATTENTION_H_
