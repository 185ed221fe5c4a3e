#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/dependent_launch.h"
#include "common/cuda/kernels/tree_attention.cuh"
#include "common/cuda/kernels/tree_attention_merge.cuh"
#include "common/cuda/tree_attention.h"

namespace treespec::gpu {
namespace {

size_t AlignUp(size_t n) { return (n + 15) / 16 * 16; }

// Calls f(head dim) as a std::integral_constant.
template <typename F>
cudaError_t WithHeadDim(int head_dim, F&& f) {
  return head_dim == 32   ? f(std::integral_constant<int, 32>{})
         : head_dim == 64 ? f(std::integral_constant<int, 64>{})
                          : f(std::integral_constant<int, 128>{});
}

// Calls f(head dim, query-tile rows, wgmma) with each as a compile-time constant
// (std::integral_constant / std::bool_constant): the attention kernel's instance for a launch.
// Head dim 32 has no wgmma path (Create never chooses it there) and always gets mma.sync.
template <typename F>
auto WithAttentionKernel(int head_dim, int tile_rows, bool wgmma, F&& f) {
  auto with_rows = [&](auto d) {
    auto with_path = [&](auto rows) {
      if constexpr (decltype(d)::value == 32) {
        return f(d, rows, std::false_type{});
      } else {
        return wgmma ? f(d, rows, std::true_type{}) : f(d, rows, std::false_type{});
      }
    };
    return tile_rows == kAttnMaxTileRows
               ? with_path(std::integral_constant<int, kAttnMaxTileRows>{})
               : with_path(std::integral_constant<int, kAttnSmallTileRows>{});
  };
  return head_dim == 32   ? with_rows(std::integral_constant<int, 32>{})
         : head_dim == 64 ? with_rows(std::integral_constant<int, 64>{})
                          : with_rows(std::integral_constant<int, 128>{});
}

// Sets the kernel's shared-memory size and reports its resident CTAs per SM.
cudaError_t ConfigureKernel(int head_dim, int tile_rows, bool wgmma, int* ctas_per_sm) {
  return WithAttentionKernel(head_dim, tile_rows, wgmma, [&](auto d, auto rows, auto w) {
    auto* kernel = &kernels::TreeAttentionKernel<d, rows, w>;
    constexpr int kBytes = kernels::AttnSharedBytes<d, rows, w>();
    if (cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
        e != cudaSuccess) {
      return e;
    }
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, kernel,
                                                         kernels::AttnThreads<rows>(), kBytes);
  });
}

cudaError_t Launch(int head_dim, int tile_rows, bool wgmma, const kernels::TreeAttentionArgs& args,
                   int ctas, bool dependent_launch, cudaStream_t stream) {
  return WithAttentionKernel(head_dim, tile_rows, wgmma, [&](auto d, auto rows, auto w) {
    return internal::LaunchMaybeDependent(
        &kernels::TreeAttentionKernel<d, rows, w>, dim3(ctas), dim3(kernels::AttnThreads<rows>()),
        kernels::AttnSharedBytes<d, rows, w>(), dependent_launch, stream, args);
  });
}

// Partial rows (valid rows × splits) the last CTA of a tile can merge in its shared memory.
int FusedMergeCapacity(int head_dim, int tile_rows, bool wgmma) {
  return WithAttentionKernel(head_dim, tile_rows, wgmma, [](auto d, auto rows, auto w) {
    return kernels::AttnFusedMergeCapacity<d, rows, w>();
  });
}

cudaError_t ConfigureMergeKernel(int head_dim) {
  return WithHeadDim(head_dim, [](auto d) {
    constexpr int kHeadDim = decltype(d)::value;
    return cudaFuncSetAttribute(&kernels::TreeAttentionMergeKernel<kHeadDim>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                kernels::AttnMergeSharedBytes<kHeadDim>());
  });
}

cudaError_t LaunchMerge(int head_dim, const kernels::TreeAttentionMergeArgs& args, int ctas,
                        bool dependent_launch, cudaStream_t stream) {
  return WithHeadDim(head_dim, [&](auto d) {
    constexpr int kHeadDim = decltype(d)::value;
    return internal::LaunchMaybeDependent(
        &kernels::TreeAttentionMergeKernel<kHeadDim>, dim3(ctas), dim3(kernels::kAttnMergeThreads),
        kernels::AttnMergeSharedBytes<kHeadDim>(), dependent_launch, stream, args);
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<TreeAttention>> TreeAttention::Create(
    const TreeAttentionOptions& options) {
  const int d = options.head_dim;
  if (d != 32 && d != 64 && d != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("tree attention: head_dim ", d, " is not supported (32, 64 or 128)"));
  }
  if (options.tile_rows != 0 && options.tile_rows != kAttnSmallTileRows &&
      options.tile_rows != kAttnMaxTileRows) {
    return absl::InvalidArgumentError(absl::StrCat("tree attention: tile_rows ", options.tile_rows,
                                                   " is not 0 (automatic), ", kAttnSmallTileRows,
                                                   " or ", kAttnMaxTileRows));
  }
  if (options.fused_merge_row_splits < 0) {
    return absl::InvalidArgumentError(absl::StrCat("tree attention: fused_merge_row_splits ",
                                                   options.fused_merge_row_splits, " < 0"));
  }
  if (!(options.scale > 0.0f) || !std::isfinite(options.scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tree attention: softmax scale ", options.scale, " must be finite and > 0"));
  }
  const AttnPlanLimits& lim = options.limits;
  if (lim.max_seqs < 1 || lim.max_pages < 1 || lim.max_mask_words < 0 || lim.max_items < 1 ||
      lim.max_partials < 0) {
    return absl::InvalidArgumentError("tree attention: every limit must be positive");
  }
  // The kernel addresses a page (all KV heads) with 32-bit byte offsets.
  if (static_cast<int64_t>(options.heads.num_kv_heads) * options.page_size * d * 2 > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tree attention: a page of ", options.page_size, " slots × ", options.heads.num_kv_heads,
        " KV heads × head_dim ", d, " exceeds 2 GiB; use smaller pages"));
  }
  // The heads and page size are checked by planning an empty batch.
  if (auto empty = PlanTreeAttention({}, options.heads, options.page_size, options.pool_pages, lim,
                                     AttnSplitOptions{});
      !empty.ok()) {
    return empty.status();
  }

  auto attention = std::unique_ptr<TreeAttention>(new TreeAttention());
  attention->options_ = options;
  int device = 0, sms = 0, major = 0, small_per_sm = 0, large_per_sm = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  // wgmma: sm_90a code, which the build holds for compute capability 9.0 (CMakeLists.txt).
  attention->wgmma_ = options.wgmma && major == 9 && d != 32;
  CUDA_RETURN_IF_ERROR(ConfigureKernel(d, kAttnSmallTileRows, attention->wgmma_, &small_per_sm));
  CUDA_RETURN_IF_ERROR(ConfigureKernel(d, kAttnMaxTileRows, attention->wgmma_, &large_per_sm));
  CUDA_RETURN_IF_ERROR(ConfigureMergeKernel(d));
  auto target = [&](int resident) {
    resident = std::max(1, resident);
    return sms * (options.target_ctas_per_sm > 0 ? std::min(options.target_ctas_per_sm, resident)
                                                 : resident);
  };
  attention->sms_ = sms;
  attention->target_ctas_small_ = target(small_per_sm);
  attention->target_ctas_large_ = target(large_per_sm);

  // [num_items, num_merges][seqs][items][merges][page table][masks], each region 16-byte
  // aligned. A plan has at most 2 merges per item (AttnMergeRows).
  attention->seqs_offset_ = 16;
  attention->items_offset_ = attention->seqs_offset_ + AlignUp(sizeof(AttnSeqInfo) * lim.max_seqs);
  attention->merges_offset_ =
      attention->items_offset_ + AlignUp(sizeof(AttnWorkItem) * lim.max_items);
  attention->pages_offset_ =
      attention->merges_offset_ + AlignUp(2 * sizeof(AttnMergeItem) * lim.max_items);
  attention->masks_offset_ = attention->pages_offset_ + AlignUp(sizeof(int32_t) * lim.max_pages);
  const size_t meta_bytes = attention->masks_offset_ + sizeof(uint64_t) * lim.max_mask_words;
  auto meta = DeviceBuffer<unsigned char>::Create(meta_bytes);
  if (!meta.ok()) return meta.status();
  attention->meta_ = std::move(meta).value();
  if (absl::Status s = attention->staging_.Allocate(meta_bytes); !s.ok()) return s;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&attention->staged_, cudaEventDisableTiming));

  const size_t partials = std::max(1, lim.max_partials);
  auto partial_out = DeviceBuffer<float>::Create(partials * kAttnMaxTileRows * d);
  if (!partial_out.ok()) return partial_out.status();
  attention->partial_out_ = std::move(partial_out).value();
  auto partial_lse = DeviceBuffer<float>::Create(partials * kAttnMaxTileRows);
  if (!partial_lse.ok()) return partial_lse.status();
  attention->partial_lse_ = std::move(partial_lse).value();
  auto counters = DeviceBuffer<int32_t>::Create(lim.max_items);
  if (!counters.ok()) return counters.status();
  attention->merge_counters_ = std::move(counters).value();
  if (absl::Status s = attention->merge_counters_.ZeroNow(); !s.ok()) return s;
  if (absl::Status s = attention->meta_.ZeroNow(); !s.ok()) return s;
  return attention;
}

TreeAttention::~TreeAttention() {
  if (staged_ != nullptr) {
    cudaEventSynchronize(staged_);
    cudaEventDestroy(staged_);
  }
}

absl::Status TreeAttention::Prepare(absl::Span<const AttnSeqDesc> seqs, cudaStream_t stream) {
  const int tile_rows =
      options_.tile_rows != 0 ? options_.tile_rows : AutoTileRows(seqs, options_.heads, wgmma_);
  AttnSplitOptions split;
  split.target_ctas = target_ctas(tile_rows);
  split.min_split_tiles = options_.min_split_tiles;
  split.proportional_splits = options_.proportional_splits;
  split.sms = options_.plan_by_critical_path ? sms_ : 0;
  split.tile_rows = tile_rows;
  split.fused_merge_row_splits = std::min(options_.fused_merge_row_splits,
                                          FusedMergeCapacity(options_.head_dim, tile_rows, wgmma_));
  auto plan = PlanTreeAttention(seqs, options_.heads, options_.page_size, options_.pool_pages,
                                options_.limits, split);
  if (!plan.ok()) return plan.status();
  plan_ = std::move(plan).value();

  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staged_));  // the previous upload is done with staging_
  const int32_t counts[2] = {static_cast<int32_t>(plan_.items.size()),
                             static_cast<int32_t>(plan_.merges.size())};
  unsigned char* const staging = staging_.data();
  std::memcpy(staging, counts, sizeof(counts));
  std::memcpy(staging + seqs_offset_, plan_.seqs.data(), sizeof(AttnSeqInfo) * plan_.seqs.size());
  std::memcpy(staging + items_offset_, plan_.items.data(),
              sizeof(AttnWorkItem) * plan_.items.size());
  std::memcpy(staging + merges_offset_, plan_.merges.data(),
              sizeof(AttnMergeItem) * plan_.merges.size());
  std::memcpy(staging + pages_offset_, plan_.page_table.data(),
              sizeof(int32_t) * plan_.page_table.size());
  std::memcpy(staging + masks_offset_, plan_.masks.data(), sizeof(uint64_t) * plan_.masks.size());

  // Counts, sequences and items in one copy, then the used merges, page table and masks.
  const size_t head_bytes = items_offset_ + sizeof(AttnWorkItem) * plan_.items.size();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(meta_.data(), staging, head_bytes, cudaMemcpyHostToDevice, stream));
  if (!plan_.merges.empty()) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(meta_.data() + merges_offset_, staging + merges_offset_,
                                         sizeof(AttnMergeItem) * plan_.merges.size(),
                                         cudaMemcpyHostToDevice, stream));
  }
  if (!plan_.page_table.empty()) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(meta_.data() + pages_offset_, staging + pages_offset_,
                                         sizeof(int32_t) * plan_.page_table.size(),
                                         cudaMemcpyHostToDevice, stream));
  }
  if (!plan_.masks.empty()) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(meta_.data() + masks_offset_, staging + masks_offset_,
                                         sizeof(uint64_t) * plan_.masks.size(),
                                         cudaMemcpyHostToDevice, stream));
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_, stream));
  return absl::OkStatus();
}

cudaError_t TreeAttention::Run(const KvLayerView& layer, const __nv_bfloat16* q, __nv_bfloat16* out,
                               cudaStream_t stream) {
  if (layer.head_dim != options_.head_dim || layer.page_size != options_.page_size ||
      layer.num_pages != options_.pool_pages || layer.num_kv_heads != options_.heads.num_kv_heads ||
      layer.k == nullptr || layer.v == nullptr || q == nullptr || out == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (plan_.items.empty()) return cudaSuccess;
  kernels::TreeAttentionArgs args;
  args.q = q;
  args.out = out;
  args.kv = layer;
  unsigned char* meta = meta_.data();
  args.num_items = reinterpret_cast<const int32_t*>(meta);
  args.seqs = reinterpret_cast<const AttnSeqInfo*>(meta + seqs_offset_);
  args.items = reinterpret_cast<const AttnWorkItem*>(meta + items_offset_);
  args.item_slots = options_.limits.max_items;
  args.page_table = reinterpret_cast<const int32_t*>(meta + pages_offset_);
  args.masks = reinterpret_cast<const uint64_t*>(meta + masks_offset_);
  args.partial_out = partial_out_.data();
  args.partial_lse = partial_lse_.data();
  args.merge_counters = merge_counters_.data();
  args.num_q_heads = options_.heads.num_q_heads;
  args.group_size = options_.heads.group_size;
  args.q_head_shift = options_.heads.q_head_shift;
  args.scale_log2 = options_.scale * 1.4426950408889634f;
  const int ctas = std::max(static_cast<int>(plan_.items.size()), grid_capacity_);
  if (cudaError_t e = Launch(options_.head_dim, plan_.tile_rows, wgmma_, args, ctas,
                             options_.dependent_launch, stream);
      e != cudaSuccess) {
    return e;
  }
  // The merge launch: always under a graph capture (a later plan may need it), else only when
  // some split tile is not merged by its last CTA.
  const int merge_ctas = std::max(static_cast<int>(plan_.merges.size()), 2 * grid_capacity_);
  if (merge_ctas == 0) return cudaSuccess;
  kernels::TreeAttentionMergeArgs merge;
  merge.out = out;
  merge.num_merges = args.num_items + 1;
  merge.merges = reinterpret_cast<const AttnMergeItem*>(meta + merges_offset_);
  merge.merge_slots = 2 * options_.limits.max_items;
  merge.partial_out = args.partial_out;
  merge.partial_lse = args.partial_lse;
  merge.tile_rows = plan_.tile_rows;
  merge.num_q_heads = args.num_q_heads;
  merge.group_size = args.group_size;
  merge.q_head_shift = args.q_head_shift;
  return LaunchMerge(options_.head_dim, merge, merge_ctas, /*dependent_launch=*/true, stream);
}

}  // namespace treespec::gpu
