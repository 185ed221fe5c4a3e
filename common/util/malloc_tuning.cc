#include "common/util/malloc_tuning.h"

#include <cstdlib>  // defines __GLIBC__ under glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace treespec {

bool KeepLargeBuffersInHeap() {
#if defined(__GLIBC__)
  // Setting either threshold also turns off glibc's own adjustment of the mmap threshold.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 256 << 20) == 1;
  return mmap_ok && trim_ok;
#else
  return false;
#endif
}

}  // namespace treespec
