#include "common/model/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TREESPEC_HAVE_AVX2_KERNEL 1
#endif

// This file is compiled with -ffp-contract=off (forward.cmake): a * b + c stays a multiply
// and an add unless written as an explicit FMA, whatever -march the build uses.

namespace treespec {
namespace {

// Rows of x whose block of w columns is reused from cache: 64 rows of a 4096-wide x are 1 MiB.
constexpr int kRowPanel = 64;

// ---- Portable kernel: GCC/Clang vector extensions (SSE2 pairs on baseline x86-64, NEON on
// Arm). One V8 holds the 8 lane accumulators of one output element.
typedef float V8 __attribute__((vector_size(32)));

inline V8 Load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The last `count` (< 8) elements, zero-padded: zero products leave the lanes unchanged.
inline V8 LoadTail(const float* p, int count) {
  V8 v = {0, 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(&v, p, sizeof(float) * count);
  return v;
}

// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)): the order the AVX2 kernel's shuffles give.
inline float Reduce8(V8 v) {
  const float a0 = v[0] + v[4], a1 = v[1] + v[5], a2 = v[2] + v[6], a3 = v[3] + v[7];
  return (a0 + a2) + (a1 + a3);
}

// y[r, c] = x[r, :] · w[c, :] for an R×C block. x rows are `ldx` apart, w rows `ldw`, y `ldy`.
template <int R, int C>
void PortableBlock(const float* x, int ldx, const float* w, int ldw, int k, float* y, int ldy,
                   const float* /*prefetch*/) {
  V8 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = V8{0, 0, 0, 0, 0, 0, 0, 0};
  int kk = 0;
  for (; kk + 8 <= k; kk += 8) {
    V8 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = Load8(w + c * ldw + kk);
    for (int r = 0; r < R; ++r) {
      const V8 xv = Load8(x + r * ldx + kk);
      for (int c = 0; c < C; ++c) acc[r][c] += xv * wv[c];
    }
  }
  if (kk < k) {
    const int tail = k - kk;
    V8 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = LoadTail(w + c * ldw + kk, tail);
    for (int r = 0; r < R; ++r) {
      const V8 xv = LoadTail(x + r * ldx + kk, tail);
      for (int c = 0; c < C; ++c) acc[r][c] += xv * wv[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * ldy + c] = Reduce8(acc[r][c]);
}

// (x, ldx, w, ldw, k, y, ldy, prefetch): `prefetch` (may be null) is the next column block of
// w, [C, k] with stride ldw, to pull towards L1 while this block computes.
using BlockFn = void (*)(const float*, int, const float*, int, int, float*, int, const float*);

// Blocked driver shared by both kernels: `blocks[r - 1][c - 1]` computes an r×c block.
template <int kR, int kC>
void BlockedMatMul(const BlockFn (&blocks)[kR][kC], const float* x, const float* w, int m, int n,
                   int k, float* y) {
  for (int i0 = 0; i0 < m; i0 += kRowPanel) {
    const int i1 = std::min(m, i0 + kRowPanel);
    for (int j = 0; j < n; j += kC) {
      const int c = std::min(kC, n - j);
      // Weights stream from memory: while the first row block runs, prefetch the column block
      // 4 ahead (the hardware prefetcher alone leaves the FMA units waiting: 16 rows × 704 × 256
      // over cold weights run at 38 GFLOP/s without, 78 with, on the dev machine's Zen 4).
      const float* next = j + 4 * kC < n ? w + static_cast<int64_t>(j + 4 * kC) * k : nullptr;
      for (int i = i0; i < i1; i += kR) {
        const int r = std::min(kR, i1 - i);
        blocks[r - 1][c - 1](x + static_cast<int64_t>(i) * k, k, w + static_cast<int64_t>(j) * k, k,
                             k, y + static_cast<int64_t>(i) * n + j, n, i == i0 ? next : nullptr);
      }
    }
  }
}

constexpr BlockFn kPortableBlocks[4][2] = {
    {PortableBlock<1, 1>, PortableBlock<1, 2>},
    {PortableBlock<2, 1>, PortableBlock<2, 2>},
    {PortableBlock<3, 1>, PortableBlock<3, 2>},
    {PortableBlock<4, 1>, PortableBlock<4, 2>},
};

#ifdef TREESPEC_HAVE_AVX2_KERNEL
// ---- AVX2 + FMA kernel. Same lane layout and final combination as the portable kernel; the
// lane update is one fused multiply-add.
#define TREESPEC_AVX2 __attribute__((target("avx2,fma")))

TREESPEC_AVX2 inline __m256 LoadTailAvx2(const float* p, int count) {
  alignas(32) static const int32_t kMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                0,  0,  0,  0,  0,  0,  0,  0};
  const __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMask + 8 - count));
  return _mm256_maskload_ps(p, mask);
}

TREESPEC_AVX2 inline float Reduce8Avx2(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));  // [a0 + a2, a1 + a3]
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

template <int R, int C>
TREESPEC_AVX2 void Avx2Block(const float* x, int ldx, const float* w, int ldw, int k, float* y,
                             int ldy, const float* prefetch) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int kk = 0;
  for (; kk + 8 <= k; kk += 8) {
    if (prefetch != nullptr && kk % 16 == 0) {  // one 64-byte line per row every 16 floats
      for (int c = 0; c < C; ++c) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + c * ldw + kk), _MM_HINT_T0);
      }
    }
    __m256 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm256_loadu_ps(w + c * ldw + kk);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * ldx + kk);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  if (kk < k) {
    const int tail = k - kk;
    __m256 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = LoadTailAvx2(w + c * ldw + kk, tail);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = LoadTailAvx2(x + r * ldx + kk, tail);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * ldy + c] = Reduce8Avx2(acc[r][c]);
}

// 4 rows × 3 columns: 12 accumulators + 3 weight vectors in the 16 ymm registers.
constexpr BlockFn kAvx2Blocks[4][3] = {
    {Avx2Block<1, 1>, Avx2Block<1, 2>, Avx2Block<1, 3>},
    {Avx2Block<2, 1>, Avx2Block<2, 2>, Avx2Block<2, 3>},
    {Avx2Block<3, 1>, Avx2Block<3, 2>, Avx2Block<3, 3>},
    {Avx2Block<4, 1>, Avx2Block<4, 2>, Avx2Block<4, 3>},
};

TREESPEC_AVX2 void DotRowsAvx2(const float* x, const float* const* rows, int offset, int count,
                               int k, float* scores) {
  for (int c = 0; c < count; ++c) {
    Avx2Block<1, 1>(x, k, rows[c] + offset, k, k, &scores[c], 1, nullptr);
  }
}

TREESPEC_AVX2 void WeightedSumRowsAvx2(const float* weights, const float* const* rows, int offset,
                                       int count, int k, float* out) {
  // Up to 4 vectors (32 columns) per pass over the rows: independent FMA chains.
  int e = 0;
  for (; e + 32 <= k; e += 32) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int c = 0; c < count; ++c) {
      const __m256 wc = _mm256_set1_ps(weights[c]);
      const float* row = rows[c] + offset + e;
      for (int v = 0; v < 4; ++v) {
        acc[v] = _mm256_fmadd_ps(wc, _mm256_loadu_ps(row + 8 * v), acc[v]);
      }
    }
    for (int v = 0; v < 4; ++v) _mm256_storeu_ps(out + e + 8 * v, acc[v]);
  }
  for (; e + 8 <= k; e += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int c = 0; c < count; ++c) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(weights[c]), _mm256_loadu_ps(rows[c] + offset + e), acc);
    }
    _mm256_storeu_ps(out + e, acc);
  }
  for (; e < k; ++e) {
    float acc = 0.0f;
    for (int c = 0; c < count; ++c) acc = std::fma(weights[c], rows[c][offset + e], acc);
    out[e] = acc;
  }
}

bool CpuHasAvx2Fma() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}
#endif  // TREESPEC_HAVE_AVX2_KERNEL

// TREESPEC_CPU_MATMUL=portable forces the portable kernel (to test it on an AVX2 machine).
bool UseAvx2() {
#ifdef TREESPEC_HAVE_AVX2_KERNEL
  static const bool use = [] {
    const char* env = std::getenv("TREESPEC_CPU_MATMUL");
    if (env != nullptr && std::strcmp(env, "portable") == 0) return false;
    return CpuHasAvx2Fma();
  }();
  return use;
#else
  return false;
#endif
}

}  // namespace

namespace internal {

void MatMulPortable(const float* x, const float* w, int m, int n, int k, float* y) {
  BlockedMatMul(kPortableBlocks, x, w, m, n, k, y);
}

bool MatMulAvx2(const float* x, const float* w, int m, int n, int k, float* y) {
#ifdef TREESPEC_HAVE_AVX2_KERNEL
  if (!CpuHasAvx2Fma()) return false;
  BlockedMatMul(kAvx2Blocks, x, w, m, n, k, y);
  return true;
#else
  return false;
#endif
}

}  // namespace internal

void MatMul(const float* x, const float* w, int m, int n, int k, float* y) {
  if (UseAvx2()) {
    internal::MatMulAvx2(x, w, m, n, k, y);
  } else {
    internal::MatMulPortable(x, w, m, n, k, y);
  }
}

void DotRows(const float* x, const float* const* rows, int offset, int count, int k,
             float* scores) {
#ifdef TREESPEC_HAVE_AVX2_KERNEL
  if (UseAvx2()) {
    DotRowsAvx2(x, rows, offset, count, k, scores);
    return;
  }
#endif
  for (int c = 0; c < count; ++c) {
    PortableBlock<1, 1>(x, k, rows[c] + offset, k, k, &scores[c], 1, nullptr);
  }
}

void WeightedSumRows(const float* weights, const float* const* rows, int offset, int count, int k,
                     float* out) {
#ifdef TREESPEC_HAVE_AVX2_KERNEL
  if (UseAvx2()) {
    WeightedSumRowsAvx2(weights, rows, offset, count, k, out);
    return;
  }
#endif
  std::fill(out, out + k, 0.0f);
  for (int c = 0; c < count; ++c) {
    const float w = weights[c];
    const float* row = rows[c] + offset;
    for (int e = 0; e < k; ++e) out[e] += w * row[e];
  }
}

void AddBias(const float* bias, int m, int n, float* x) {
  for (int i = 0; i < m; ++i) {
    float* row = x + static_cast<int64_t>(i) * n;
    for (int j = 0; j < n; ++j) row[j] += bias[j];
  }
}

void AddInPlace(const float* y, int64_t count, float* x) {
  for (int64_t i = 0; i < count; ++i) x[i] += y[i];
}

void RmsNorm(const float* x, const float* weight, int m, int n, float eps, float* y) {
  for (int i = 0; i < m; ++i) {
    const float* xi = x + static_cast<int64_t>(i) * n;
    float* yi = y + static_cast<int64_t>(i) * n;
    double sum_sq = 0.0;
    for (int j = 0; j < n; ++j) sum_sq += static_cast<double>(xi[j]) * xi[j];
    const float mean_sq = static_cast<float>(sum_sq / n);
    const float inv_rms = 1.0f / std::sqrt(mean_sq + eps);
    for (int j = 0; j < n; ++j) yi[j] = weight[j] * (xi[j] * inv_rms);
  }
}

void RopeTables(absl::Span<const float> inv_freq, float attention_factor,
                absl::Span<const int> positions, float* cos, float* sin) {
  const int half = static_cast<int>(inv_freq.size());
  for (size_t i = 0; i < positions.size(); ++i) {
    const float pos = static_cast<float>(positions[i]);
    for (int f = 0; f < half; ++f) {
      const float angle = pos * inv_freq[f];
      cos[i * half + f] =
          static_cast<float>(std::cos(static_cast<double>(angle))) * attention_factor;
      sin[i * half + f] =
          static_cast<float>(std::sin(static_cast<double>(angle))) * attention_factor;
    }
  }
}

void ApplyRope(const float* cos, const float* sin, int m, int num_heads, int head_dim, float* x) {
  const int half = head_dim / 2;
  for (int i = 0; i < m; ++i) {
    const float* c = cos + static_cast<int64_t>(i) * half;
    const float* s = sin + static_cast<int64_t>(i) * half;
    for (int h = 0; h < num_heads; ++h) {
      float* v = x + (static_cast<int64_t>(i) * num_heads + h) * head_dim;
      for (int f = 0; f < half; ++f) {
        const float a = v[f], b = v[f + half];
        v[f] = a * c[f] - b * s[f];
        v[f + half] = b * c[f] + a * s[f];
      }
    }
  }
}

void SiluMul(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

float SoftmaxInPlace(absl::Span<float> x) {
  float max = -INFINITY;
  for (float v : x) max = std::max(max, v);
  float sum = 0.0f;
  for (float& v : x) {
    v = std::exp(v - max);
    sum += v;
  }
  const float inv = 1.0f / sum;
  for (float& v : x) v *= inv;
  return sum;
}

}  // namespace treespec
