// Counter-based uniforms for token choice (DESIGN §3 step 3): the device twin of UniformAt in
// common/model/sampling.cc, bit for bit. Plain CUDA C++ for every architecture we build; the
// functions are __host__ __device__ so .cu host code can call them too.
#ifndef TREESPEC_COMMON_CUDA_KERNELS_PHILOX_CUH_
#define TREESPEC_COMMON_CUDA_KERNELS_PHILOX_CUH_

#include <cstdint>

namespace treespec::gpu::kernels {

// Philox-4x32-10 block function (Salmon et al., SC'11), in place on `counter`, with the same
// round constants and word order as sampling.cc's Philox4x32.
__host__ __device__ __forceinline__ void Philox4x32x10(uint32_t counter[4], uint32_t key0,
                                                       uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
#ifdef __CUDA_ARCH__
    const uint32_t hi0 = __umulhi(kMul0, counter[0]), lo0 = kMul0 * counter[0];
    const uint32_t hi1 = __umulhi(kMul1, counter[2]), lo1 = kMul1 * counter[2];
#else
    const uint64_t product0 = static_cast<uint64_t>(kMul0) * counter[0];
    const uint64_t product1 = static_cast<uint64_t>(kMul1) * counter[2];
    const uint32_t hi0 = static_cast<uint32_t>(product0 >> 32),
                   lo0 = static_cast<uint32_t>(product0);
    const uint32_t hi1 = static_cast<uint32_t>(product1 >> 32),
                   lo1 = static_cast<uint32_t>(product1);
#endif
    const uint32_t c0 = hi1 ^ counter[1] ^ key0;
    const uint32_t c2 = hi0 ^ counter[3] ^ key1;
    counter[0] = c0;
    counter[1] = lo1;
    counter[2] = c2;
    counter[3] = lo0;
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
}

// A uniform in [0, 1) keyed by (seed, absolute position): key = (seed low word, seed high
// word), counter = (position low word, position high word, 0, 0); 53 bits of the first two
// output words, u = ((out0 << 21) ^ (out1 >> 11)) * 2^-53. The conversion and the scaling are
// exact, so the result equals UniformAt's bit for bit.
__host__ __device__ __forceinline__ double UniformAt(uint64_t seed, int64_t position) {
  const uint64_t pos = static_cast<uint64_t>(position);
  uint32_t counter[4] = {static_cast<uint32_t>(pos), static_cast<uint32_t>(pos >> 32), 0u, 0u};
  Philox4x32x10(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint64_t bits53 = (static_cast<uint64_t>(counter[0]) << 21) ^ (counter[1] >> 11);
  return static_cast<double>(bits53) * 0x1.0p-53;
}

}  // namespace treespec::gpu::kernels

#endif  // TREESPEC_COMMON_CUDA_KERNELS_PHILOX_CUH_
