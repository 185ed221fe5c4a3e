// treespec-verify-step-bench: one full verify step (DESIGN §3: forward of the tree, the
// choice at every node, the walk and the KV commit) of a random-weight Llama-3-8B-shaped
// target on one GPU or tensor-parallel over several (NCCL), against the step's physical floor
// (DESIGN §7).
//
//   treespec-verify-step-bench [--contexts=1024,8192,32768] [--nodes=1,16,64] [--reps=20]
//                              [--layers=32] [--tp=1,2] [--peer_all_reduce] [--cuda_graphs]
//                              [--few_row_gemm] [--dependent_launch] [--skinny_deep]
//                              [--attention_tile_rows=N] [--attention_fused_merge_row_splits=N]
//                              [--attention_wgmma] [--attention_proportional_splits]
//                              [--attention_plan_by_critical_path]
//                              [--gemm_tune_candidates=N]
//                              [--breakdown]
//                              [--json=out.json]
//
// Per context: one sequence is prefilled with random tokens (a real prefill through the same
// model); then per tree size, each repetition verifies a random tree of that many nodes (node 0
// the pending bonus token) and truncates the sequence back to the context, so every
// repetition does the same work. Reported: the median wall time of VerifyStep (host included),
// its GPU span (first to last operation on the model's stream), the host's share
// 1 - span / wall, and the floor:
//   bytes = every weight once + the K/V of the prefix and the tree (read) + the tree's K/V
//           (written);  FLOPs = 2 · (matmul parameters) · nodes + attention
//   floor = max(bytes / copy bandwidth, FLOPs / bf16 GEMM rate), both measured here first (on
//           GPU 0); with tp GPUs the floor divides both by tp (the all-reduces are not in it).
// For tp > 1 the step is also given as a fraction of the tp = 1 step at the same point (when
// --tp lists 1 first).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/gpu_ceilings.h"
#include "common/cuda/cuda_causal_lm.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/gemm.h"
#include "common/model/causal_lm.h"
#include "common/model/cpu_test_util.h"
#include "common/tree/token_tree.h"
#include "common/util/status_macros.h"

ABSL_FLAG(std::vector<std::string>, contexts, std::vector<std::string>({"1024", "8192", "32768"}),
          "committed lengths");
ABSL_FLAG(std::vector<std::string>, nodes, std::vector<std::string>({"1", "16", "64"}),
          "tree sizes (the bonus node included)");
ABSL_FLAG(int, layers, 32, "decoder layers (32 for Llama-3-8B; fewer for a quick look)");
ABSL_FLAG(int, reps, 20, "timed steps per point");
ABSL_FLAG(std::vector<std::string>, tp, std::vector<std::string>({"1"}),
          "tensor-parallel rank counts to run, each on GPUs 0..tp-1");
ABSL_FLAG(bool, peer_all_reduce, true,
          "tp > 1: fused peer-access all-reduce + norm where the GPUs allow it (else NCCL)");
ABSL_FLAG(bool, cuda_graphs, true, "tp == 1: replay each forward as a CUDA graph");
ABSL_FLAG(bool, few_row_gemm, true,
          "GEMMs of few rows (GemmOptions::skinny_max_rows) through the few-row kernel "
          "(false: cuBLASLt for all)");
ABSL_FLAG(bool, dependent_launch, true, "the few-row GEMM as a programmatic dependent launch");
ABSL_FLAG(bool, skinny_deep, true,
          "the few-row GEMM's deep pipeline for small grids (GemmOptions::skinny_deep)");
ABSL_FLAG(int, gemm_tune_candidates, treespec::gpu::GemmOptions{}.cublas_tune_candidates,
          "cuBLASLt GEMMs of the 33-64-row graph buckets: time this many of the heuristic's "
          "candidates at load and keep the fastest (0: its first; "
          "GemmOptions::cublas_tune_candidates)");
ABSL_FLAG(bool, attention_dependent_launch, true,
          "the tree attention as a programmatic dependent launch");
ABSL_FLAG(int, attention_tile_rows, 0,
          "tree attention's query rows per CTA: 0 = per launch (64, or 128 past 64 rows), 64, 128");
ABSL_FLAG(int, attention_fused_merge_row_splits, treespec::gpu::kAttnDefaultFusedMergeRowSplits,
          "split attention tiles with valid rows x splits up to this are merged by their last "
          "CTA (0: all by the merge launch)");
ABSL_FLAG(bool, attention_wgmma, true,
          "the tree attention's wgmma path on compute capability 9.0 (false: mma.sync)");
ABSL_FLAG(bool, attention_proportional_splits, true,
          "split attention key ranges in proportion to their length so the batch fills the "
          "target CTAs (false: whole chunks of key tiles per split)");
ABSL_FLAG(bool, attention_plan_by_critical_path, true,
          "plan one attention CTA per SM where the planner estimates a shorter launch (false: "
          "always fill every resident slot)");
ABSL_FLAG(bool, breakdown, false,
          "also time every op of rank 0 (events after each op; separate steps, not the timed "
          "ones) and print GPU us per step by op");
ABSL_FLAG(std::string, json, "", "also write the results here");

namespace treespec::gpu {
namespace {

ModelConfig Llama3_8B() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = absl::GetFlag(FLAGS_layers);
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 500000.0f;
  c.tie_word_embeddings = false;
  return c;
}

// Parameters that take part in matmuls (embedding lookups excluded), and all parameters.
double MatmulParams(const ModelConfig& c) {
  const double h = c.hidden_size, d = c.head_dim, i = c.intermediate_size;
  const double per_layer =
      h * (c.num_q_heads + 2 * c.num_kv_heads) * d + c.num_q_heads * d * h + 3 * h * i;
  return c.num_layers * per_layer + static_cast<double>(c.vocab_size) * h;  // + LM head
}
double AllParams(const ModelConfig& c) {
  return MatmulParams(c) + static_cast<double>(c.vocab_size) * c.hidden_size +
         (2.0 * c.num_layers + 1) * c.hidden_size;
}

using testing::RandomTree;

// Times every (context, nodes) point on `model` (tp ranks) and appends the results.
absl::Status RunPoints(CausalLm& model, const ModelConfig& config, const GpuCeilings& ceilings,
                       int tp, const std::vector<int>& contexts, const std::vector<int>& nodes,
                       std::map<std::pair<int, int>, double>& tp1_wall, nlohmann::json& results) {
  std::mt19937 rng(7);
  const int reps = absl::GetFlag(FLAGS_reps);
  const int kv_width = config.num_layers * 2 * config.num_kv_heads * config.head_dim;
  for (const int context : contexts) {
    const SeqId seq = model.CreateSequence();
    SeqTree prompt = RandomTree(seq, 0, context, config.vocab_size, rng);
    for (int i = 0; i < context; ++i) prompt.parents[i] = i - 1;
    StepSpec prefill;
    prefill.prefill = true;
    RETURN_IF_ERROR(model.VerifyStep({prompt}, {prefill}).status());
    for (const int n : nodes) {
      std::vector<double> wall_us, gpu_us;
      double attended = 0;  // keys attended by the timed trees' nodes, summed, then averaged
      for (int r = 0; r < reps + 3; ++r) {
        const SeqTree tree = RandomTree(seq, context, n, config.vocab_size, rng);
        if (r >= 3) {
          for (int32_t d : NodeDepths(tree.parents)) attended += (context + d + 1.0) / reps;
        }
        const auto start = std::chrono::steady_clock::now();
        RETURN_IF_ERROR(model.VerifyStep({tree}, {StepSpec()}).status());
        const double wall =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count();
        model.Truncate(seq, context);
        if (r < 3) continue;  // warm-up: plans, first launches
        wall_us.push_back(wall);
        gpu_us.push_back(LastVerifyStepDeviceMs(model) * 1000.0);
      }
      std::sort(wall_us.begin(), wall_us.end());
      std::sort(gpu_us.begin(), gpu_us.end());
      const double wall = wall_us[wall_us.size() / 2], gpu = gpu_us[gpu_us.size() / 2];
      const double bytes = 2.0 * AllParams(config) +
                           2.0 * kv_width * (static_cast<double>(context) + n) +  // K/V read
                           2.0 * kv_width * n;                                    // written
      const double flops = 2.0 * MatmulParams(config) * n + 4.0 * config.num_layers *
                                                                config.num_q_heads *
                                                                config.head_dim * attended;
      const double floor_us = ceilings.Floor(bytes / tp, flops / tp) * 1e6;
      if (tp == 1) tp1_wall[{context, n}] = wall;
      const auto base = tp1_wall.find({context, n});
      const double vs_tp1 = base != tp1_wall.end() ? wall / base->second : 0.0;
      std::printf("%4d %8d %6d %10.1f %10.1f %10.1f %7.2f %6.1f%% %7.2f\n", tp, context, n, wall,
                  gpu, floor_us, wall / floor_us, 100.0 * (1.0 - gpu / wall), vs_tp1);
      nlohmann::json ops = nlohmann::json::object();
      if (absl::GetFlag(FLAGS_breakdown)) {
        constexpr int kSteps = 5;
        RETURN_IF_ERROR(SetOpTiming(model, true));
        for (int r = 0; r < kSteps; ++r) {
          const SeqTree tree = RandomTree(seq, context, n, config.vocab_size, rng);
          RETURN_IF_ERROR(model.VerifyStep({tree}, {StepSpec()}).status());
          model.Truncate(seq, context);
        }
        ASSIGN_OR_RETURN(const auto times, TakeOpTimes(model));
        RETURN_IF_ERROR(SetOpTiming(model, false));
        std::printf("       us/step by op:");
        for (const auto& [op, ms] : times) {
          if (ms <= 0) continue;
          std::printf(" %s %.0f", op.c_str(), ms * 1000.0 / kSteps);
          ops[op] = ms * 1000.0 / kSteps;
        }
        std::printf("\n");
      }
      std::fflush(stdout);
      results.push_back({{"tp", tp},
                         {"ops_us", ops},
                         {"context", context},
                         {"nodes", n},
                         {"wall_us", wall},
                         {"gpu_span_us", gpu},
                         {"floor_us", floor_us},
                         {"ratio_to_floor", wall / floor_us},
                         {"host_share", 1.0 - gpu / wall},
                         {"vs_tp1", vs_tp1},
                         {"bytes", bytes},
                         {"flops", flops}});
    }
    model.FreeSequence(seq);
  }
  return absl::OkStatus();
}

absl::Status Main() {
  std::vector<int> contexts, nodes;
  for (const std::string& s : absl::GetFlag(FLAGS_contexts)) contexts.push_back(std::stoi(s));
  for (const std::string& s : absl::GetFlag(FLAGS_nodes)) nodes.push_back(std::stoi(s));
  const int max_context = *std::max_element(contexts.begin(), contexts.end());
  const int max_nodes = *std::max_element(nodes.begin(), nodes.end());

  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSIGN_OR_RETURN(const GpuCeilings ceilings, MeasureGpuCeilings(stream));

  ModelConfig config = Llama3_8B();
  config.max_position_embeddings = max_context + max_nodes + 16;
  nlohmann::json results = nlohmann::json::array();
  std::map<std::pair<int, int>, double> tp1_wall;  // (context, nodes) -> wall us at tp = 1
  for (const std::string& tp_flag : absl::GetFlag(FLAGS_tp)) {
    const int tp = std::stoi(tp_flag);
    LmOptions lm;
    lm.kv_page_size = 16;
    lm.kv_pages = (config.max_position_embeddings + 15) / 16 + 8;
    lm.tensor_parallel = tp;
    const auto load_start = std::chrono::steady_clock::now();
    CudaLmOptions cuda;
    cuda.peer_all_reduce = absl::GetFlag(FLAGS_peer_all_reduce);
    cuda.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
    if (!absl::GetFlag(FLAGS_few_row_gemm)) cuda.gemm.skinny_max_rows = 0;
    cuda.gemm.dependent_launch = absl::GetFlag(FLAGS_dependent_launch);
    cuda.gemm.skinny_deep = absl::GetFlag(FLAGS_skinny_deep);
    cuda.gemm.cublas_tune_candidates = absl::GetFlag(FLAGS_gemm_tune_candidates);
    cuda.attention_tile_rows = absl::GetFlag(FLAGS_attention_tile_rows);
    cuda.attention_dependent_launch = absl::GetFlag(FLAGS_attention_dependent_launch);
    cuda.attention_fused_merge_row_splits = absl::GetFlag(FLAGS_attention_fused_merge_row_splits);
    cuda.attention_wgmma = absl::GetFlag(FLAGS_attention_wgmma);
    cuda.attention_proportional_splits = absl::GetFlag(FLAGS_attention_proportional_splits);
    cuda.attention_plan_by_critical_path = absl::GetFlag(FLAGS_attention_plan_by_critical_path);
    ASSIGN_OR_RETURN(std::unique_ptr<CausalLm> model,
                     CreateRandomCudaCausalLm(config, 1, lm, cuda));
    std::printf(
        "%s: copy %.3g B/s, bf16 GEMM %.3g FLOP/s; Llama-3-8B shape, %d layers, %.2fB "
        "params, tp %d on %s (made on the GPUs in %.1f s)\n",
        ceilings.device.c_str(), ceilings.copy_bandwidth, ceilings.bf16_gemm_rate,
        config.num_layers, AllParams(config) / 1e9, tp, model->device().c_str(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count());
    if (tp > 1) {
      // The forward's collectives: an all-reduce of [rows, hidden] bf16 after the embedding and
      // after each o_proj and down_proj.
      for (const int n : nodes) {
        ASSIGN_OR_RETURN(const double s,
                         MeasureAllReduceSeconds(tp, static_cast<size_t>(n) * config.hidden_size));
        std::printf("  all-reduce of %d x %d bf16 over %d GPUs: %.1f us; %d per step = %.0f us\n",
                    n, config.hidden_size, tp, s * 1e6, 2 * config.num_layers + 1,
                    s * 1e6 * (2 * config.num_layers + 1));
      }
    }
    std::printf("%4s %8s %6s %10s %10s %10s %7s %7s %7s\n", "tp", "context", "nodes", "wall_us",
                "gpu_us", "floor_us", "ratio", "host%", "vs_tp1");
    RETURN_IF_ERROR(RunPoints(*model, config, ceilings, tp, contexts, nodes, tp1_wall, results));
  }
  WriteBenchJson(
      absl::GetFlag(FLAGS_json), ceilings, results,
      {{"layers", config.num_layers},
       {"peer_all_reduce", absl::GetFlag(FLAGS_peer_all_reduce)},
       {"cuda_graphs", absl::GetFlag(FLAGS_cuda_graphs)},
       {"few_row_gemm", absl::GetFlag(FLAGS_few_row_gemm)},
       {"dependent_launch", absl::GetFlag(FLAGS_dependent_launch)},
       {"skinny_deep", absl::GetFlag(FLAGS_skinny_deep)},
       {"gemm_tune_candidates", absl::GetFlag(FLAGS_gemm_tune_candidates)},
       {"attention_tile_rows", absl::GetFlag(FLAGS_attention_tile_rows)},
       {"attention_dependent_launch", absl::GetFlag(FLAGS_attention_dependent_launch)},
       {"attention_fused_merge_row_splits", absl::GetFlag(FLAGS_attention_fused_merge_row_splits)},
       {"attention_wgmma", absl::GetFlag(FLAGS_attention_wgmma)},
       {"attention_proportional_splits", absl::GetFlag(FLAGS_attention_proportional_splits)},
       {"attention_plan_by_critical_path", absl::GetFlag(FLAGS_attention_plan_by_critical_path)}});
  return absl::OkStatus();
}

}  // namespace
}  // namespace treespec::gpu

int main(int argc, char** argv) {
  return treespec::gpu::BenchMain(
      argc, argv, "treespec-verify-step-bench",
      "One full verify step of a Llama-3-8B-shaped target against its physical floor.",
      treespec::gpu::Main);
}
