// Tree attention on the GPU (DESIGN §3 step 2): a batch of sequences, each with a committed
// prefix and a tree (or chain) of new nodes whose K/V are already in the paged cache, in one
// launch per layer. Kernel: kernels/tree_attention.cuh; partitioning: tree_attention_plan.h;
// CPU reference: common/model/tree_attention.h (same semantics, fp32).
//
// Use: Create once (all device memory is allocated there), Prepare once per step with the
// batch's sequences (plans and uploads the metadata: a few asynchronous copies from pinned
// memory), then Run once per layer on the same stream.
#ifndef TREESPEC_COMMON_CUDA_TREE_ATTENTION_H_
#define TREESPEC_COMMON_CUDA_TREE_ATTENTION_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/paged_kv.h"
#include "common/cuda/pinned_buffer.h"
#include "common/cuda/tree_attention_plan.h"

namespace treespec::gpu {

struct TreeAttentionOptions {
  AttnHeads heads;
  int head_dim = 0;    // 32, 64 or 128
  int page_size = 16;  // a power of two >= 16
  int pool_pages = 0;  // page ids lie in [0, pool_pages)
  float scale = 0.0f;  // softmax scale (1/sqrt(head_dim) for Llama)
  AttnPlanLimits limits;
  int min_split_tiles = 1;  // see PlanTreeAttention
  // How many CTAs per SM the planner aims for (PlanTreeAttention's target_ctas = SMs × this);
  // 0 or more than fit: as many as are resident (2 at head dim 128). 1 is faster for small trees
  // at batch 1 up to 32k (fewer partial results for the single-CTA merge), slower at batch 8, at
  // 128k and for 64+ nodes (measured on the H200: docs/experiments/README.md, 'the split-tile merge
  // as its own launch'), so the default is the resident count.
  int target_ctas_per_sm = 0;
  // Query rows per CTA: 64, 128, or 0 = per launch by AutoTileRows (tree_attention_plan.h).
  int tile_rows = 0;
  // Split tiles with valid rows × splits up to this are merged by their last CTA instead of the
  // merge launch (AttnSplitOptions; 0: never), and never more than the CTA's shared memory holds
  // (kernels::AttnFusedMergeCapacity: 158 at head dim 128).
  int fused_merge_row_splits = kAttnDefaultFusedMergeRowSplits;
  // AttnSplitOptions::proportional_splits (false: whole chunks of key tiles per split).
  bool proportional_splits = true;
  // Also consider one CTA per SM and keep it when the planner's estimated critical path is
  // shorter (AttnSplitOptions::sms); false: always aim at the resident count.
  bool plan_by_critical_path = true;
  // Launch as a programmatic dependent of the stream's previous kernel: the first K/V tile, when
  // it lies wholly in the committed prefix, is requested while that kernel (RoPE + K/V write)
  // finishes; q and the tree's slots are read after it (kernels/tree_attention.cuh).
  bool dependent_launch = true;
  // On compute capability 9.0 (H100 / H200), head dims 64 and 128: the kernel's wgmma path
  // (kernels/tree_attention.cuh); elsewhere, or false, the mma.sync path.
  bool wgmma = true;
};

class TreeAttention {
 public:
  static absl::StatusOr<std::unique_ptr<TreeAttention>> Create(const TreeAttentionOptions& options);
  ~TreeAttention();

  // Plans the batch and enqueues the upload of its metadata on `stream`. Waits for the
  // previous step's upload to leave the pinned staging memory before reusing it.
  absl::Status Prepare(absl::Span<const AttnSeqDesc> seqs, cudaStream_t stream);

  // out = attention of q over `layer` for the prepared batch: the attention kernel, then (when
  // the plan splits a tile, or under a graph capture) the merge kernel as its dependent launch.
  //   q, out  [num_query_rows, num_q_heads, head_dim] bf16: sequence b's query nodes
  //           [first_query, n) are consecutive rows, sequences in batch order.
  cudaError_t Run(const KvLayerView& layer, const __nv_bfloat16* q, __nv_bfloat16* out,
                  cudaStream_t stream);

  const AttnPlan& plan() const { return plan_; }
  bool uses_wgmma() const { return wgmma_; }
  // CTAs of `tile_rows` rows that fill the GPU.
  int target_ctas(int tile_rows) const {
    return tile_rows == kAttnMaxTileRows ? target_ctas_large_ : target_ctas_small_;
  }

  // For CUDA graphs: Run launches max(work items, capacity) attention CTAs and max(merge items,
  // 2 × capacity) merge CTAs, and the CTAs past the prepared batch's counts (read from device
  // memory) exit at once, so a graph captured with capacity C replays correctly after any later
  // Prepare with at most C items (so at most 2C merges) and the same plan().tile_rows (the
  // kernel differs per tile size). 0: the grids are the counts (eager launches; no merge launch
  // when no tile is split).
  void set_grid_capacity(int ctas) { grid_capacity_ = ctas; }

 private:
  TreeAttention() = default;

  TreeAttentionOptions options_;
  int target_ctas_small_ = 0, target_ctas_large_ = 0;
  int sms_ = 0;
  int grid_capacity_ = 0;
  bool wgmma_ = false;
  AttnPlan plan_;
  // Device metadata at fixed offsets (so a captured graph's pointers stay valid).
  DeviceBuffer<unsigned char> meta_;
  size_t items_offset_ = 0, merges_offset_ = 0, seqs_offset_ = 0, pages_offset_ = 0,
         masks_offset_ = 0;
  PinnedBuffer staging_;          // host twin of meta_
  cudaEvent_t staged_ = nullptr;  // the last upload has read staging_
  DeviceBuffer<float> partial_out_;
  DeviceBuffer<float> partial_lse_;
  DeviceBuffer<int32_t> merge_counters_;  // [limits.max_items], zero between launches
};

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_TREE_ATTENTION_H_
