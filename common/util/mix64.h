// splitmix64's finalizer: a cheap, bijective, well-mixed 64-bit hash step, for keys and
// counter-based random values.
#ifndef TREESPEC_COMMON_UTIL_MIX64_H_
#define TREESPEC_COMMON_UTIL_MIX64_H_

#include <cstdint>

namespace treespec {

// splitmix64's increment (2^64 / the golden ratio), to step a counter or seed before mixing.
inline constexpr uint64_t kGolden64 = 0x9e3779b97f4a7c15ull;

inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace treespec

#endif  // TREESPEC_COMMON_UTIL_MIX64_H_
