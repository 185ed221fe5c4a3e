// GEMMs (gemm.h), the few-row kernel and cuBLASLt, against the CPU reference MatMul (+ AddBias)
// of common/model/cpu_ops.h: fresh random bf16 inputs (the CPU gets the very same values),
// outputs poisoned with 0xFF bytes (NaN in bf16 and fp32) plus a poisoned guard tail that must
// survive, sizes that are not multiples of any tile, k split between CTAs. Also: one plan
// per shape, reused; a captured CUDA graph replays the eager result bit for bit; the few-row
// kernel's rows do not depend on the other rows, and as a dependent launch it reads what the
// kernel before it wrote; bad arguments are InvalidArgument. The GPU tests skip without a CUDA
// device; argument validation needs none. Tolerances and seeds as in cuda_test_util.h.
#include "common/cuda/gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/cuda_test_util.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/embedding.h"
#include "common/cuda/skinny_gemm.h"
#include "common/model/cpu_ops.h"
#include "common/util/status_macros.h"
#include "gtest/gtest.h"

namespace treespec::gpu {
namespace {
using namespace ::treespec::gpu::testing;  // NOLINT: test scaffolding

constexpr uint32_t kPoisonF32Bits = 0xFFFFFFFF;  // 0xFF bytes: an fp32 NaN
// The few-row kernel for every m it takes (by default GemmRunner gives it up to 32 rows only).
constexpr GemmOptions kWholeFewRowRange{.skinny_max_rows = kSkinnyMaxRows};

float PoisonF32() {
  float f;
  std::memcpy(&f, &kPoisonF32Bits, sizeof(f));
  return f;
}
uint32_t BitsF32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// CudaTest's poisoned buffers and downloads, for fp32 outputs too.
class GemmTest : public CudaTest {
 protected:
  absl::StatusOr<DeviceBuffer<float>> PoisonedF32(size_t count) {
    return Upload(std::vector<float>(count, PoisonF32()));
  }
  absl::StatusOr<std::vector<float>> DownloadF32(const DeviceBuffer<float>& buffer) {
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    std::vector<float> host(buffer.size());
    if (absl::Status s = buffer.CopyToHost(absl::MakeSpan(host)); !s.ok()) return s;
    return host;
  }
  using GraphExec = std::unique_ptr<CUgraphExec_st, cudaError_t (*)(cudaGraphExec_t)>;
  // Captures what `enqueue` puts on stream_ (in `mode`) into an instantiated graph; the capture
  // always ends. Errors: `enqueue`'s, then the capture's.
  absl::StatusOr<GraphExec> Capture(cudaStreamCaptureMode mode,
                                    const std::function<absl::Status()>& enqueue) {
    CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, mode));
    const absl::Status enqueued = enqueue();
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    std::unique_ptr<CUgraph_st, cudaError_t (*)(cudaGraph_t)> graph_owner(graph, cudaGraphDestroy);
    if (!enqueued.ok()) return enqueued;
    CUDA_RETURN_IF_ERROR(end);
    cudaGraphExec_t exec = nullptr;
    CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
    return GraphExec(exec, cudaGraphExecDestroy);
  }
  // MatchesCpu's cases through `gemm` (the few-row kernel takes m <= 64 unless disabled).
  // tune: every shape through GemmRunner::Tune before its first Run.
  void ExpectMatchesCpu(GemmRunner& gemm, bool tune = false);

  // Random x [m, k], w [n, k] and bias [n] (values in [-1, 1]), on the host and the device.
  struct Inputs {
    Bf16Data x, w, bias;
    DeviceBuffer<bf16> d_x, d_w, d_bias;
  };
  absl::StatusOr<Inputs> RandomInputs(int m, int n, int k) {
    Inputs in;
    in.x = RandomBf16(rng_, static_cast<size_t>(m) * k, 1.0f);
    in.w = RandomBf16(rng_, static_cast<size_t>(n) * k, 1.0f);
    in.bias = RandomBf16(rng_, n, 1.0f);
    for (auto [host, device] :
         {std::pair{&in.x, &in.d_x}, std::pair{&in.w, &in.d_w}, std::pair{&in.bias, &in.d_bias}}) {
      absl::StatusOr<DeviceBuffer<bf16>> d = Upload(host->bf);
      if (!d.ok()) return d.status();
      *device = *std::move(d);
    }
    return in;
  }
};

void ExpectGuardIntactF32(const std::vector<float>& got, size_t payload) {
  ASSERT_EQ(got.size(), payload + kGuard);
  for (size_t i = payload; i < got.size(); ++i) {
    ASSERT_EQ(BitsF32(got[i]), kPoisonF32Bits) << "write past the end at element " << i - payload;
  }
}

// ---- Against the CPU. Products of two bf16 values are exact in fp32 (8-bit significands), so
// both sides only round sums; let S = Σ_k |x||w| for the element (computed by MatMul from |x|
// and |w|; its own error is second order and covered by the slack below).
//  - GPU: fp32 accumulation, but tensor cores add a block of b >= 4 products to the
//    accumulator by aligning all to the largest and truncating rather than rounding (Fasi,
//    Higham, Mikaitis, Pranesh 2021): each of the b + 1 addends loses under one ulp (2e
//    relative) of the largest, which is <= S, and the normalised sum once more, so a block
//    costs (b + 2)·2e·S and the k/b blocks (1 + 2/b)·2·k·e·S <= 3·k·e·S; split-K partial sums
//    stay fp32 (gemm.cc restricts the reduction scheme), which the same bound covers.
//  - CPU MatMul: 8 lanes of k/8 terms, then 3 levels of lane sums: (k/8 + 3)·e·S.
//  - bias: one fp32 add on each side, e·(S + |b|) each.
// d = (3k + k/8 + 8)·e·S + 2e·|b| (the 8 collects the 3, the bias's 2 and slack). The bf16
// output rounds once: |got - ref| <= u·|ref| + (1 + u)·d; the fp32 output is the fp32
// result itself: |got - ref| <= d.
double GemmD(int k, double abs_sum, double bias) {
  return (3.0 * k + k / 8.0 + 8) * kFp32U * abs_sum + 2 * kFp32U * std::abs(bias);
}

TEST_F(GemmTest, MatchesCpu) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GemmRunner> gemm,
                       GemmRunner::Create(kDefaultGemmWorkspaceBytes, kWholeFewRowRange));
  ExpectMatchesCpu(*gemm);
}

// Every shape above has a grid of at most two CTAs per SM on an H200, so MatchesCpu runs the
// deep pipeline (skinny_gemm.h); this runs the same shapes through the shallow one.
TEST_F(GemmTest, ShallowPipelineMatchesCpu) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<GemmRunner> gemm,
      GemmRunner::Create(kDefaultGemmWorkspaceBytes,
                         {.skinny_max_rows = kSkinnyMaxRows, .skinny_deep = false}));
  ExpectMatchesCpu(*gemm);
}

TEST_F(GemmTest, CublasOnlyMatchesCpu) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GemmRunner> gemm,
                       GemmRunner::Create(kDefaultGemmWorkspaceBytes, {.skinny_max_rows = 0}));
  ExpectMatchesCpu(*gemm);
}

// cuBLASLt with each shape's algorithm timed among the heuristic's leading candidates.
TEST_F(GemmTest, TunedCublasMatchesCpu) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GemmRunner> gemm,
                       GemmRunner::Create(kDefaultGemmWorkspaceBytes, {.skinny_max_rows = 0}));
  ExpectMatchesCpu(*gemm, /*tune=*/true);
}

void GemmTest::ExpectMatchesCpu(GemmRunner& gemm_runner, bool tune) {
  GemmRunner* const gemm = &gemm_runner;
  constexpr int kMs[] = {1, 3, 17, 64, 255};
  constexpr int kMaxM = 255;  // x holds kMaxM rows; a run with m rows reads the first m
  struct Shape {
    int n, k;
  };
  // (1000, 264): neither a multiple of the usual 64/128/256 tiles; (4096 + 8, 4096): a Llama
  // hidden size with a ragged output (the few-row kernel splits k 4 ways on an H200); (13, 8):
  // odd n (bf16 rows of y 26 bytes apart) and one 16-byte step of k; (200, 2056): few outputs,
  // long k ending in a ragged step (split 8 ways).
  for (const Shape s : {Shape{1000, 264}, Shape{4096 + 8, 4096}, Shape{13, 8}, Shape{200, 2056}}) {
    SCOPED_TRACE(absl::StrCat("n ", s.n, " k ", s.k));
    const Bf16Data x = RandomBf16(rng_, static_cast<size_t>(kMaxM) * s.k, 1.0f);
    const Bf16Data w = RandomBf16(rng_, static_cast<size_t>(s.n) * s.k, 1.0f);
    const Bf16Data bias = RandomBf16(rng_, s.n, 1.0f);

    // CPU: y = x·wᵀ, y + bias, and S = |x|·|w|ᵀ for the bounds, all [kMaxM, n].
    const size_t ref_count = static_cast<size_t>(kMaxM) * s.n;
    std::vector<float> ref(ref_count), ref_bias(ref_count), abs_sum(ref_count);
    MatMul(x.f.data(), w.f.data(), kMaxM, s.n, s.k, ref.data());
    ref_bias = ref;
    AddBias(bias.f.data(), kMaxM, s.n, ref_bias.data());
    {
      std::vector<float> x_abs = x.f, w_abs = w.f;
      for (float& v : x_abs) v = std::abs(v);
      for (float& v : w_abs) v = std::abs(v);
      MatMul(x_abs.data(), w_abs.data(), kMaxM, s.n, s.k, abs_sum.data());
    }

    ASSERT_OK_AND_ASSIGN(auto d_x, Upload(x.bf));
    ASSERT_OK_AND_ASSIGN(auto d_w, Upload(w.bf));
    ASSERT_OK_AND_ASSIGN(auto d_bias, Upload(bias.bf));
    double worst = 0;  // largest |got - ref| / tolerance over this shape's runs
    for (const int m : kMs) {
      // bf16 without and with bias, fp32 without (fp32 + bias is refused: see the last test).
      for (const bool f32_output : {false, true}) {
        for (const bool with_bias : {false, true}) {
          if (f32_output && with_bias) continue;
          SCOPED_TRACE(
              absl::StrCat("m ", m, f32_output ? " fp32" : " bf16", with_bias ? " with bias" : ""));
          const size_t count = static_cast<size_t>(m) * s.n;
          GemmArgs args{.m = m,
                        .n = s.n,
                        .k = s.k,
                        .x = d_x.data(),
                        .w = d_w.data(),
                        .bias = with_bias ? d_bias.data() : nullptr};
          std::vector<double> got(count);
          if (f32_output) {
            ASSERT_OK_AND_ASSIGN(auto d_y, PoisonedF32(count));
            args.y_f32 = d_y.data();
            if (tune) ASSERT_OK(gemm->Tune(args, stream_));
            ASSERT_OK(gemm->Run(args, stream_));
            ASSERT_OK_AND_ASSIGN(const std::vector<float> y, DownloadF32(d_y));
            ExpectGuardIntactF32(y, count);
            std::copy(y.begin(), y.begin() + count, got.begin());
          } else {
            ASSERT_OK_AND_ASSIGN(auto d_y, Poisoned(count));
            args.y_bf16 = d_y.data();
            if (tune) ASSERT_OK(gemm->Tune(args, stream_));
            ASSERT_OK(gemm->Run(args, stream_));
            ASSERT_OK_AND_ASSIGN(const std::vector<bf16> y, Download(d_y));
            ExpectGuardIntact(y, count);
            for (size_t i = 0; i < count; ++i) got[i] = ToFloat(y[i]);
          }
          const std::vector<float>& want = with_bias ? ref_bias : ref;
          for (size_t i = 0; i < count; ++i) {
            const int col = static_cast<int>(i % s.n);
            const double d = GemmD(s.k, abs_sum[i], with_bias ? bias.f[col] : 0.0);
            // Measured on the H200: with a bias and bf16 output, cuBLASLt rounds x·wᵀ to bf16
            // before adding the bias, so that case may carry one more rounding of |x·wᵀ|.
            const double product = std::abs(want[i] - (with_bias ? bias.f[col] : 0.0f));
            const double tol = f32_output ? d
                                          : kBf16U * std::abs(want[i]) + (1 + kBf16U) * d +
                                                (with_bias ? kBf16U * product : 0.0);
            const double err = std::abs(got[i] - want[i]);  // NaN fails the next line too
            ASSERT_LE(err, tol) << "row " << i / s.n << " col " << col << ": got " << got[i]
                                << " want " << want[i] << " (S " << abs_sum[i] << ")";
            worst = std::max(worst, err / tol);
          }
        }
      }
    }
    std::cerr << "GEMM n " << s.n << " k " << s.k << ": largest error " << worst
              << " of its tolerance\n";
  }
  EXPECT_EQ(gemm->plan_count(), 4 * 5 * 3);  // one per (shape, m, output, bias)
}

// cuBLASLt's other heuristic candidates (GemmOptions::cublas_candidate, for benchmarks) compute
// the same GEMM within the same bound; a candidate past the last is UNIMPLEMENTED, named.
TEST_F(GemmTest, OtherCublasCandidatesMatchCpu) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  constexpr int kM = 64, kN = 4096 + 8, kK = 4096;
  const Bf16Data x = RandomBf16(rng_, static_cast<size_t>(kM) * kK, 1.0f);
  const Bf16Data w = RandomBf16(rng_, static_cast<size_t>(kN) * kK, 1.0f);
  std::vector<float> ref(static_cast<size_t>(kM) * kN), abs_sum(ref.size());
  MatMul(x.f.data(), w.f.data(), kM, kN, kK, ref.data());
  {
    std::vector<float> x_abs = x.f, w_abs = w.f;
    for (float& v : x_abs) v = std::abs(v);
    for (float& v : w_abs) v = std::abs(v);
    MatMul(x_abs.data(), w_abs.data(), kM, kN, kK, abs_sum.data());
  }
  ASSERT_OK_AND_ASSIGN(auto d_x, Upload(x.bf));
  ASSERT_OK_AND_ASSIGN(auto d_w, Upload(w.bf));
  int ran = 0;
  for (int candidate : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("candidate ", candidate));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<GemmRunner> gemm,
                         GemmRunner::Create(kDefaultGemmWorkspaceBytes,
                                            {.skinny_max_rows = 0, .cublas_candidate = candidate}));
    ASSERT_OK_AND_ASSIGN(auto d_y, Poisoned(ref.size()));
    const GemmArgs args{
        .m = kM, .n = kN, .k = kK, .x = d_x.data(), .w = d_w.data(), .y_bf16 = d_y.data()};
    EXPECT_EQ(gemm->DescribePlan(args).status().code(), absl::StatusCode::kNotFound);
    const absl::Status status = gemm->Run(args, stream_);
    if (absl::IsUnimplemented(status)) continue;  // the heuristic offered fewer
    ASSERT_OK(status);
    ++ran;
    ASSERT_OK_AND_ASSIGN(const std::string described, gemm->DescribePlan(args));
    EXPECT_EQ(described.rfind("algo ", 0), 0u) << described;
    ASSERT_OK_AND_ASSIGN(const std::vector<bf16> y, Download(d_y));
    ExpectGuardIntact(y, ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const double tol = kBf16U * std::abs(ref[i]) + (1 + kBf16U) * GemmD(kK, abs_sum[i], 0.0);
      ASSERT_LE(std::abs(ToFloat(y[i]) - ref[i]), tol) << "element " << i;
    }
  }
  EXPECT_GE(ran, 1) << "cuBLASLt offered one algorithm only for a 64 x 4104 x 4096 GEMM";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GemmRunner> past,
                       GemmRunner::Create(kDefaultGemmWorkspaceBytes,
                                          {.skinny_max_rows = 0, .cublas_candidate = 100000}));
  ASSERT_OK_AND_ASSIGN(auto d_y, Poisoned(ref.size()));
  const absl::Status status = past->Run(
      {.m = kM, .n = kN, .k = kK, .x = d_x.data(), .w = d_w.data(), .y_bf16 = d_y.data()}, stream_);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  EXPECT_NE(status.message().find("not the 100001 wanted"), std::string::npos) << status;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GemmRunner> few,
                       GemmRunner::Create(kDefaultGemmWorkspaceBytes));
  const GemmArgs one_row{
      .m = 1, .n = kN, .k = kK, .x = d_x.data(), .w = d_w.data(), .y_bf16 = d_y.data()};
  ASSERT_OK(few->Run(one_row, stream_));
  EXPECT_EQ(few->DescribePlan(one_row).value_or(""), "few-row kernel");
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
}

// Tune times the heuristic's leading candidates of a cuBLASLt shape and keeps one; Run and
// Prepare take the first, untimed; Tune of a shape that has its plan runs nothing; Tune under
// stream capture is refused. A tuned plan's graph replays its eager bits.
TEST_F(GemmTest, TuneTimesCandidatesRunDoesNot) {
  constexpr int kM = 64, kN = 4096 + 8, kK = 4096;
  ASSERT_OK_AND_ASSIGN(const Inputs in, RandomInputs(kM, kN, kK));
  const size_t count = static_cast<size_t>(kM) * kN;
  ASSERT_OK_AND_ASSIGN(auto eager, Poisoned(count));
  ASSERT_OK_AND_ASSIGN(auto captured, Poisoned(count));
  GemmArgs args{
      .m = kM, .n = kN, .k = kK, .x = in.d_x.data(), .w = in.d_w.data(), .y_bf16 = eager.data()};

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GemmRunner> untuned,
                       GemmRunner::Create(kDefaultGemmWorkspaceBytes, {.skinny_max_rows = 0}));
  ASSERT_OK(untuned->Run(args, stream_));
  ASSERT_OK_AND_ASSIGN(const std::string first, untuned->DescribePlan(args));
  EXPECT_EQ(first.find(" timed"), std::string::npos) << first;
  EXPECT_NE(first.find("candidate 1"), std::string::npos) << first;
  ASSERT_OK(untuned->Tune(args, stream_));  // the plan exists: unchanged
  EXPECT_EQ(untuned->DescribePlan(args).value_or(""), first);

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GemmRunner> tuned,
                       GemmRunner::Create(kDefaultGemmWorkspaceBytes, {.skinny_max_rows = 0}));
  // Timed over two copies of the weights, as over a model's layers; a null copy is refused.
  ASSERT_OK_AND_ASSIGN(auto w_copy, Upload(in.w.bf));
  const bf16* bad[] = {in.d_w.data(), nullptr};
  EXPECT_EQ(tuned->Tune(args, stream_, bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tuned->plan_count(), 0);
  const bf16* copies[] = {in.d_w.data(), w_copy.data()};
  ASSERT_OK(tuned->Tune(args, stream_, copies));
  ASSERT_OK_AND_ASSIGN(const std::string kept, tuned->DescribePlan(args));
  EXPECT_NE(kept.find(" timed"), std::string::npos) << kept;
  ASSERT_OK(tuned->Run(args, stream_));  // into `eager`: the reference bits
  ASSERT_CUDA(cudaStreamSynchronize(stream_));

  GemmArgs other = args;  // a new shape: refused under capture, and no plan left behind
  other.m = kM - 1;
  args.y_bf16 = captured.data();
  absl::Status tune_in_capture;
  ASSERT_OK_AND_ASSIGN(const GraphExec exec,
                       Capture(cudaStreamCaptureModeThreadLocal, [&]() -> absl::Status {
                         tune_in_capture = tuned->Tune(other, stream_);
                         return tuned->Run(args, stream_);
                       }));
  EXPECT_EQ(tune_in_capture.code(), absl::StatusCode::kFailedPrecondition) << tune_in_capture;
  EXPECT_EQ(tuned->DescribePlan(other).status().code(), absl::StatusCode::kNotFound);
  ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream_));
  ASSERT_OK_AND_ASSIGN(const std::vector<bf16> want, Download(eager));
  ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got, Download(captured));
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(Bits(got[i]), Bits(want[i])) << "element " << i;
  }
  ExpectGuardIntact(got, count);
}

// ---- Plans: one per (m, n, k, output type, bias or not), built on first use or by Prepare,
// and reused whatever the pointers; a repeated run gives the same bits.
TEST_F(GemmTest, RepeatedShapeReusesItsPlan) {
  constexpr int kM = 17, kN = 1000, kK = 264;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GemmRunner> gemm,
                       GemmRunner::Create(kDefaultGemmWorkspaceBytes));
  EXPECT_EQ(gemm->plan_count(), 0);
  EXPECT_EQ(gemm->workspace_bytes(), kDefaultGemmWorkspaceBytes);
  const Bf16Data x = RandomBf16(rng_, static_cast<size_t>(64) * kK, 1.0f);
  const Bf16Data w = RandomBf16(rng_, static_cast<size_t>(kN) * kK, 1.0f);
  const Bf16Data bias = RandomBf16(rng_, kN, 1.0f);
  ASSERT_OK_AND_ASSIGN(auto d_x, Upload(x.bf));
  ASSERT_OK_AND_ASSIGN(auto d_w, Upload(w.bf));
  ASSERT_OK_AND_ASSIGN(auto d_bias, Upload(bias.bf));
  ASSERT_OK_AND_ASSIGN(auto d_bias2, Upload(bias.bf));
  ASSERT_OK_AND_ASSIGN(auto d_a, Poisoned(static_cast<size_t>(64) * kN));
  ASSERT_OK_AND_ASSIGN(auto d_b, Poisoned(static_cast<size_t>(64) * kN));
  ASSERT_OK_AND_ASSIGN(auto d_f32, PoisonedF32(static_cast<size_t>(64) * kN));

  GemmArgs args{.m = kM, .n = kN, .k = kK, .x = d_x.data(), .w = d_w.data(), .y_bf16 = d_a.data()};
  ASSERT_OK(gemm->Run(args, stream_));
  EXPECT_EQ(gemm->plan_count(), 1);
  args.y_bf16 = d_b.data();  // same shape, another output: the same plan
  ASSERT_OK(gemm->Run(args, stream_));
  EXPECT_EQ(gemm->plan_count(), 1);
  ASSERT_OK_AND_ASSIGN(const std::vector<bf16> a, Download(d_a));
  ASSERT_OK_AND_ASSIGN(const std::vector<bf16> b, Download(d_b));
  for (size_t i = 0; i < static_cast<size_t>(kM) * kN; ++i) {
    ASSERT_EQ(Bits(a[i]), Bits(b[i])) << "repeated run differs at element " << i;
  }

  args.m = 3;  // another m
  ASSERT_OK(gemm->Run(args, stream_));
  EXPECT_EQ(gemm->plan_count(), 2);
  args.bias = d_bias.data();  // with bias
  ASSERT_OK(gemm->Run(args, stream_));
  EXPECT_EQ(gemm->plan_count(), 3);
  args.bias = d_bias2.data();  // another bias pointer: the same plan
  ASSERT_OK(gemm->Run(args, stream_));
  EXPECT_EQ(gemm->plan_count(), 3);
  args.bias = nullptr;  // fp32 output
  args.y_bf16 = nullptr;
  args.y_f32 = d_f32.data();
  ASSERT_OK(gemm->Run(args, stream_));
  EXPECT_EQ(gemm->plan_count(), 4);

  ASSERT_OK(gemm->Prepare(64, kN, kK, /*f32_output=*/false, /*with_bias=*/true));
  EXPECT_EQ(gemm->plan_count(), 5);
  ASSERT_OK(gemm->Prepare(64, kN, kK, /*f32_output=*/false, /*with_bias=*/true));
  EXPECT_EQ(gemm->plan_count(), 5);
  ASSERT_OK(gemm->Run({.m = 64,
                       .n = kN,
                       .k = kK,
                       .x = d_x.data(),
                       .w = d_w.data(),
                       .bias = d_bias.data(),
                       .y_bf16 = d_a.data()},
                      stream_));
  EXPECT_EQ(gemm->plan_count(), 5);

  // Refused calls build nothing.
  args.k = 12;
  EXPECT_EQ(gemm->Run(args, stream_).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gemm->Prepare(1, kN, kK, /*f32_output=*/true, /*with_bias=*/true).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gemm->Prepare(0, kN, kK, false, false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gemm->plan_count(), 5);
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
}

// ---- Graph capture: after an eager run per shape, Run captures into a CUDA graph under the
// strictest capture mode (any unsafe call, such as an allocation or a sync, fails it), and the
// replay writes the eager run's bits.
TEST_F(GemmTest, CapturedGraphReplaysEagerResult) {
  // k long enough that the few-row kernel splits it: its counters must re-arm between replays.
  constexpr int kM = 17, kN = 1000, kK = 2056;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GemmRunner> gemm,
                       GemmRunner::Create(kDefaultGemmWorkspaceBytes));
  ASSERT_OK_AND_ASSIGN(const Inputs in, RandomInputs(kM, kN, kK));
  const DeviceBuffer<bf16>&d_x = in.d_x, &d_w = in.d_w, &d_bias = in.d_bias;
  const size_t count = static_cast<size_t>(kM) * kN;
  ASSERT_OK_AND_ASSIGN(auto eager_bf16, Poisoned(count));
  ASSERT_OK_AND_ASSIGN(auto eager_f32, PoisonedF32(count));
  ASSERT_OK_AND_ASSIGN(auto graph_bf16, Poisoned(count));
  ASSERT_OK_AND_ASSIGN(auto graph_f32, PoisonedF32(count));
  const GemmArgs base{.m = kM, .n = kN, .k = kK, .x = d_x.data(), .w = d_w.data()};
  GemmArgs with_bias = base, logits = base;
  with_bias.bias = d_bias.data();

  with_bias.y_bf16 = eager_bf16.data();
  logits.y_f32 = eager_f32.data();
  ASSERT_OK(gemm->Run(with_bias, stream_));
  ASSERT_OK(gemm->Run(logits, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  ASSERT_EQ(gemm->plan_count(), 2);

  with_bias.y_bf16 = graph_bf16.data();
  logits.y_f32 = graph_f32.data();
  ASSERT_OK_AND_ASSIGN(const GraphExec exec,
                       Capture(cudaStreamCaptureModeGlobal, [&]() -> absl::Status {
                         RETURN_IF_ERROR(gemm->Run(with_bias, stream_));
                         return gemm->Run(logits, stream_);
                       }));
  EXPECT_EQ(gemm->plan_count(), 2);
  for (int replay = 0; replay < 2; ++replay) ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream_));

  ASSERT_OK_AND_ASSIGN(const std::vector<bf16> want_bf16, Download(eager_bf16));
  ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got_bf16, Download(graph_bf16));
  ASSERT_OK_AND_ASSIGN(const std::vector<float> want_f32, DownloadF32(eager_f32));
  ASSERT_OK_AND_ASSIGN(const std::vector<float> got_f32, DownloadF32(graph_f32));
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(Bits(got_bf16[i]), Bits(want_bf16[i])) << "bf16 output with bias, element " << i;
    ASSERT_EQ(BitsF32(got_f32[i]), BitsF32(want_f32[i])) << "fp32 output, element " << i;
  }
  ExpectGuardIntact(got_bf16, count);
  ExpectGuardIntactF32(got_f32, count);
}

// ---- The few-row kernel: its split depends on n and k only, so each row's sum runs in the same
// order whatever m is, and a row's bits are those of the same row in a 64-row run.
// The shallow pipeline too, and it gives the deep one's bits (the depth changes when the copies
// are issued, not the order of the sums).
TEST_F(GemmTest, FewRowKernelRowsDoNotDependOnOtherRows) {
  constexpr int kN = 4096 + 8, kK = 4096;  // split 4 ways on an H200: the deep pipeline
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GemmRunner> gemm,
                       GemmRunner::Create(kDefaultGemmWorkspaceBytes, kWholeFewRowRange));
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<GemmRunner> shallow,
      GemmRunner::Create(kDefaultGemmWorkspaceBytes,
                         {.skinny_max_rows = kSkinnyMaxRows, .skinny_deep = false}));
  ASSERT_OK_AND_ASSIGN(const Inputs in, RandomInputs(kSkinnyMaxRows, kN, kK));
  const DeviceBuffer<bf16>&d_x = in.d_x, &d_w = in.d_w, &d_bias = in.d_bias;
  const size_t full = static_cast<size_t>(kSkinnyMaxRows) * kN;
  ASSERT_OK_AND_ASSIGN(auto d_all, Poisoned(full));
  GemmArgs args{.m = kSkinnyMaxRows,
                .n = kN,
                .k = kK,
                .x = d_x.data(),
                .w = d_w.data(),
                .bias = d_bias.data(),
                .y_bf16 = d_all.data()};
  ASSERT_OK(gemm->Run(args, stream_));
  ASSERT_OK_AND_ASSIGN(const std::vector<bf16> all, Download(d_all));
  for (const int m : {1, 5, 8, 9, 16, 17, 24, 25, 31, 33, 63}) {
    for (GemmRunner* runner : {gemm.get(), shallow.get()}) {
      SCOPED_TRACE(absl::StrCat("m ", m, runner == shallow.get() ? " shallow" : " deep"));
      const size_t count = static_cast<size_t>(m) * kN;
      ASSERT_OK_AND_ASSIGN(auto d_y, Poisoned(count));
      args.m = m;
      args.y_bf16 = d_y.data();
      ASSERT_OK(runner->Run(args, stream_));
      ASSERT_OK_AND_ASSIGN(const std::vector<bf16> y, Download(d_y));
      ExpectGuardIntact(y, count);
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(Bits(y[i]), Bits(all[i])) << "row " << i / kN << " col " << i % kN;
      }
    }
  }
}

// ---- As a programmatic dependent launch the few-row kernel starts while the kernel before it
// runs (that kernel allows it at its start); it must still read that kernel's output. Here an
// embedding lookup rewrites x (cleared just before) and the GEMM follows at once.
TEST_F(GemmTest, DependentLaunchReadsThePriorKernelsOutput) {
  constexpr int kM = kSkinnyMaxRows, kN = 512, kK = 16384;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GemmRunner> gemm,
                       GemmRunner::Create(kDefaultGemmWorkspaceBytes, kWholeFewRowRange));
  const Bf16Data x = RandomBf16(rng_, static_cast<size_t>(kM) * kK, 1.0f);
  const Bf16Data w = RandomBf16(rng_, static_cast<size_t>(kN) * kK, 1.0f);
  std::vector<int32_t> rows(kM);
  for (int i = 0; i < kM; ++i) rows[i] = i;
  ASSERT_OK_AND_ASSIGN(auto d_table, Upload(x.bf));
  ASSERT_OK_AND_ASSIGN(auto d_rows, Upload(rows));
  ASSERT_OK_AND_ASSIGN(auto d_w, Upload(w.bf));
  ASSERT_OK_AND_ASSIGN(auto d_x, Poisoned(static_cast<size_t>(kM) * kK));
  const size_t count = static_cast<size_t>(kM) * kN;
  ASSERT_OK_AND_ASSIGN(auto d_want, Poisoned(count));
  ASSERT_OK_AND_ASSIGN(auto d_got, Poisoned(count));
  GemmArgs args{.m = kM, .n = kN, .k = kK, .x = d_table.data(), .w = d_w.data()};
  args.y_bf16 = d_want.data();
  ASSERT_OK(gemm->Run(args, stream_));  // from the table itself
  ASSERT_OK_AND_ASSIGN(const std::vector<bf16> want, Download(d_want));
  args.x = d_x.data();
  args.y_bf16 = d_got.data();
  for (int rep = 0; rep < 20; ++rep) {
    SCOPED_TRACE(absl::StrCat("repetition ", rep));
    ASSERT_CUDA(
        cudaMemsetAsync(d_x.data(), 0, static_cast<size_t>(kM) * kK * sizeof(bf16), stream_));
    ASSERT_CUDA(LaunchEmbedding(d_table.data(), 0, kM, kK, d_rows.data(), kM, d_x.data(), stream_));
    ASSERT_OK(gemm->Run(args, stream_));
    ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got, Download(d_got));
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(Bits(got[i]), Bits(want[i])) << "row " << i / kN << " col " << i % kN;
    }
  }
}

// ---- The SiLU·mul epilogue (the gate/up GEMM of a verify step): y[m, f] = SiLU(x·w_gateᵀ) ·
// (x·w_upᵀ) from the fp32 sums, against the CPU's MatMul then SiLU·mul in double. With gate sum
// g, up sum u and their GEMM bounds dg, du (GemmD): SiLU's slope lies in [-0.1, 1.1], so the
// product is off by at most 1.1·dg·(|u| + du) + |g|·du before fp32 SiLU·mul (a few ulps, 8e
// here) and the bf16 rounding.
TEST_F(GemmTest, SiluMulEpilogueMatchesCpu) {
  SCOPED_TRACE(absl::StrCat("seed ", Seed()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GemmRunner> gemm,
                       GemmRunner::Create(kDefaultGemmWorkspaceBytes, kWholeFewRowRange));
  constexpr int kMaxM = kSkinnyMaxRows;
  struct Shape {
    int f, k;
  };
  // f = 100: ragged tiles of 32 outputs; (1000, 4096): k split 8 ways on an H200.
  for (const Shape s : {Shape{100, 264}, Shape{1000, 4096}}) {
    SCOPED_TRACE(absl::StrCat("f ", s.f, " k ", s.k));
    const int n = 2 * s.f;
    const Bf16Data x = RandomBf16(rng_, static_cast<size_t>(kMaxM) * s.k, 1.0f);
    const Bf16Data w = RandomBf16(rng_, static_cast<size_t>(n) * s.k, 1.0f);
    std::vector<float> ref(static_cast<size_t>(kMaxM) * n), abs_sum(ref.size());
    MatMul(x.f.data(), w.f.data(), kMaxM, n, s.k, ref.data());
    {
      std::vector<float> x_abs = x.f, w_abs = w.f;
      for (float& v : x_abs) v = std::abs(v);
      for (float& v : w_abs) v = std::abs(v);
      MatMul(x_abs.data(), w_abs.data(), kMaxM, n, s.k, abs_sum.data());
    }
    ASSERT_OK_AND_ASSIGN(auto d_x, Upload(x.bf));
    ASSERT_OK_AND_ASSIGN(auto d_w, Upload(w.bf));
    for (const int m : {1, 3, 17, kMaxM}) {
      SCOPED_TRACE(absl::StrCat("m ", m));
      const size_t count = static_cast<size_t>(m) * s.f;
      ASSERT_OK_AND_ASSIGN(auto d_y, Poisoned(count));
      ASSERT_OK(gemm->Run({.m = m,
                           .n = n,
                           .k = s.k,
                           .x = d_x.data(),
                           .w = d_w.data(),
                           .y_bf16 = d_y.data(),
                           .epilogue = GemmEpilogue::kSiluMul},
                          stream_));
      ASSERT_OK_AND_ASSIGN(const std::vector<bf16> y, Download(d_y));
      ExpectGuardIntact(y, count);
      for (int r = 0; r < m; ++r) {
        for (int j = 0; j < s.f; ++j) {
          const size_t gi = static_cast<size_t>(r) * n + j, ui = gi + s.f;
          const double g = ref[gi], u = ref[ui];
          const double want = g / (1.0 + std::exp(-g)) * u;
          const double dg = GemmD(s.k, abs_sum[gi], 0), du = GemmD(s.k, abs_sum[ui], 0);
          const double d =
              1.1 * dg * (std::abs(u) + du) + std::abs(g) * du + 8 * kFp32U * std::abs(want);
          const double tol = kBf16U * std::abs(want) + (1 + kBf16U) * d;
          const double got = ToFloat(y[static_cast<size_t>(r) * s.f + j]);
          ASSERT_LE(std::abs(got - want), tol)
              << "row " << r << " col " << j << ": got " << got << " want " << want;
        }
      }
    }
  }
  // More rows than the few-row kernel takes: refused, with the way out in the message.
  ASSERT_OK_AND_ASSIGN(auto d_x, Poisoned(static_cast<size_t>(kMaxM + 1) * 264));
  ASSERT_OK_AND_ASSIGN(auto d_w, Poisoned(static_cast<size_t>(200) * 264));
  ASSERT_OK_AND_ASSIGN(auto d_y, Poisoned(static_cast<size_t>(kMaxM + 1) * 100));
  const absl::Status refused = gemm->Run({.m = kMaxM + 1,
                                          .n = 200,
                                          .k = 264,
                                          .x = d_x.data(),
                                          .w = d_w.data(),
                                          .y_bf16 = d_y.data(),
                                          .epilogue = GemmEpilogue::kSiluMul},
                                         stream_);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("LaunchSiluMul"), absl::string_view::npos) << refused;
  EXPECT_FALSE(gemm->FewRows(kMaxM + 1));
  EXPECT_TRUE(gemm->FewRows(kMaxM));
  // By default up to 32 rows (gemm.h says why).
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GemmRunner> by_default,
                       GemmRunner::Create(kDefaultGemmWorkspaceBytes));
  EXPECT_TRUE(by_default->FewRows(32));
  EXPECT_FALSE(by_default->FewRows(33));
}

// ---- Argument validation reads no device memory, so it is checked with made-up (aligned)
// addresses and runs without a GPU. Each refusal is InvalidArgument naming the bad value.
TEST(GemmArgsTest, BadArgumentsAreInvalidArgument) {
  const auto at = [](uintptr_t address) { return reinterpret_cast<bf16*>(address); };
  const GemmArgs good{.m = 3,
                      .n = 1000,
                      .k = 264,
                      .x = at(0x1000),
                      .w = at(0x2000),
                      .bias = at(0x3000),
                      .y_bf16 = at(0x4000)};
  ASSERT_OK(ValidateGemmArgs(good));
  GemmArgs f32_good = good;
  f32_good.bias = nullptr;
  f32_good.y_bf16 = nullptr;
  f32_good.y_f32 = reinterpret_cast<float*>(uintptr_t{0x5000});
  ASSERT_OK(ValidateGemmArgs(f32_good));

  struct Case {
    const char* what;
    std::function<void(GemmArgs&)> change;
    const char* message;  // a part of the error message
  };
  const Case cases[] = {
      {"m 0", [](GemmArgs& a) { a.m = 0; }, "m=0"},
      {"n negative", [](GemmArgs& a) { a.n = -1; }, "n=-1"},
      {"k 0", [](GemmArgs& a) { a.k = 0; }, "k=0"},
      {"k not a multiple of 8", [](GemmArgs& a) { a.k = 12; }, "k=12"},
      {"x null", [](GemmArgs& a) { a.x = nullptr; }, "x is null"},
      {"w misaligned", [&](GemmArgs& a) { a.w = at(0x2002); }, "w=0x2002"},
      {"bias misaligned", [&](GemmArgs& a) { a.bias = at(0x3008); }, "bias=0x3008"},
      {"y misaligned", [&](GemmArgs& a) { a.y_bf16 = at(0x4004); }, "y_bf16=0x4004"},
      {"no output", [](GemmArgs& a) { a.y_bf16 = nullptr; }, "neither"},
      {"two outputs", [](GemmArgs& a) { a.y_f32 = reinterpret_cast<float*>(uintptr_t{0x5000}); },
       "both"},
      {"bias with fp32 output",
       [](GemmArgs& a) {
         a.y_bf16 = nullptr;
         a.y_f32 = reinterpret_cast<float*>(uintptr_t{0x5000});
       },
       "fp32"},
      {"SiLU·mul with bias", [](GemmArgs& a) { a.epilogue = GemmEpilogue::kSiluMul; }, "no bias"},
      {"SiLU·mul with odd n",
       [](GemmArgs& a) {
         a.epilogue = GemmEpilogue::kSiluMul;
         a.bias = nullptr;
         a.n = 999;
       },
       "n=999"},
  };
  for (const Case& c : cases) {
    GemmArgs args = good;
    c.change(args);
    const absl::Status status = ValidateGemmArgs(args);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << status;
    EXPECT_NE(status.message().find(c.message), absl::string_view::npos)
        << c.what << ": " << status;
  }
}

}  // namespace
}  // namespace treespec::gpu
