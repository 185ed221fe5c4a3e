#include "common/model/tree_attention.h"

#include "common/model/cpu_ops.h"

namespace treespec {

void TreeAttention(const KvPool& pool, int layer, int page_size, const TreeAttentionSeq& seq,
                   const AttentionHeads& heads, float scale, const float* q, float* out,
                   TreeAttentionScratch* scratch) {
  const int num_q_heads = static_cast<int>(heads.kv_head_of_q.size());
  const int key_dim = heads.key_dim, value_dim = heads.value_dim;
  // A slot's values: its V, or (MLA) its K entry.
  auto values = [&](int page, int offset) {
    return heads.values_in_keys ? pool.K(layer, page, offset) : pool.V(layer, page, offset);
  };
  const int words = (seq.num_nodes + 63) / 64;
  std::vector<const float*>& k_rows = scratch->k_rows;
  std::vector<const float*>& v_rows = scratch->v_rows;
  std::vector<float>& scores = scratch->scores;
  k_rows.resize(seq.prefix_len + seq.num_nodes);
  v_rows.resize(seq.prefix_len + seq.num_nodes);
  scores.resize(seq.prefix_len + seq.num_nodes);

  // The committed prefix is the same for every node: its slots first, in order.
  for (int s = 0; s < seq.prefix_len; ++s) {
    k_rows[s] = pool.K(layer, seq.pages[s / page_size], s % page_size);
    v_rows[s] = values(seq.pages[s / page_size], s % page_size);
  }
  for (int node = seq.first_query; node < seq.num_nodes; ++node) {
    // Then the node's ancestors and itself among the tree slots, in increasing slot order.
    int count = seq.prefix_len;
    const uint64_t* mask_row = seq.ancestor_mask.data() + static_cast<size_t>(node) * words;
    for (int w = 0; w < words; ++w) {
      for (uint64_t bits = mask_row[w]; bits != 0; bits &= bits - 1) {
        const int slot = seq.prefix_len + w * 64 + __builtin_ctzll(bits);
        k_rows[count] = pool.K(layer, seq.pages[slot / page_size], slot % page_size);
        v_rows[count] = values(seq.pages[slot / page_size], slot % page_size);
        ++count;
      }
    }
    const int64_t row = static_cast<int64_t>(node - seq.first_query) * num_q_heads;
    for (int h = 0; h < num_q_heads; ++h) {
      const int g = heads.kv_head_of_q[h];
      const int k_offset = g * key_dim;  // this head's K within a slot
      const int v_offset = heads.values_in_keys ? 0 : g * value_dim;
      const float* qh = q + (row + h) * key_dim;  // [key_dim]
      float* oh = out + (row + h) * value_dim;    // [value_dim]
      DotRows(qh, k_rows.data(), k_offset, count, key_dim, scores.data());
      for (int c = 0; c < count; ++c) scores[c] *= scale;
      SoftmaxInPlace(absl::MakeSpan(scores.data(), count));
      WeightedSumRows(scores.data(), v_rows.data(), v_offset, count, value_dim, oh);
    }
  }
}

}  // namespace treespec
