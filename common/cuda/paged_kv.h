// The GPU paged KV cache of one rank (DESIGN §3 step 1) and how kernels address it.
//
// For every layer, K and V are each [num_pages, num_kv_heads, page_size, head_dim] bf16: one
// (page, KV head) tile holds page_size × head_dim contiguous values, which the attention kernel
// streams with 16-byte async copies. Page ids are those of the host's PagedKvCache (one page
// table shared by every rank); logical slot s of a sequence lives in page pages[s / page_size]
// at offset s % page_size. The pool is allocated once; nothing here allocates per step.
#ifndef TREESPEC_COMMON_CUDA_PAGED_KV_H_
#define TREESPEC_COMMON_CUDA_PAGED_KV_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>  // __host__ __device__

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "common/cuda/device_buffer.h"

namespace treespec::gpu {

// Device pointers of one layer's K and V plus the shape they share.
struct KvLayerView {
  __nv_bfloat16* k = nullptr;
  __nv_bfloat16* v = nullptr;
  int num_pages = 0;
  int page_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;

  // Element offset of (page, head, offset in page, 0) in k or v.
  __host__ __device__ int64_t Offset(int page, int head, int offset) const {
    return ((static_cast<int64_t>(page) * num_kv_heads + head) * page_size + offset) * head_dim;
  }
};

// Page tables of a batch as the kernels read them (device int32 arrays, CSR): sequence b's
// pages are page_table[page_offsets[b] .. page_offsets[b + 1]).
struct DevicePageTables {
  const int32_t* page_table = nullptr;
  const int32_t* page_offsets = nullptr;  // [num_seqs + 1]
};

// K/V storage of every layer of one rank: one allocation, never resized.
class DeviceKvPool {
 public:
  static absl::StatusOr<DeviceKvPool> Create(int num_layers, int num_pages, int page_size,
                                             int num_kv_heads, int head_dim) {
    DeviceKvPool pool;
    pool.num_layers_ = num_layers;
    pool.view_.num_pages = num_pages;
    pool.view_.page_size = page_size;
    pool.view_.num_kv_heads = num_kv_heads;
    pool.view_.head_dim = head_dim;
    auto storage = DeviceBuffer<__nv_bfloat16>::Create(2 * static_cast<size_t>(num_layers) *
                                                       pool.LayerElements());
    if (!storage.ok()) return storage.status();
    pool.storage_ = std::move(storage).value();
    return pool;
  }

  KvLayerView Layer(int layer) {
    KvLayerView view = view_;
    view.k = storage_.data() + 2 * layer * LayerElements();
    view.v = view.k + LayerElements();
    return view;
  }
  int num_layers() const { return num_layers_; }
  int64_t bytes() const { return static_cast<int64_t>(storage_.bytes()); }

 private:
  int64_t LayerElements() const {
    return static_cast<int64_t>(view_.num_pages) * view_.num_kv_heads * view_.page_size *
           view_.head_dim;
  }

  int num_layers_ = 0;
  KvLayerView view_;  // shape only; k and v unset
  DeviceBuffer<__nv_bfloat16> storage_;
};

}  // namespace treespec::gpu

#endif  // TREESPEC_COMMON_CUDA_PAGED_KV_H_
