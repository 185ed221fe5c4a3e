// Every CUDA op against its CPU reference (common/model/cpu_ops.h, DESIGN §8): fresh random
// inputs rounded to bf16 first (the CPU reference gets the very same values), outputs poisoned
// with 0xFF bytes (bf16 NaN) before the launch plus a poisoned guard tail that must survive,
// sizes that are not multiples of any tile. Skips every test without a CUDA device. Tolerances
// and seeds as described in cuda_test_util.h.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
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
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/cuda_test_util.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/embedding.h"
#include "common/cuda/rms_norm.h"
#include "common/cuda/rope.h"
#include "common/cuda/silu_mul.h"
#include "common/model/cpu_ops.h"
#include "common/model/dtype.h"
#include "gtest/gtest.h"

namespace treespec::gpu {
namespace {
using namespace ::treespec::gpu::testing;  // NOLINT: test scaffolding
using CudaOpsTest = CudaTest;

// ---- Embedding: a pure copy, so the rows must match bit for bit; ids outside the table's
// vocabulary slice give exact zeros (the vocab-parallel contract of CpuCausalLm::Embed).
TEST_F(CudaOpsTest, EmbeddingMatchesRowCopy) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  constexpr int kVocab = 3001;
  struct Case {
    int hidden, tokens, vocab_begin, vocab_rows;
  };
  // hidden 1000 and 4096 take the 16-byte path, 4096 + 7 and 13 the scalar one; the last two
  // cases are one rank's slice of the vocabulary.
  for (const Case c :
       {Case{1000, 1, 0, kVocab}, Case{4096 + 7, 3, 0, kVocab}, Case{4096, 17, 0, kVocab},
        Case{13, 17, 0, kVocab}, Case{1000, 17, 1200, 900}, Case{4096 + 7, 3, 2500, 501}}) {
    SCOPED_TRACE(absl::StrCat("hidden ", c.hidden, " tokens ", c.tokens, " slice [", c.vocab_begin,
                              ", ", c.vocab_begin + c.vocab_rows, ")"));
    const Bf16Data table = RandomBf16(rng_, static_cast<size_t>(c.vocab_rows) * c.hidden, 1.0f);
    std::uniform_int_distribution<int32_t> id(0, kVocab - 1);
    std::vector<int32_t> ids(c.tokens);
    for (int32_t& t : ids) t = id(rng_);
    ids[0] = c.vocab_begin + c.vocab_rows - 1;                          // last row of the slice
    if (c.tokens > 1) ids[1] = c.vocab_begin;                           // first row of the slice
    if (c.tokens > 2 && c.vocab_begin > 0) ids[2] = c.vocab_begin - 1;  // just below the slice

    ASSERT_OK_AND_ASSIGN(auto d_table, Upload(table.bf));
    ASSERT_OK_AND_ASSIGN(auto d_ids, Upload(ids));
    const size_t out_count = static_cast<size_t>(c.tokens) * c.hidden;
    ASSERT_OK_AND_ASSIGN(auto d_out, Poisoned(out_count));
    ASSERT_CUDA(LaunchEmbedding(d_table.data(), c.vocab_begin, c.vocab_rows, c.hidden, d_ids.data(),
                                c.tokens, d_out.data(), stream_));
    ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got, Download(d_out));

    int zero_rows = 0;
    for (int i = 0; i < c.tokens; ++i) {
      const int64_t local = static_cast<int64_t>(ids[i]) - c.vocab_begin;
      const bool in_slice = local >= 0 && local < c.vocab_rows;
      zero_rows += in_slice ? 0 : 1;
      for (int j = 0; j < c.hidden; ++j) {
        const uint16_t want = in_slice ? Bits(table.bf[local * c.hidden + j]) : 0;
        ASSERT_EQ(Bits(got[static_cast<size_t>(i) * c.hidden + j]), want)
            << "token " << i << " (id " << ids[i] << ") element " << j;
      }
    }
    if (c.vocab_begin > 0 && c.tokens > 2) EXPECT_GT(zero_rows, 0);  // the zero path ran
    ExpectGuardIntact(got, out_count);
  }
}

// ---- RMSNorm fused with the residual add. The updated residual stream x must equal
// bf16(x + residual) bit for bit (one fp32 add, one round to nearest even: the same on both
// sides). The CPU reference RmsNorm gets that rounded x, as the GPU kernel normalises it.
// d: the mean of squares of n positive terms in fp32 is within n·e relatively of the exact
// one whatever the summation order (the CPU sums in double, then rounds); /n, +eps, sqrt and
// the reciprocal add a few e and the square root halves the sum's error; the two products add
// 2e; the CPU side adds about 6e. So d <= (n/2 + 16)·e·|ref| and
//   |got - ref| <= (u + (1 + u)·(n/2 + 16)·e) · |ref|   (purely relative: out is a product).
TEST_F(CudaOpsTest, RmsNormMatchesCpu) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  constexpr float kEps = 1e-5f;
  enum class Mode { kResidual, kNoResidual, kInPlace, kOutIsResidual };
  struct Case {
    int rows, n;
    Mode mode;
  };
  // n 1000 and 4096 take the 16-byte path, 4096 + 7 and 127 the scalar one; n 128 with many
  // rows is a per-head q/k norm (Qwen3) done in place.
  for (const Case c : {Case{1, 1000, Mode::kResidual}, Case{3, 4096 + 7, Mode::kResidual},
                       Case{17, 4096, Mode::kResidual}, Case{17, 1000, Mode::kNoResidual},
                       Case{3, 127, Mode::kNoResidual}, Case{17 * 8, 128, Mode::kInPlace},
                       Case{3, 4096 + 7, Mode::kInPlace}, Case{17, 4096, Mode::kOutIsResidual}}) {
    SCOPED_TRACE(absl::StrCat("rows ", c.rows, " n ", c.n, " mode ", static_cast<int>(c.mode)));
    const size_t count = static_cast<size_t>(c.rows) * c.n;
    const bool with_residual = c.mode == Mode::kResidual || c.mode == Mode::kOutIsResidual;
    const Bf16Data x = RandomBf16(rng_, count, 2.0f);
    const Bf16Data residual = RandomBf16(rng_, count, 2.0f);
    Bf16Data weight = RandomBf16(rng_, c.n, 0.5f);  // then shifted to 1 ± 0.5, as trained norms
    for (int j = 0; j < c.n; ++j) {
      const uint16_t bits = FloatToBf16Bits(1.0f + weight.f[j]);
      weight.bf[j] = FromBits(bits);
      weight.f[j] = Bf16BitsToFloat(bits);
    }

    // CPU reference: x += residual in fp32 (AddInPlace), rounded to the bf16 stream, then norm.
    std::vector<float> x_ref = x.f;
    if (with_residual) {
      AddInPlace(residual.f.data(), static_cast<int64_t>(count), x_ref.data());
      for (float& v : x_ref) v = Bf16BitsToFloat(FloatToBf16Bits(v));
    }
    std::vector<float> ref(count);
    RmsNorm(x_ref.data(), weight.f.data(), c.rows, c.n, kEps, ref.data());

    ASSERT_OK_AND_ASSIGN(auto d_x, Upload(x.bf));
    ASSERT_OK_AND_ASSIGN(auto d_residual, Upload(residual.bf));
    ASSERT_OK_AND_ASSIGN(auto d_weight, Upload(weight.bf));
    ASSERT_OK_AND_ASSIGN(auto d_out, Poisoned(count));
    bf16* out = d_out.data();
    if (c.mode == Mode::kInPlace) out = d_x.data();
    if (c.mode == Mode::kOutIsResidual) out = d_residual.data();
    ASSERT_CUDA(LaunchRmsNorm(d_x.data(), with_residual ? d_residual.data() : nullptr,
                              d_weight.data(), c.rows, c.n, kEps, out, stream_));
    ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got_x, Download(d_x));
    ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got_out,
                         Download(c.mode == Mode::kInPlace         ? d_x
                                  : c.mode == Mode::kOutIsResidual ? d_residual
                                                                   : d_out));

    if (c.mode != Mode::kInPlace) {
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(Bits(got_x[i]), FloatToBf16Bits(x_ref[i])) << "residual stream x at " << i;
      }
    }
    const double rel_tol = kBf16U + (1 + kBf16U) * (c.n / 2.0 + 16) * kFp32U;
    double worst = 0;  // largest |got - ref| / |ref|, reported on failure
    for (size_t i = 0; i < count; ++i) {
      const double got = ToFloat(got_out[i]), want = ref[i];
      ASSERT_LE(std::abs(got - want), rel_tol * std::abs(want))
          << "out at row " << i / c.n << " col " << i % c.n << ": got " << got << " want " << want;
      if (want != 0) worst = std::max(worst, std::abs(got - want) / std::abs(want));
    }
    EXPECT_LE(worst, rel_tol);
    ExpectGuardIntact(got_out, count);
    ExpectGuardIntact(got_x, count);
  }
}

// Llama-style inverse frequencies theta^(-2f / head_dim), as fp32.
std::vector<float> InverseFrequencies(int head_dim, double theta) {
  std::vector<float> inv(head_dim / 2);
  for (int f = 0; f < head_dim / 2; ++f) {
    inv[f] = static_cast<float>(std::pow(theta, -2.0 * f / head_dim));
  }
  return inv;
}

// ---- RoPE. The angle is the same fp32 product on both sides and the rotation uses explicit
// fp32 roundings without FMA on both, so only cos/sin differ: CUDA's sincosf is within 2 ulp
// (CUDA programming guide, full-range) and the CPU's double cos rounded to float within 1/2
// ulp; both are <= 1 in magnitude (ulp <= e), and the scaling by attention_factor (af) adds
// 1/2 ulp on each side. So each table entry differs by <= 4·af·e, and the rotation's two
// products and one sum (each <= e relative, on terms <= af·(|a| + |b|)) add 4·af·e·(|a| + |b|)
// over both sides:
//   d <= 8·af·e·(|a| + |b|), tol = u·|ref| + 16·af·e·(|a| + |b|).
TEST_F(CudaOpsTest, RopeMatchesCpu) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  struct Case {
    int rows, heads, head_dim;
    float attention_factor;  // yarn's mscale; 1 for every other scaling
    double theta;
  };
  for (const Case c : {Case{1, 1, 128, 1.0f, 500000.0}, Case{3, 8, 64, 1.0f, 10000.0},
                       Case{17, 32, 128, 1.0f, 500000.0}, Case{17, 4, 96, 1.2079f, 1000000.0},
                       Case{3, 7, 6, 1.0f, 10000.0}, Case{17, 3, 256, 0.9f, 10000.0}}) {
    SCOPED_TRACE(absl::StrCat("rows ", c.rows, " heads ", c.heads, " head_dim ", c.head_dim,
                              " attention_factor ", c.attention_factor));
    const int half = c.head_dim / 2;
    const size_t count = static_cast<size_t>(c.rows) * c.heads * c.head_dim;
    const Bf16Data x = RandomBf16(rng_, count, 3.0f);
    const std::vector<float> inv_freq = InverseFrequencies(c.head_dim, c.theta);
    std::uniform_int_distribution<int32_t> pos(0, 131071);  // up to 128k context
    std::vector<int32_t> positions(c.rows);
    for (int32_t& p : positions) p = pos(rng_);
    positions[0] = c.rows > 1 ? 0 : 131071;  // the identity rotation and a long context

    std::vector<float> cos(static_cast<size_t>(c.rows) * half), sin(cos.size());
    RopeTables(inv_freq, c.attention_factor, positions, cos.data(), sin.data());
    std::vector<float> ref = x.f;
    ApplyRope(cos.data(), sin.data(), c.rows, c.heads, c.head_dim, ref.data());

    ASSERT_OK_AND_ASSIGN(auto d_x, Upload(x.bf));
    ASSERT_OK_AND_ASSIGN(auto d_positions, Upload(positions));
    ASSERT_OK_AND_ASSIGN(auto d_inv_freq, Upload(inv_freq));
    ASSERT_CUDA(LaunchRope(d_x.data(), c.rows, c.heads, c.head_dim, d_positions.data(),
                           d_inv_freq.data(), c.attention_factor, stream_));
    ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got, Download(d_x));

    for (size_t i = 0; i < count; ++i) {
      const size_t head_base = i - i % c.head_dim;
      const int f = static_cast<int>(i % c.head_dim) % half;
      const double a = x.f[head_base + f], b = x.f[head_base + f + half];
      const double tol = kBf16U * std::abs(ref[i]) +
                         16 * c.attention_factor * kFp32U * (std::abs(a) + std::abs(b));
      ASSERT_LE(std::abs(ToFloat(got[i]) - ref[i]), tol)
          << "row " << i / (static_cast<size_t>(c.heads) * c.head_dim) << " element "
          << i % (static_cast<size_t>(c.heads) * c.head_dim) << ": got " << ToFloat(got[i])
          << " want " << ref[i];
    }
    ExpectGuardIntact(got, count);
  }
}

// ---- SiLU·mul. d: expf within 2 ulp (CUDA guide; glibc's expf within 1), then 1 + exp, the
// division and the product each within 1/2 ulp on each side; 1 + exp(-g) >= 1 keeps the
// relative error of the exponential from growing. d <= 8·e·|ref|, so
//   |got - ref| <= (u + 16·e) · |ref|.
TEST_F(CudaOpsTest, SiluMulMatchesCpu) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  enum class Layout { kSeparate, kFusedGateUp, kInPlace, kMisaligned };
  struct Case {
    int rows, cols;
    Layout layout;
  };
  // cols 1000 and 14336 take the 16-byte path, 4096 + 7 the scalar one; kMisaligned shifts
  // the pointers by one element so an 8-divisible width must take the scalar path too.
  for (const Case c : {Case{1, 1000, Layout::kSeparate}, Case{3, 4096 + 7, Layout::kSeparate},
                       Case{17, 14336, Layout::kSeparate}, Case{17, 1000, Layout::kFusedGateUp},
                       Case{3, 4096 + 7, Layout::kFusedGateUp}, Case{3, 1000, Layout::kInPlace},
                       Case{17, 1000, Layout::kMisaligned}}) {
    SCOPED_TRACE(
        absl::StrCat("rows ", c.rows, " cols ", c.cols, " layout ", static_cast<int>(c.layout)));
    const size_t count = static_cast<size_t>(c.rows) * c.cols;
    // gate over [-10, 10] reaches silu's flat tail and its linear side.
    const Bf16Data gate = RandomBf16(rng_, count, 10.0f);
    const Bf16Data up = RandomBf16(rng_, count, 2.0f);
    std::vector<float> ref(count);
    SiluMul(gate.f.data(), up.f.data(), static_cast<int64_t>(count), ref.data());

    std::vector<bf16> got;
    const int offset = c.layout == Layout::kMisaligned ? 1 : 0;
    if (c.layout == Layout::kFusedGateUp) {
      // One [rows, 2 * cols] buffer: gate in the first half of each row, up in the second.
      std::vector<bf16> gate_up(2 * count);
      for (int r = 0; r < c.rows; ++r) {
        for (int j = 0; j < c.cols; ++j) {
          gate_up[(2 * static_cast<size_t>(r)) * c.cols + j] = gate.bf[r * c.cols + j];
          gate_up[(2 * static_cast<size_t>(r) + 1) * c.cols + j] = up.bf[r * c.cols + j];
        }
      }
      ASSERT_OK_AND_ASSIGN(auto d_gate_up, Upload(gate_up));
      ASSERT_OK_AND_ASSIGN(auto d_out, Poisoned(count));
      ASSERT_CUDA(LaunchSiluMul(d_gate_up.data(), d_gate_up.data() + c.cols, 2 * c.cols, c.rows,
                                c.cols, d_out.data(), stream_));
      ASSERT_OK_AND_ASSIGN(got, Download(d_out));
    } else {
      std::vector<bf16> gate_host = gate.bf, up_host = up.bf;
      gate_host.insert(gate_host.begin(), offset, FromBits(kPoisonBits));
      up_host.insert(up_host.begin(), offset, FromBits(kPoisonBits));
      ASSERT_OK_AND_ASSIGN(auto d_gate, Upload(gate_host));
      ASSERT_OK_AND_ASSIGN(auto d_up, Upload(up_host));
      ASSERT_OK_AND_ASSIGN(auto d_out, Poisoned(count + offset));
      bf16* out = c.layout == Layout::kInPlace ? d_gate.data() : d_out.data() + offset;
      ASSERT_CUDA(LaunchSiluMul(d_gate.data() + offset, d_up.data() + offset, c.cols, c.rows,
                                c.cols, out, stream_));
      ASSERT_OK_AND_ASSIGN(got, Download(c.layout == Layout::kInPlace ? d_gate : d_out));
      got.erase(got.begin(), got.begin() + offset);
      ASSERT_EQ(got.size(), count + kGuard);
    }

    const double rel_tol = kBf16U + 16 * kFp32U;
    for (size_t i = 0; i < count; ++i) {
      ASSERT_LE(std::abs(ToFloat(got[i]) - ref[i]), rel_tol * std::abs(ref[i]))
          << "row " << i / c.cols << " col " << i % c.cols << ": gate " << gate.f[i] << " up "
          << up.f[i] << " got " << ToFloat(got[i]) << " want " << ref[i];
    }
    ExpectGuardIntact(got, count);
  }
}

// ---- Launchers reject bad shapes without launching and treat zero rows as a no-op.
TEST_F(CudaOpsTest, LaunchersValidateShapes) {
  ASSERT_OK_AND_ASSIGN(auto buf, Poisoned(256));
  ASSERT_OK_AND_ASSIGN(auto ids, Upload(std::vector<int32_t>{0}));
  ASSERT_OK_AND_ASSIGN(auto inv, Upload(std::vector<float>(64, 1.0f)));
  bf16* p = buf.data();
  EXPECT_EQ(LaunchEmbedding(p, 0, 1, 0, ids.data(), 1, p + 128, stream_), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchEmbedding(p, 0, 1, 8, ids.data(), 0, p + 128, stream_), cudaSuccess);
  EXPECT_EQ(LaunchRmsNorm(p, nullptr, p, 1, 0, 1e-5f, p, stream_), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchRmsNorm(p, nullptr, p, -1, 8, 1e-5f, p, stream_), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchRmsNorm(p, nullptr, p, 0, 8, 1e-5f, p, stream_), cudaSuccess);
  EXPECT_EQ(LaunchRope(p, 1, 1, 7, ids.data(), inv.data(), 1.0f, stream_), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchRope(p, 1, 0, 8, ids.data(), inv.data(), 1.0f, stream_), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchRope(p, 0, 1, 8, ids.data(), inv.data(), 1.0f, stream_), cudaSuccess);
  EXPECT_EQ(LaunchSiluMul(p, p, 4, 1, 8, p, stream_), cudaErrorInvalidValue);  // stride < cols
  EXPECT_EQ(LaunchSiluMul(p, p, 8, 0, 8, p, stream_), cudaSuccess);
  // Nothing above may have written: the buffer is still all poison.
  ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got, Download(buf));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(Bits(got[i]), kPoisonBits) << i;
}

// ---- The status helpers.
TEST(CudaCheckTest, ErrorsBecomeStatusesWithFileAndLine) {
  EXPECT_TRUE(CudaErrorToStatus(cudaSuccess, "x", "f.cc", 1).ok());
  const absl::Status oom =
      CudaErrorToStatus(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)", "f.cc", 42);
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("f.cc:42"), absl::string_view::npos) << oom;
  EXPECT_NE(oom.message().find("cudaErrorMemoryAllocation"), absl::string_view::npos) << oom;
  auto returns = []() -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaErrorInvalidValue);
    return absl::OkStatus();
  };
  const absl::Status bad = returns();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("cuda_ops_test.cc:"), absl::string_view::npos) << bad;
}

TEST(DeviceBufferTest, EmptyBufferNeedsNoDevice) {
  DeviceBuffer<float> empty;
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(empty.CopyFromHost(std::vector<float>(1)).code(),
            absl::StatusCode::kInvalidArgument);  // longer than the buffer: refused up front
}

}  // namespace
}  // namespace treespec::gpu
