// Keeps the services' large, short-lived buffers in the heap. A commit of target features is
// megabytes of strings and gRPC slices allocated on one thread and freed on another every step;
// under glibc's defaults each such block is a fresh mmap (or a heap grown and trimmed again), and
// first touching its pages costs more than the copy itself: on the 2-core development VM a
// Qwen3-8B-sized commit (240 KB) took 2.2 ms of the engine thread, 0.2 ms with the heap kept
// (treespec-feature-wire-bench; docs/experiments/2026-12-06-feature-wire.md).
#ifndef TREESPEC_COMMON_UTIL_MALLOC_TUNING_H_
#define TREESPEC_COMMON_UTIL_MALLOC_TUNING_H_

namespace treespec {

// Call first in main(), before any thread starts. With glibc: blocks up to 32 MiB (the largest
// threshold glibc takes) come from the heap, not mmap, and the heap is returned to the system
// only above 256 MiB of free space at its top. Elsewhere (another libc, a sanitizer's allocator)
// it does nothing. Returns whether the settings took.
bool KeepLargeBuffersInHeap();

}  // namespace treespec

#endif  // TREESPEC_COMMON_UTIL_MALLOC_TUNING_H_
