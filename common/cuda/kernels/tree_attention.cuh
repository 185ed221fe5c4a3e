// Tree attention over the paged KV cache (DESIGN §3 step 2), one CTA per AttnWorkItem of a
// plan (tree_attention_plan.h). mma.sync + ldmatrix + cp.async only, so the same body runs on
// sm_90a and sm_120.
//
// A CTA holds a query tile of kRows rows (64 or 128: 16 per warp; a row is one (query node, q
// head) pair of one KV head) and streams its key range in tiles of kAttnTileKeys keys through
// a multistage cp.async pipeline: S = Q·Kᵀ and O += P·V on tensor cores (bf16 in, fp32
// accumulate), online softmax in fp32 in the log2 domain. Keys below the committed length L
// are visible to every row; a tree key L + j is visible to node i iff bit j of the ancestor
// mask row i is set (a chain: iff j <= i). When the plan splits a tile's keys over several
// CTAs, each writes its normalised partial output and log-sum-exp for its valid rows; the last
// of them to finish combines them (the tile's counter; tiles with few partial rows) or the merge
// kernel does (tree_attention_merge.cuh, the next launch).
//
// Shared memory rows are 16-byte chunks XOR-swizzled by row so that the 8 row addresses of
// every ldmatrix hit 8 different bank groups.
//
// The wgmma path (kWgmma, sm_90a, head dim 64 or 128; kernels/wgmma.cuh): the same CTA work,
// softmax and masking, but each warpgroup (4 warps, 64 rows) computes S = Q·Kᵀ with Q and K read
// by the tensor cores straight from shared memory, and O += P·V with P from registers: one
// instruction per 16 columns of the reduction instead of a warp's ldmatrix and mma.sync per
// 16 × 8 × 16 block. S of the next key tile is issued with P·V of this one (so K streams one
// tile ahead of V through the same stages). Tiles are stored as 128-byte-swizzled halves of 64
// columns (GmmaTileOffset), 1024-byte aligned. A warpgroup computes its 64 rows whether or not
// all are valid (a tile of one node's 4 rows computes 64).
#ifndef TREESPEC_COMMON_CUDA_KERNELS_TREE_ATTENTION_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_TREE_ATTENTION_CUH_

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda/kernels/common.cuh"
#include "common/cuda/kernels/mma.cuh"
#include "common/cuda/kernels/tree_attention_merge.cuh"
#include "common/cuda/kernels/wgmma.cuh"
#include "common/cuda/paged_kv.h"
#include "common/cuda/tree_attention_plan.h"

namespace treespec::gpu::kernels {

template <int kRows>
__host__ __device__ constexpr int AttnThreads() {
  return kRows / 16 * 32;
}

// Shared memory one CTA may use: 99 KiB, what sm_120 (RTX PRO 6000 Blackwell) allows per block,
// so one build serves it and sm_90a (227 KiB per SM).
inline constexpr int kAttnMaxSharedBytes = 99 * 1024;

// Pipeline depth: 4 stages, or as many as fit kAttnMaxSharedBytes beside the Q tile (2 at head dim
// 128). The kernel is issue-bound, not short of bytes in flight, so 2 stages at head dim 128 are at
// least as fast as 3 (64-row tiles) or 6 (128-row tiles) at every point of the attention bench, and
// stages of 32 keys (5 or 4 in the same memory) are no faster than stages of 64. The wgmma path
// keeps the same depth: 3 stages (64-row tiles, two CTAs per SM) or 4 (128-row) in more of sm_90's
// shared memory are slower (measured on the H200: docs/experiments/README.md, 'the attention's
// pipeline depth').

// The wgmma path's tiles start 1024-byte aligned: that much more shared memory, for the padding.
template <bool kWgmma>
__host__ __device__ constexpr int AttnAlignBytes() {
  return kWgmma ? 1024 : 0;
}

template <int kHeadDim, int kRows, bool kWgmma = false>
__host__ __device__ constexpr int AttnStages() {
  constexpr int kFit = (kAttnMaxSharedBytes - AttnAlignBytes<kWgmma>() - kRows * kHeadDim * 2) /
                       (2 * kAttnTileKeys * kHeadDim * 2);
  static_assert(kFit >= 2, "the pipeline needs two stages");
  return kFit < 4 ? kFit : 4;
}

struct TreeAttentionArgs {
  const __nv_bfloat16* q;  // [query rows, num_q_heads, D]
  __nv_bfloat16* out;      // [query rows, num_q_heads, D]
  KvLayerView kv;
  const AttnSeqInfo* seqs;
  const AttnWorkItem* items;  // item_slots of them, the first *num_items in use
  const int32_t* num_items;   // CTAs past *num_items exit (the grid may be a fixed capacity)
  const int32_t* page_table;
  const uint64_t* masks;
  float* partial_out;   // [partial slots, kRows, D]
  float* partial_lse;   // [partial slots, kRows], log2 domain
  int* merge_counters;  // [item_slots]: per tile merged by its last CTA, 0 between launches
  int item_slots;
  int num_q_heads;
  int group_size;
  int q_head_shift;
  float scale_log2;  // softmax scale × log2(e)
};

// Q tile, then the K and V stages.
template <int kHeadDim, int kRows, bool kWgmma = false>
__host__ __device__ constexpr int AttnSharedBytes() {
  return AttnAlignBytes<kWgmma>() +
         (kRows + 2 * AttnStages<kHeadDim, kRows, kWgmma>() * kAttnTileKeys) * kHeadDim * 2;
}

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows, kHeadDim] tile.
template <int kHeadDim>
__device__ __forceinline__ int SwizzledOffset(int row, int chunk) {
  constexpr int kChunks = kHeadDim / 8;
  static_assert(kChunks == 4 || kChunks % 8 == 0, "head_dim is 32 or a multiple of 64");
  const int phys = kChunks >= 8 ? (chunk ^ (row & 7)) : (chunk ^ ((row >> 1) & 3));
  return row * kHeadDim + phys * 8;
}

// The element offset of chunk `chunk` of row `row` in a tile of kRowsTotal rows: row-major
// swizzled rows (mma.sync path) or 128-byte-swizzled halves (wgmma path).
template <int kHeadDim, int kRowsTotal, bool kWgmma>
__device__ __forceinline__ int TileOffset(int row, int chunk) {
  if constexpr (kWgmma) {
    return GmmaTileOffset<kRowsTotal>(row, chunk);
  } else {
    return SwizzledOffset<kHeadDim>(row, chunk);
  }
}

// 2^x by the hardware's approximation (relative error ~2^-22; 2^-inf = 0, as the softmax of
// masked keys needs).
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Bits 0..n-1 of a word (none for n <= 0, all for n >= 64).
__device__ __forceinline__ uint64_t LowBits(int n) {
  return n <= 0 ? 0 : n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
}

__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Partial rows a CTA's shared memory holds for the merge by the tile's last CTA: every split's
// rows (kHeadDim floats) and log-sum-exps, in the memory of the Q tile and the pipeline stages.
template <int kHeadDim, int kRows, bool kWgmma>
__host__ __device__ constexpr int AttnFusedMergeCapacity() {
  return (AttnSharedBytes<kHeadDim, kRows, kWgmma>() - AttnAlignBytes<kWgmma>()) /
         ((kHeadDim + 1) * 4);
}

// The end of a CTA of a tile that its last CTA merges (AttnWorkItem::merge_counter >= 0; the plan
// keeps valid rows × splits within AttnFusedMergeCapacity), after the CTA stored its partial
// rows: the CTA counts itself in, and the last of the tile's splits to do so copies every split's
// partial rows and log-sum-exps into `smem` (all loads in flight at once), combines them by
// log-sum-exp in split order (so the bits do not depend on which CTA came last), writes the
// output rows and re-arms the counter. A thread takes one (row, 4 columns) at a time.
template <int kHeadDim>
__device__ __forceinline__ void MergeSplitsIfLast(const TreeAttentionArgs& args,
                                                  const AttnWorkItem& item, const AttnSeqInfo& seq,
                                                  int q_head0, int heads_here, int rows_here,
                                                  int tile_rows, float* smem) {
  constexpr int kColGroups = kHeadDim / 4;  // float4 columns
  __shared__ int last;
  __threadfence();  // this CTA's partials, before its count
  __syncthreads();  // (and every warp is done with the pipeline's shared memory)
  if (threadIdx.x == 0) {
    last = atomicAdd(args.merge_counters + item.merge_counter, 1) == item.num_splits - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // the other splits' partials, after their counts
  const int splits = item.num_splits, rows = rows_here;
  const int64_t row0 = static_cast<int64_t>(item.partial_base) * tile_rows;
  float* const values = smem;                           // [splits][rows][kHeadDim]
  float* const lses = smem + splits * rows * kHeadDim;  // [splits][rows]
  for (int idx = threadIdx.x; idx < splits * rows * kColGroups; idx += blockDim.x) {
    const int col = idx % kColGroups, sr = idx / kColGroups;  // sr = split * rows + row
    const int sp = sr / rows, r = sr % rows;
    CpAsync16(SharedAddress(values + sr * kHeadDim + col * 4),
              args.partial_out + (row0 + sp * tile_rows + r) * kHeadDim + col * 4, 16);
  }
  CpAsyncCommit();
  for (int sr = threadIdx.x; sr < splits * rows; sr += blockDim.x) {
    lses[sr] = __ldcg(args.partial_lse + row0 + (sr / rows) * tile_rows + sr % rows);
  }
  CpAsyncWait<0>();
  __syncthreads();
  for (int task = threadIdx.x; task < rows * kColGroups; task += blockDim.x) {
    const int r = task / kColGroups, col = (task % kColGroups) * 4;
    float lse_max = -INFINITY;
    for (int sp = 0; sp < splits; ++sp) lse_max = fmaxf(lse_max, lses[sp * rows + r]);
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float sum = 0.0f;
#pragma unroll 4
    for (int sp = 0; sp < splits; ++sp) {
      const float lse = lses[sp * rows + r];
      // -inf: the split saw no visible key for this row.
      const float w = lse == -INFINITY ? 0.0f : exp2f(lse - lse_max);
      const float4 x = *reinterpret_cast<const float4*>(values + (sp * rows + r) * kHeadDim + col);
      sum += w;
      acc.x += w * x.x;
      acc.y += w * x.y;
      acc.z += w * x.z;
      acc.w += w * x.w;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    __nv_bfloat16* const dst = args.out +
                               AttnOutOffset(seq.q_row_begin, item.row_begin + r, heads_here,
                                             args.num_q_heads, q_head0, kHeadDim) +
                               col;
    *reinterpret_cast<uint2*>(dst) =
        make_uint2(PackBf16(acc.x * inv, acc.y * inv), PackBf16(acc.z * inv, acc.w * inv));
  }
  if (threadIdx.x == 0) args.merge_counters[item.merge_counter] = 0;  // for the next launch
}

template <int kHeadDim, int kRows, bool kWgmma>
__global__ void __launch_bounds__(AttnThreads<kRows>())
    TreeAttentionKernel(const TreeAttentionArgs args) {
  AllowDependentLaunch();  // the next GEMM may start loading its weights
  constexpr int D = kHeadDim;
  constexpr int kAttnThreads = AttnThreads<kRows>();
  constexpr int kStages = AttnStages<D, kRows, kWgmma>();
  static_assert(!kWgmma || D == 64 || D == 128, "the wgmma path takes head dim 64 or 128");
  constexpr int kChunks = D / 8;                 // 16-byte chunks per row
  constexpr int kKTiles = D / 16;                // k steps of Q·Kᵀ
  constexpr int kNTiles = kAttnTileKeys / 8;     // 8-key column tiles of S
  constexpr int kDTiles = D / 8;                 // 8-wide column tiles of O
  constexpr int kTileElems = kAttnTileKeys * D;  // one K or V stage
  // Each thread copies the same chunk column of kKeysPerThread keys of every key tile.
  constexpr int kKeysPerThread = kAttnTileKeys * kChunks / kAttnThreads;
  constexpr int kKeyStride = kAttnThreads / kChunks;
  static_assert(kAttnThreads % kChunks == 0 && kKeysPerThread * kKeyStride == kAttnTileKeys);

  // The item is loaded beside the count (not after it), and holds what the first K/V tile needs,
  // so the sequence's info loads while the page ids do.
  const int bid = blockIdx.x;
  const AttnWorkItem item = bid < args.item_slots ? args.items[bid] : AttnWorkItem{};
  if (bid >= *args.num_items) return;
  const AttnSeqInfo seq = args.seqs[item.seq];
  const int q_head0 = max(0, item.kv_head * args.group_size - args.q_head_shift);
  const int heads_here =
      min(args.num_q_heads, (item.kv_head + 1) * args.group_size - args.q_head_shift) - q_head0;
  const int rows_total = (seq.num_nodes - seq.first_query) * heads_here;
  const int rows_here = min(kRows, rows_total - item.row_begin);

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t smem_pad = kWgmma ? (1024 - (SharedAddress(smem_raw) & 1023)) & 1023 : 0;
  __nv_bfloat16* const q_smem = reinterpret_cast<__nv_bfloat16*>(smem_raw + smem_pad);
  __nv_bfloat16* const k_smem = q_smem + kRows * D;             // [stages][tile]
  __nv_bfloat16* const v_smem = k_smem + kStages * kTileElems;  // [stages][tile]

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

  // K/V tiles: the page ids of a tile are read one tile before its copies are issued, so the
  // page-table lookup never stalls the copy engine of the pipeline.
  const int num_key_tiles = (item.key_end - item.key_begin + kAttnTileKeys - 1) / kAttnTileKeys;
  const int my_chunk = tid % kChunks, my_key = tid / kChunks;
  const int* const pages = args.page_table + item.page_begin;
  const int page_shift = __ffs(args.kv.page_size) - 1;  // page sizes are powers of two
  const int slot_mask = args.kv.page_size - 1;
  constexpr int kKeysPerPage = kKeyStride >= 16 ? 1 : 16 / kKeyStride;
  constexpr int kRowBytes = kWgmma ? 128 : D * 2;  // between rows of a K/V stage
  static_assert(kKeyStride % 8 == 0, "a thread's keys share their swizzle (row % 8)");
  constexpr int kPageLoads = kKeysPerThread / kKeysPerPage;
  constexpr int kStageBytes = kTileElems * 2;
  // A thread copies keys my_key + j·kKeyStride of every 64-key tile, and everything of those copies
  // that does not depend on the tile is worked out here, once (recomputed per tile, it would be
  // ~240 of the ~550 instructions a warp issues per tile: docs/experiments/README.md, 'the tree
  // attention's copy addresses worked out once'). A tile's first key is a multiple of 64,
  // kKeyStride a multiple of 8, and pages hold >= 16 keys, so the thread's keys fall in groups of
  // kKeysPerPage, one page each (two keys when the stride is 8: head dim 128 with 4 warps). Group
  // p's page-table entry is (the tile's first key >> page_shift) + page_step[p], and its first key
  // sits (the tile's first key & slot_mask) slots (0 unless pages exceed 64 keys) plus slot_off[p]
  // bytes into that page, key q of the group q·kKeyStride slots further. Page bytes fit 32 bits
  // (TreeAttention::Create).
  const uint32_t page_bytes =
      static_cast<uint32_t>(args.kv.num_kv_heads * args.kv.page_size * D * 2);
  int key_off[kPageLoads], page_step[kPageLoads];
  uint32_t slot_off[kPageLoads];
#pragma unroll
  for (int p = 0; p < kPageLoads; ++p) {
    key_off[p] = my_key + p * kKeysPerPage * kKeyStride;
    page_step[p] = key_off[p] >> page_shift;
    slot_off[p] = static_cast<uint32_t>((key_off[p] & slot_mask) * D * 2);
  }
  const char* const k_base =
      reinterpret_cast<const char*>(args.kv.k) +
      (static_cast<int64_t>(item.kv_head) * args.kv.page_size * D + my_chunk * 8) * 2;
  const int64_t v_minus_k =
      reinterpret_cast<const char*>(args.kv.v) - reinterpret_cast<const char*>(args.kv.k);
  const uint32_t k_smem0 =
      SharedAddress(k_smem + TileOffset<D, kAttnTileKeys, kWgmma>(my_key, my_chunk));
  const uint32_t v_smem0 = k_smem0 + kStages * kStageBytes;  // v_smem = k_smem + the K stages
  auto fetch_pages = [&](int tile, int(&page)[kPageLoads]) {
    const int tile_key0 = item.key_begin + tile * kAttnTileKeys;
    const int keys_left = tile < num_key_tiles ? item.key_end - tile_key0 : 0;
    const int page0 = tile_key0 >> page_shift;
#pragma unroll
    for (int p = 0; p < kPageLoads; ++p) {
      page[p] = key_off[p] < keys_left ? pages[page0 + page_step[p]] : 0;
    }
  };
  // The copies of key tile `tile`'s K rows (with_k) and V rows (with_v) into their stages.
  auto issue_copies = [&](int tile, const int(&page)[kPageLoads], bool with_k, bool with_v) {
    const uint32_t stage_bytes = static_cast<uint32_t>(tile % kStages) * kStageBytes;
    const uint32_t ks = k_smem0 + stage_bytes, vs = v_smem0 + stage_bytes;
    const int tile_key0 = item.key_begin + tile * kAttnTileKeys;
    const int keys_left = item.key_end - tile_key0;  // keys of the tile below key_end
    const uint32_t tile_off =
        static_cast<uint32_t>((tile_key0 & slot_mask) * D * 2);  // 0 unless pages exceed 64 keys
#pragma unroll
    for (int p = 0; p < kPageLoads; ++p) {
      const char* const k_at = k_base +
                               static_cast<uint64_t>(static_cast<uint32_t>(page[p])) * page_bytes +
                               (slot_off[p] + tile_off);
      const char* const v_at = k_at + v_minus_k;
#pragma unroll
      for (int q = 0; q < kKeysPerPage; ++q) {
        const int j = p * kKeysPerPage + q;
        const int bytes = key_off[p] + q * kKeyStride < keys_left ? 16 : 0;
        if (with_k)
          CpAsync16(ks + j * kKeyStride * kRowBytes, k_at + q * kKeyStride * D * 2, bytes);
        if (with_v)
          CpAsync16(vs + j * kKeyStride * kRowBytes, v_at + q * kKeyStride * D * 2, bytes);
      }
    }
  };
  // Programmatic dependent launch: the plan, the page table and the committed prefix's K/V were
  // written before the previous kernel (RoPE + K/V write) started, so the first tile streams in
  // while it runs when it lies wholly in the prefix; q and the tree's K/V slots are read only
  // after griddepcontrol.wait.
  int next_pages[kPageLoads];
  fetch_pages(0, next_pages);
  const bool first_tile_early =
      num_key_tiles > 0 && min(item.key_end, item.key_begin + kAttnTileKeys) <= item.prefix_len;
  if (first_tile_early) issue_copies(0, next_pages, true, true);
  WaitForPriorGrid();
  // Query tile: row r is node first_query + (row_begin + r) / heads_here, head
  // q_head0 + (row_begin + r) % heads_here; rows past the end read zeros.
  for (int idx = tid; idx < kRows * kChunks; idx += kAttnThreads) {
    const int r = idx / kChunks, chunk = idx % kChunks;
    const int tr = item.row_begin + r;
    const bool valid = r < rows_here;
    const int node_row = valid ? tr / heads_here : 0;  // query index within the sequence
    const int head = q_head0 + (valid ? tr % heads_here : 0);
    const __nv_bfloat16* src =
        args.q + (static_cast<int64_t>(seq.q_row_begin + node_row) * args.num_q_heads + head) * D +
        chunk * 8;
    CpAsync16(SharedAddress(q_smem + TileOffset<D, kRows, kWgmma>(r, chunk)), src, valid ? 16 : 0);
  }
  if (!first_tile_early && num_key_tiles > 0) issue_copies(0, next_pages, true, true);
  CpAsyncCommit();  // Q and the first tile
  // The wgmma path computes S of the next tile before the softmax of this one, so K runs one
  // tile ahead of V: group u (u >= 0) holds K of tile u + 1 and V of tile u (V of tile 0 came
  // with Q), and v_pages are the page ids of the V tile to issue next. The mma.sync path keeps
  // K and V of a tile in one group (group t, t >= 1, holds tile t).
  int v_pages[kPageLoads];
#pragma unroll
  for (int t = kWgmma ? 0 : 1; t < kStages - 1; ++t) {
#pragma unroll
    for (int p = 0; p < kPageLoads; ++p) v_pages[p] = next_pages[p];
    const int k_tile = kWgmma ? t + 1 : t;
    fetch_pages(k_tile, next_pages);
    if (k_tile < num_key_tiles) issue_copies(k_tile, next_pages, true, !kWgmma);
    if (kWgmma && t >= 1 && t < num_key_tiles) issue_copies(t, v_pages, false, true);
    CpAsyncCommit();  // empty past the last tile
  }
#pragma unroll
  for (int p = 0; p < kPageLoads; ++p) v_pages[p] = next_pages[p];
  fetch_pages(kWgmma ? kStages : kStages - 1, next_pages);

  // This thread's two rows of the warp's 16: g and g + 8.
  const int g = lane / 4, c = 2 * (lane % 4);
  int node[2];
  bool row_valid[2];
  const uint64_t* mask_rows[2] = {nullptr, nullptr};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = warp * 16 + g + 8 * i;
    row_valid[i] = r < rows_here;
    node[i] = row_valid[i] ? seq.first_query + (item.row_begin + r) / heads_here : -1;
    if (seq.mask_begin >= 0 && row_valid[i]) {
      mask_rows[i] = args.masks + seq.mask_begin + static_cast<int64_t>(node[i]) * seq.mask_words;
    }
  }

  uint32_t q_frag[kWgmma ? 1 : kKTiles][4];  // (the wgmma path reads Q from shared memory)
  float o[kDTiles][4];
#pragma unroll
  for (int t = 0; t < kDTiles; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
  // Running max of the raw scores (the scale is applied inside exp2) and this thread's share
  // of the running sum, per row.
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};

  // The wgmma path's accumulators as the flat register arrays the instructions take: element
  // (8-column tile t, e) is [4t + e], the layout of the mma.sync arrays.
  float(&o_flat)[kDTiles * 4] = reinterpret_cast<float(&)[kDTiles * 4]>(o);
  const int warpgroup = kRows == 64 ? 0 : warp / 4;
  // The wgmma path's descriptors of the warpgroup's Q rows and of stage 0's K and V; a stage or a
  // k step moves them by its byte offset (GmmaDescriptorPlus).
  const uint64_t q_desc0 = GmmaDescriptor(SharedAddress(q_smem) + warpgroup * 64 * 128, 16, 1024);
  const uint64_t k_desc0 = GmmaDescriptor(SharedAddress(k_smem), 16, 1024);
  const uint64_t v_desc0 = GmmaDescriptor(SharedAddress(v_smem), kAttnTileKeys * 128, 1024);

  // S = Q·Kᵀ of key tile `tile` for the warpgroup's 64 rows (the wgmma path), issued and not
  // waited for: all four warps issue it (padding rows too).
  auto issue_s = [&](int tile, float(&s)[kNTiles][4]) {
    float(&s_flat)[kNTiles * 4] = reinterpret_cast<float(&)[kNTiles * 4]>(s);
#pragma unroll
    for (int i = 0; i < kNTiles * 4; ++i) s_flat[i] = 0.0f;  // (overwritten: defined inputs)
    const uint64_t k_desc = GmmaDescriptorPlus(k_desc0, (tile % kStages) * kStageBytes);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kKTiles; ++kk) {
      const uint32_t at = (kk % 4) * 32;  // k16 step along the 128-byte row
      const uint64_t desc_q = GmmaDescriptorPlus(q_desc0, (kk / 4) * kRows * 128 + at);
      const uint64_t desc_k = GmmaDescriptorPlus(k_desc, (kk / 4) * kAttnTileKeys * 128 + at);
      WgmmaM64N64K16SS(s_flat, desc_q, desc_k, kk > 0);
    }
    WgmmaCommit();
  };
  auto pin_s = [&](float(&s)[kNTiles][4]) {
    WgmmaPinRegisters(reinterpret_cast<float(&)[kNTiles * 4]>(s));
  };
  // O += P · V of key tile `tile` (the wgmma path), issued and not waited for. P's accumulator
  // layout is the A-fragment layout of m16n8k16, which wgmma's register A operand takes.
  auto issue_pv = [&](int tile, const uint32_t(&p)[kNTiles][2]) {
    const uint64_t v_desc = GmmaDescriptorPlus(v_desc0, (tile % kStages) * kStageBytes);
    WgmmaPinRegisters(o_flat);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kAttnTileKeys / 16; ++kk) {
      const uint32_t a[4] = {p[2 * kk][0], p[2 * kk][1], p[2 * kk + 1][0], p[2 * kk + 1][1]};
      // 16 keys = two groups of 8 rows; the 64-column halves are 64 rows × 128 bytes apart.
      const uint64_t desc_v = GmmaDescriptorPlus(v_desc, kk * 16 * 128);
      if constexpr (D == 128) {
        WgmmaM64N128K16RS(o_flat, a, desc_v, 1);
      } else if constexpr (D == 64) {
        WgmmaM64N64K16RS(o_flat, a, desc_v, 1);
      }
    }
    WgmmaCommit();
  };
  // Key tiles from first_masked on reach the tree slots or the end of the range, so that some of
  // their keys are hidden from some rows (the mask is applied to those only).
  const int first_masked = min(
      num_key_tiles, max(0, (min(item.key_end, seq.prefix_len) - item.key_begin) / kAttnTileKeys));
  // Which of a key tile's 64 keys row g + 8i sees, as bits (bit k: key key0 + k): the committed
  // prefix, and the row's tree keys (its ancestor-mask bits from the tile's first tree key on,
  // at most two words, or the chain's 0..node), all below key_end. Worked out once per row and
  // tile, so the per-score mask is a bit test (a test of every score, with its mask word loaded
  // for each, would make the masked step three times the size of the unmasked one).
  auto visible_keys = [&](int key0, int i) -> uint64_t {
    static_assert(kAttnTileKeys == 64, "a tile's keys are the bits of one word");
    const int j0 = key0 - seq.prefix_len;  // tree index of the tile's key 0 (< 0: in the prefix)
    uint64_t tree = 0;
    if (!row_valid[i] || j0 <= -64) {
      // a padding row sees no tree key; a tile wholly in the prefix has none
    } else if (mask_rows[i] == nullptr) {
      tree = LowBits(node[i] + 1 - j0);  // j <= node: k <= node - j0 (k < -j0 is the prefix)
    } else if (j0 < 0) {
      tree = mask_rows[i][0] << -j0;  // tree key j = 0 is k = -j0
    } else {
      const int w = j0 / 64, shift = j0 % 64;
      tree = mask_rows[i][w] >> shift;
      if (shift != 0 && w + 1 < seq.mask_words) tree |= mask_rows[i][w + 1] << (64 - shift);
    }
    return (LowBits(-j0) | tree) & LowBits(item.key_end - key0);
  };
  // Sets the scores of keys a row does not see to -inf.
  auto apply_mask = [&](int tile, float(&s)[kNTiles][4]) {
    const int key0 = item.key_begin + tile * kAttnTileKeys;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint64_t visible = visible_keys(key0, i) >> c;  // bit t * 8 + e: column (t, e)
#pragma unroll
      for (int t = 0; t < kNTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (((visible >> (t * 8 + e)) & 1) == 0) s[t][2 * i + e] = -INFINITY;
        }
      }
    }
  };
  // The online softmax in fp32 of a key tile's (masked) scores: s becomes P in place, and
  // `correction` the factors O's rows need before P·V adds to them (rescale_o).
  auto softmax = [&](float(&s)[kNTiles][4], float(&correction)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float row_max = -INFINITY;
#pragma unroll
      for (int t = 0; t < kNTiles; ++t)
        row_max = fmaxf(row_max, fmaxf(s[t][2 * i], s[t][2 * i + 1]));
      const float m_new = fmaxf(m[i], QuadMax(row_max));
      // A row with nothing visible yet keeps p = 0 (exp2(-inf)) without NaNs.
      const float offset = m_new == -INFINITY ? 0.0f : m_new * args.scale_log2;
      correction[i] = FastExp2(fmaf(m[i], args.scale_log2, -offset));
      m[i] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int t = 0; t < kNTiles; ++t) {
        s[t][2 * i] = FastExp2(fmaf(s[t][2 * i], args.scale_log2, -offset));
        s[t][2 * i + 1] = FastExp2(fmaf(s[t][2 * i + 1], args.scale_log2, -offset));
        sum += s[t][2 * i] + s[t][2 * i + 1];
      }
      l[i] = l[i] * correction[i] + sum;
    }
  };
  // P rounded to bf16 pairs, [n tile][row g, row g + 8]: the A fragments of P·V.
  auto pack_p = [&](const float(&s)[kNTiles][4], uint32_t(&p)[kNTiles][2]) {
#pragma unroll
    for (int t = 0; t < kNTiles; ++t) {
      p[t][0] = PackBf16(s[t][0], s[t][1]);
      p[t][1] = PackBf16(s[t][2], s[t][3]);
    }
  };
  // Rescales O only when some row's max moved (after the first tiles it rarely does; the
  // correction is then exactly 1).
  auto rescale_o = [&](const float(&correction)[2]) {
    if (__any_sync(0xffffffffu, correction[0] != 1.0f || correction[1] != 1.0f)) {
#pragma unroll
      for (int t = 0; t < kDTiles; ++t) {
        o[t][0] *= correction[0];
        o[t][1] *= correction[0];
        o[t][2] *= correction[1];
        o[t][3] *= correction[1];
      }
    }
  };

  if constexpr (kWgmma) {
    // A software pipeline per warpgroup: S of tile t + 1 and P·V of tile t are issued back to back,
    // and the softmax of tile t + 1 starts while P·V is in flight, so the tensor cores work through
    // the softmax instead of waiting for it (S, softmax, P·V, each waited for, would leave them
    // idle through every softmax). ptxas places the wait for P·V after the softmax's row maxima
    // and first exponentials, not after all of it, whatever the order in the source (SASS and
    // measurements: docs/experiments/README.md, 'S of the next tile issued with P·V').
    const bool computes = warpgroup * 64 < rows_here;  // else: copies only
    float s[kNTiles][4];
    uint32_t p[kNTiles][2];
    float correction[2];
    if (num_key_tiles > 0) {
      CpAsyncWait<kStages - 1>();  // Q, and K and V of tile 0
      FenceProxyAsyncShared();     // the copies, to the tensor cores' reads
      __syncthreads();
      if (computes) {
        issue_s(0, s);
        WgmmaWait<0>();
        pin_s(s);
        if (first_masked == 0) apply_mask(0, s);
        softmax(s, correction);  // s holds P of tile 0, packed by its step
      }
    }
    // One tile's step. `more` and `mask_next` (compile-time bools) say that a next tile exists
    // and that it needs the mask. As runtime branches between the wgmma waits, they would make
    // ptxas serialize every wgmma of the kernel (S's registers read on a path where S might be in
    // flight) or wait for P·V at the mask's branch, ahead of the softmax.
    auto step = [&](int tile, auto more, auto mask_next) {
      CpAsyncWait<kStages - 2>();  // K of tile + 1, V of tile
      FenceProxyAsyncShared();
      __syncthreads();  // all are done with S of tile and P·V of tile - 1: their slots are free
      if (tile + kStages < num_key_tiles) issue_copies(tile + kStages, next_pages, true, false);
      if (tile + kStages - 1 < num_key_tiles)
        issue_copies(tile + kStages - 1, v_pages, false, true);
      CpAsyncCommit();
#pragma unroll
      for (int i = 0; i < kPageLoads; ++i) v_pages[i] = next_pages[i];
      fetch_pages(tile + kStages + 1, next_pages);
      if (!computes) return;
      pack_p(s, p);  // P of tile, which s holds in fp32 since the softmax
      if constexpr (decltype(more)::value) issue_s(tile + 1, s);
      rescale_o(correction);
      issue_pv(tile, p);
      if constexpr (decltype(more)::value) {
        WgmmaWait<1>();  // S of tile + 1; P·V of tile stays in flight
        pin_s(s);
        if constexpr (decltype(mask_next)::value) apply_mask(tile + 1, s);
        softmax(s, correction);
      }
      WgmmaWait<0>();  // P·V of tile: its P registers are free
      WgmmaPinRegisters(o_flat);
    };
    int tile = 0;
    for (; tile + 1 < first_masked; ++tile) step(tile, std::true_type{}, std::false_type{});
    for (; tile + 1 < num_key_tiles; ++tile) step(tile, std::true_type{}, std::true_type{});
    if (num_key_tiles > 0) step(num_key_tiles - 1, std::false_type{}, std::false_type{});
  } else {
    for (int tile = 0; tile < num_key_tiles; ++tile) {
      CpAsyncWait<kStages - 2>();
      __syncthreads();  // tile's stage is full; every warp is done with the previous stage
      if (tile + kStages - 1 < num_key_tiles) {
        issue_copies(tile + kStages - 1, next_pages, true, true);
      }
      CpAsyncCommit();
      fetch_pages(tile + kStages, next_pages);
      if (warp * 16 >= rows_here) continue;  // this warp's rows are all padding: copies only
      const __nv_bfloat16* const ks = k_smem + (tile % kStages) * kTileElems;
      const __nv_bfloat16* const vs = v_smem + (tile % kStages) * kTileElems;

      // S = Q · Kᵀ for the warp's 16 rows × the tile's keys.
      if (tile == 0) {
#pragma unroll
        for (int kk = 0; kk < kKTiles; ++kk) {
          const int mi = lane / 8;
          const int r = warp * 16 + (lane % 8) + (mi % 2) * 8;
          LdMatrixX4(q_frag[kk], SharedAddress(q_smem + SwizzledOffset<D>(r, kk * 2 + mi / 2)));
        }
      }
      float s[kNTiles][4];
#pragma unroll
      for (int t = 0; t < kNTiles; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKTiles; ++kk) {
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
          const int mi = lane / 8;
          const int key_row = (2 * np + mi / 2) * 8 + lane % 8;
          uint32_t b[4];
          LdMatrixX4(b, SharedAddress(ks + SwizzledOffset<D>(key_row, kk * 2 + mi % 2)));
          MmaBf16(s[2 * np], q_frag[kk], b[0], b[1]);
          MmaBf16(s[2 * np + 1], q_frag[kk], b[2], b[3]);
        }
      }

      float correction[2];
      if (tile >= first_masked) apply_mask(tile, s);
      softmax(s, correction);
      rescale_o(correction);
      uint32_t p[kNTiles][2];
      pack_p(s, p);

      // O += P · V.
#pragma unroll
      for (int kk = 0; kk < kAttnTileKeys / 16; ++kk) {
        const uint32_t a[4] = {p[2 * kk][0], p[2 * kk][1], p[2 * kk + 1][0], p[2 * kk + 1][1]};
#pragma unroll
        for (int dp = 0; dp < kDTiles / 2; ++dp) {
          const int mi = lane / 8;
          const int key_row = kk * 16 + (mi % 2) * 8 + lane % 8;
          uint32_t b[4];
          LdMatrixX4Trans(b, SharedAddress(vs + SwizzledOffset<D>(key_row, 2 * dp + mi / 2)));
          MmaBf16(o[2 * dp], a, b[0], b[1]);
          MmaBf16(o[2 * dp + 1], a, b[2], b[3]);
        }
      }
    }
  }
  CpAsyncWait<0>();  // (the last stages' copies are empty groups past the range)

  // Finish: full row sums, then the output or this split's partial result.
  float inv_l[2];
  for (int i = 0; i < 2; ++i) {
    l[i] = QuadSum(l[i]);
    inv_l[i] = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
  }
  for (int i = 0; i < 2; ++i) {
    if (!row_valid[i]) continue;
    const int r = warp * 16 + g + 8 * i;
    if (item.num_splits == 1) {
      __nv_bfloat16* const dst = args.out +
                                 AttnOutOffset(seq.q_row_begin, item.row_begin + r, heads_here,
                                               args.num_q_heads, q_head0, D) +
                                 c;
#pragma unroll
      for (int t = 0; t < kDTiles; ++t) {
        *reinterpret_cast<__nv_bfloat162*>(dst + t * 8) =
            __floats2bfloat162_rn(o[t][2 * i] * inv_l[i], o[t][2 * i + 1] * inv_l[i]);
      }
      continue;
    }
    const int slot = item.partial_base + item.split;
    float* const dst = args.partial_out + (static_cast<int64_t>(slot) * kRows + r) * D + c;
#pragma unroll
    for (int t = 0; t < kDTiles; ++t) {
      __stcg(reinterpret_cast<float2*>(dst + t * 8),
             make_float2(o[t][2 * i] * inv_l[i], o[t][2 * i + 1] * inv_l[i]));
    }
    if (lane % 4 == 0) {
      __stcg(args.partial_lse + static_cast<int64_t>(slot) * kRows + r,
             l[i] > 0.0f ? fmaf(m[i], args.scale_log2, log2f(l[i])) : -INFINITY);
    }
  }
  if (item.num_splits > 1 && item.merge_counter >= 0) {
    MergeSplitsIfLast<D>(args, item, seq, q_head0, heads_here, rows_here, kRows,
                         reinterpret_cast<float*>(q_smem));
  }
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_TREE_ATTENTION_CUH_
