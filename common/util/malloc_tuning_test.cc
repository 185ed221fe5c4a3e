#include "common/util/malloc_tuning.h"

#include <cstdlib>  // defines __GLIBC__ under glibc
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "gtest/gtest.h"

namespace treespec {
namespace {

// A 16 MiB block comes from the heap, not from a fresh mmap of its own (glibc's default sends
// every block above 128 KiB to mmap until a free raises that threshold).
TEST(MallocTuningTest, ALargeBlockComesFromTheHeap) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator ignores mallopt";
#elif !defined(__GLIBC__)
  GTEST_SKIP() << "mallopt is glibc's";
#else
  ASSERT_TRUE(KeepLargeBuffersInHeap());
  const size_t mapped_before = mallinfo2().hblks;
  char* block = static_cast<char*>(std::malloc(16 << 20));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, 16 << 20);
  const size_t mapped_after = mallinfo2().hblks;
  std::free(block);
  EXPECT_EQ(mapped_after, mapped_before) << "the 16 MiB block was mmapped";
#endif
}

}  // namespace
}  // namespace treespec
