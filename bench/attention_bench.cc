// treespec-attention-bench: one layer of GPU tree attention against its physical floor
// (DESIGN §7), Llama-3-8B shape by default (32 q / 8 kv heads, head dim 128, pages of 16).
//
//   treespec-attention-bench [--contexts=1024,8192,32768,131072] [--nodes=1,16,64,256]
//                            [--batches=1,8] [--tile_rows=0,64,128] [--reps=20]
//                            [--fused_merge_row_splits=N] [--wgmma] [--proportional_splits]
//                            [--plan_by_critical_path]
//                            [--json=out.json]
//
// Per point: every sequence has `context` committed tokens plus a random tree of `nodes`
// nodes (parents drawn among earlier nodes), its pages in shuffled order. Each repetition
// first reads a buffer larger than L2 (bench/l2_flush.h), then times one launch with CUDA
// events (the K/V of a real step's layer is not in L2 either); the median and the minimum are
// reported.
//   bytes = K and V of every attended slot (prefix + tree) + q + out
//   FLOPs = 4 · q heads · head dim · Σ over nodes of the keys it attends (prefix + ancestors)
//   floor = max(bytes / copy bandwidth, FLOPs / bf16 GEMM rate), both measured here first.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bench/gpu_ceilings.h"
#include "bench/l2_flush.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_buffer.h"
#include "common/cuda/paged_kv.h"
#include "common/cuda/tree_attention.h"
#include "common/tree/token_tree.h"
#include "common/util/status_macros.h"

ABSL_FLAG(std::vector<std::string>, contexts,
          std::vector<std::string>({"1024", "8192", "32768", "131072"}), "committed lengths");
ABSL_FLAG(std::vector<std::string>, nodes, std::vector<std::string>({"1", "16", "64", "256"}),
          "tree sizes (the bonus node included)");
ABSL_FLAG(std::vector<std::string>, batches, std::vector<std::string>({"1", "8"}),
          "sequences per launch");
ABSL_FLAG(int, q_heads, 32, "q heads");
ABSL_FLAG(int, kv_heads, 8, "kv heads");
ABSL_FLAG(int, head_dim, 128, "head dim");
ABSL_FLAG(int, reps, 20, "timed launches per point");
ABSL_FLAG(int, min_split_tiles, 1, "TreeAttentionOptions::min_split_tiles");
ABSL_FLAG(int, ctas_per_sm, 0, "TreeAttentionOptions::target_ctas_per_sm (0: all resident)");
ABSL_FLAG(int, fused_merge_row_splits, treespec::gpu::kAttnDefaultFusedMergeRowSplits,
          "TreeAttentionOptions::fused_merge_row_splits (0: every split tile by the merge launch)");
ABSL_FLAG(bool, wgmma, true, "TreeAttentionOptions::wgmma (false: the mma.sync path everywhere)");
ABSL_FLAG(bool, proportional_splits, true,
          "TreeAttentionOptions::proportional_splits (false: whole chunks of key tiles)");
ABSL_FLAG(bool, plan_by_critical_path, true,
          "TreeAttentionOptions::plan_by_critical_path (false: always fill every resident slot)");
ABSL_FLAG(std::vector<std::string>, tile_rows, std::vector<std::string>({"0"}),
          "TreeAttentionOptions::tile_rows to run, each point once per value (0: automatic)");
ABSL_FLAG(bool, dirty_flush, false,
          "empty L2 between launches with a cudaMemset (dirty lines) instead of a read");
ABSL_FLAG(std::string, json, "", "also write the results here");

namespace treespec::gpu {
namespace {

constexpr int kPageSize = 16;

struct Case {
  int context, nodes, batch, tile_rows;
};

absl::StatusOr<nlohmann::json> RunCase(const Case& c, const GpuCeilings& ceilings, L2Flush& flush,
                                       cudaStream_t stream) {
  const int q_heads = absl::GetFlag(FLAGS_q_heads), kv_heads = absl::GetFlag(FLAGS_kv_heads);
  const int d = absl::GetFlag(FLAGS_head_dim);
  const int pages_per_seq = (c.context + c.nodes + kPageSize - 1) / kPageSize;
  const int pool_pages = pages_per_seq * c.batch;
  ASSIGN_OR_RETURN(DeviceKvPool pool, DeviceKvPool::Create(1, pool_pages, kPageSize, kv_heads, d));
  const KvLayerView layer = pool.Layer(0);
  // Values do not change the timing; a small constant keeps the arithmetic finite.
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(layer.k, 0x3c, pool.bytes(), stream));

  std::mt19937 rng(c.context * 31 + c.nodes * 7 + c.batch);
  std::vector<int32_t> page_order(pool_pages);
  std::iota(page_order.begin(), page_order.end(), 0);
  std::shuffle(page_order.begin(), page_order.end(), rng);
  std::vector<std::vector<int32_t>> pages(c.batch);
  std::vector<std::vector<uint64_t>> masks(c.batch);
  std::vector<AttnSeqDesc> seqs(c.batch);
  double attended = 0;  // Σ over nodes of visible keys
  for (int b = 0; b < c.batch; ++b) {
    pages[b].assign(page_order.begin() + b * pages_per_seq,
                    page_order.begin() + (b + 1) * pages_per_seq);
    std::vector<int32_t> parents(c.nodes, -1);
    for (int i = 1; i < c.nodes; ++i)
      parents[i] = std::uniform_int_distribution<int>(0, i - 1)(rng);
    masks[b] = AncestorMask(parents);
    for (int32_t depth : NodeDepths(parents)) attended += c.context + depth + 1;
    seqs[b].pages = pages[b];
    seqs[b].prefix_len = c.context;
    seqs[b].num_nodes = c.nodes;
    seqs[b].ancestor_mask = masks[b];
  }

  TreeAttentionOptions options;
  options.heads = {q_heads, kv_heads, q_heads / kv_heads, 0};
  options.head_dim = d;
  options.page_size = kPageSize;
  options.pool_pages = pool_pages;
  options.scale = 1.0f / std::sqrt(static_cast<float>(d));
  options.limits = {c.batch, pool_pages, c.batch * c.nodes * ((c.nodes + 63) / 64), 1 << 16,
                    1 << 16};
  options.min_split_tiles = absl::GetFlag(FLAGS_min_split_tiles);
  options.target_ctas_per_sm = absl::GetFlag(FLAGS_ctas_per_sm);
  options.fused_merge_row_splits = absl::GetFlag(FLAGS_fused_merge_row_splits);
  options.wgmma = absl::GetFlag(FLAGS_wgmma);
  options.proportional_splits = absl::GetFlag(FLAGS_proportional_splits);
  options.plan_by_critical_path = absl::GetFlag(FLAGS_plan_by_critical_path);
  options.tile_rows = c.tile_rows;
  ASSIGN_OR_RETURN(std::unique_ptr<TreeAttention> attention, TreeAttention::Create(options));
  RETURN_IF_ERROR(attention->Prepare(seqs, stream));

  const size_t q_elems = static_cast<size_t>(c.batch) * c.nodes * q_heads * d;
  ASSIGN_OR_RETURN(auto q, DeviceBuffer<__nv_bfloat16>::Create(q_elems));
  ASSIGN_OR_RETURN(auto out, DeviceBuffer<__nv_bfloat16>::Create(q_elems));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(q.data(), 0x3c, q.bytes(), stream));

  cudaEvent_t start, stop;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  CUDA_RETURN_IF_ERROR(attention->Run(layer, q.data(), out.data(), stream));  // warm-up
  std::vector<double> times_us;
  const int reps = absl::GetFlag(FLAGS_reps);
  for (int r = 0; r < reps; ++r) {
    RETURN_IF_ERROR(flush.Run(stream));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
    CUDA_RETURN_IF_ERROR(attention->Run(layer, q.data(), out.data(), stream));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
    times_us.push_back(ms * 1000.0);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times_us.begin(), times_us.end());
  const double median_us = times_us[times_us.size() / 2];

  const double kv_bytes =
      static_cast<double>(c.batch) * (c.context + c.nodes) * kv_heads * d * 2 /*K,V*/ * 2;
  const double bytes = kv_bytes + 2.0 * q_elems * 2 /*q and out*/;
  const double flops = 4.0 * q_heads * d * attended;
  const double floor_us = ceilings.Floor(bytes, flops) * 1e6;
  return nlohmann::json{
      {"context", c.context},
      {"nodes", c.nodes},
      {"batch", c.batch},
      {"median_us", median_us},
      {"min_us", times_us.front()},
      {"bytes", bytes},
      {"flops", flops},
      {"bytes_per_s", bytes / (median_us * 1e-6)},
      {"flops_per_s", flops / (median_us * 1e-6)},
      {"floor_us", floor_us},
      {"bound",
       bytes / ceilings.copy_bandwidth >= flops / ceilings.bf16_gemm_rate ? "memory" : "compute"},
      {"ratio_to_floor", median_us / floor_us},
      {"ctas", attention->plan().items.size()},
      {"tile_rows", attention->plan().tile_rows},
      {"split_tiles", attention->plan().num_split_tiles}};
}

absl::Status Main() {
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSIGN_OR_RETURN(const GpuCeilings ceilings, MeasureGpuCeilings(stream));
  ASSIGN_OR_RETURN(L2Flush flush, L2Flush::Create(absl::GetFlag(FLAGS_dirty_flush)));
  std::printf("%s: copy %.3g B/s, bf16 GEMM %.3g FLOP/s; %d q / %d kv heads, d %d, pages of %d\n",
              ceilings.device.c_str(), ceilings.copy_bandwidth, ceilings.bf16_gemm_rate,
              absl::GetFlag(FLAGS_q_heads), absl::GetFlag(FLAGS_kv_heads),
              absl::GetFlag(FLAGS_head_dim), kPageSize);
  std::printf("%8s %6s %5s %4s %11s %11s %11s %7s %8s %6s\n", "context", "nodes", "batch", "rows",
              "median_us", "floor_us", "ratio", "bound", "TB/s", "TF/s");
  nlohmann::json results = nlohmann::json::array();
  for (const std::string& b : absl::GetFlag(FLAGS_batches)) {
    for (const std::string& ctx : absl::GetFlag(FLAGS_contexts)) {
      for (const std::string& n : absl::GetFlag(FLAGS_nodes)) {
        for (const std::string& t : absl::GetFlag(FLAGS_tile_rows)) {
          const Case c{std::stoi(ctx), std::stoi(n), std::stoi(b), std::stoi(t)};
          ASSIGN_OR_RETURN(nlohmann::json r, RunCase(c, ceilings, flush, stream));
          std::printf("%8d %6d %5d %4d %11.2f %11.2f %11.2f %7s %8.2f %6.0f\n", c.context, c.nodes,
                      c.batch, r["tile_rows"].get<int>(), r["median_us"].get<double>(),
                      r["floor_us"].get<double>(), r["ratio_to_floor"].get<double>(),
                      r["bound"].get<std::string>().c_str(), r["bytes_per_s"].get<double>() / 1e12,
                      r["flops_per_s"].get<double>() / 1e12);
          std::fflush(stdout);
          results.push_back(std::move(r));
        }
      }
    }
  }
  WriteBenchJson(absl::GetFlag(FLAGS_json), ceilings, results,
                 {{"min_split_tiles", absl::GetFlag(FLAGS_min_split_tiles)},
                  {"fused_merge_row_splits", absl::GetFlag(FLAGS_fused_merge_row_splits)},
                  {"wgmma", absl::GetFlag(FLAGS_wgmma)},
                  {"proportional_splits", absl::GetFlag(FLAGS_proportional_splits)},
                  {"plan_by_critical_path", absl::GetFlag(FLAGS_plan_by_critical_path)},
                  {"ctas_per_sm", absl::GetFlag(FLAGS_ctas_per_sm)},
                  {"dirty_flush", absl::GetFlag(FLAGS_dirty_flush)}});
  return absl::OkStatus();
}

}  // namespace
}  // namespace treespec::gpu

int main(int argc, char** argv) {
  return treespec::gpu::BenchMain(
      argc, argv, "treespec-attention-bench",
      "One layer of GPU tree attention against its physical floor (Llama-3-8B shape).",
      treespec::gpu::Main);
}
