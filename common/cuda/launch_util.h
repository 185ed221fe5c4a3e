// Host-side helpers for the launchers in this folder (not part of their public API).
#ifndef TREESPEC_COMMON_CUDA_LAUNCH_UTIL_H_
#define TREESPEC_COMMON_CUDA_LAUNCH_UTIL_H_

#include <cstdint>

namespace treespec::gpu::internal {

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Threads for a kernel whose block walks `work` items of one row: enough whole warps to give
// each thread one item, at most `max_threads` (a multiple of 32).
inline int RowBlockThreads(int64_t work, int max_threads) {
  const int64_t warps = CeilDiv(work, 32);
  return static_cast<int>(warps * 32 < max_threads ? warps * 32 : max_threads);
}

}  // namespace treespec::gpu::internal

#endif  // TREESPEC_COMMON_CUDA_LAUNCH_UTIL_H_
