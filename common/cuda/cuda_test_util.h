// Scaffolding shared by the GPU tests (label `gpu`, DESIGN §8): a fixture that skips without a
// CUDA device and owns a stream plus a seeded generator, bf16 random data with its fp32 twin,
// poisoned uploads with a guard tail, and status assertions. Test-only; include from *_test.cc.
//
// Tolerances, derived from the precision (u = 2^-8 is bf16's unit roundoff, e = 2^-24 fp32's):
// a kernel computing in fp32 and rounding once to bf16 gives |got - ref| <= u * |ref| + (1 + u) *
// d, where d bounds the GPU's fp32 result's distance from the CPU's fp32 result. Each test states
// its d. Seeds are fresh per run (printed once); TREESPEC_TEST_SEED=n repeats one.
#ifndef TREESPEC_COMMON_CUDA_CUDA_TEST_UTIL_H_
#define TREESPEC_COMMON_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/model/dtype.h"
#include "common/util/status_macros.h"  // TREESPEC_CONCAT_
#include "gtest/gtest.h"

namespace treespec::gpu::testing {

using bf16 = __nv_bfloat16;
static_assert(sizeof(bf16) == 2);

constexpr double kBf16U = 1.0 / 256;        // 2^-8
constexpr double kFp32U = 1.0 / (1 << 24);  // 2^-24
constexpr uint16_t kPoisonBits = 0xFFFF;    // 0xFF bytes: a bf16 NaN
constexpr size_t kGuard = 64;               // poisoned elements past every output

#define ASSERT_OK(expr)                                    \
  do {                                                     \
    const ::absl::Status status_ = (expr);                 \
    ASSERT_TRUE(status_.ok()) << #expr << ": " << status_; \
  } while (0)

#define ASSERT_CUDA(expr) ASSERT_OK(CudaErrorToStatus((expr), #expr, __FILE__, __LINE__))

// ASSERT_OK_AND_ASSIGN(auto buf, DeviceBuffer<bf16>::Create(n));
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(TREESPEC_CONCAT_(statusor_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(var, lhs, expr)        \
  auto var = (expr);                                      \
  ASSERT_TRUE(var.ok()) << #expr << ": " << var.status(); \
  lhs = std::move(var).value()

inline uint16_t Bits(bf16 b) {
  uint16_t u;
  std::memcpy(&u, &b, sizeof(u));
  return u;
}
inline bf16 FromBits(uint16_t u) {
  bf16 b;
  std::memcpy(&b, &u, sizeof(u));
  return b;
}
inline float ToFloat(bf16 b) { return Bf16BitsToFloat(Bits(b)); }

inline uint64_t Seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("TREESPEC_TEST_SEED");
    const uint64_t s = env != nullptr ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::cerr << "GPU test seed " << s << " (TREESPEC_TEST_SEED repeats it)\n";
    return s;
  }();
  return seed;
}

// `count` bf16 values uniform in [-scale, scale] (never all zeros), and the same values as
// fp32 for the CPU reference.
struct Bf16Data {
  std::vector<bf16> bf;
  std::vector<float> f;
};
inline Bf16Data RandomBf16(std::mt19937_64& rng, size_t count, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  Bf16Data d;
  d.bf.resize(count);
  d.f.resize(count);
  for (size_t i = 0; i < count; ++i) {
    const uint16_t bits = FloatToBf16Bits(u(rng));
    d.bf[i] = FromBits(bits);
    d.f[i] = Bf16BitsToFloat(bits);
  }
  return d;
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t error = cudaGetDeviceCount(&count);
    if (error != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device ("
                   << (error != cudaSuccess
                           ? std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error)
                           : std::string("0 devices"))
                   << "): GPU test skipped; run it on the GPU machine";
    }
    ASSERT_CUDA(cudaStreamCreate(&stream_));
    rng_.seed(Seed() ^ std::hash<std::string>{}(
                           ::testing::UnitTest::GetInstance()->current_test_info()->name()));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // A device copy of `host` followed by kGuard poisoned elements.
  template <typename T>
  absl::StatusOr<DeviceBuffer<T>> Upload(const std::vector<T>& host) {
    auto buffer = DeviceBuffer<T>::Create(host.size() + kGuard);
    if (!buffer.ok()) return buffer.status();
    if (absl::Status s = buffer->FillBytes(0xFF, stream_); !s.ok()) return s;
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    if (absl::Status s = buffer->CopyFromHost(host); !s.ok()) return s;
    return buffer;
  }
  // `count` poisoned elements plus the guard.
  absl::StatusOr<DeviceBuffer<bf16>> Poisoned(size_t count) {
    return Upload(std::vector<bf16>(count, FromBits(kPoisonBits)));
  }
  // All of `buffer` (payload and guard) after the stream's work.
  absl::StatusOr<std::vector<bf16>> Download(const DeviceBuffer<bf16>& buffer) {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    std::vector<bf16> host(buffer.size());
    if (absl::Status s = buffer.CopyToHost(absl::MakeSpan(host)); !s.ok()) return s;
    return host;
  }

  cudaStream_t stream_ = nullptr;
  std::mt19937_64 rng_;
};

// Elements [payload, payload + kGuard) still hold the poison: nothing was written past the end.
inline void ExpectGuardIntact(const std::vector<bf16>& got, size_t payload) {
  ASSERT_EQ(got.size(), payload + kGuard);
  for (size_t i = payload; i < got.size(); ++i) {
    ASSERT_EQ(Bits(got[i]), kPoisonBits) << "write past the end at element " << i - payload;
  }
}

}  // namespace treespec::gpu::testing

#endif  // TREESPEC_COMMON_CUDA_CUDA_TEST_UTIL_H_
