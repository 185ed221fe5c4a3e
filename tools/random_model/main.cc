// Writes a random-weight checkpoint in Hugging Face layout, e.g.
//   treespec-random-model --arch=qwen3 --layers=2 --hidden=64 --dtype=bf16 --shards=2 --out=/tmp/m
//   treespec-random-model --arch=deepseek_v3 --layers=3 --experts=8 --expert_groups=4 \
//       --topk_groups=2 --rope_scaling=yarn:4 --yarn_mscale=1 --yarn_mscale_all_dim=1 --out=/tmp/d
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/config.h"
#include "common/model/random_model.h"

ABSL_FLAG(std::string, arch, "llama", "llama | mistral | qwen2 | qwen3 | deepseek_v3");
ABSL_FLAG(int, vocab, 512, "vocabulary size");
ABSL_FLAG(int, hidden, 64, "hidden size");
ABSL_FLAG(int, intermediate, 176, "MLP intermediate size");
ABSL_FLAG(int, layers, 2, "decoder layers");
ABSL_FLAG(int, heads, 4, "query heads");
ABSL_FLAG(int, kv_heads, 2, "key/value heads");
ABSL_FLAG(int, head_dim, 0, "head dimension; 0: hidden / heads");
ABSL_FLAG(int, context, 2048, "max_position_embeddings");
ABSL_FLAG(double, rope_theta, 10000.0, "RoPE base");
ABSL_FLAG(std::string, rope_scaling, "none", "none | linear:F | llama3:F | yarn:F");
ABSL_FLAG(double, yarn_mscale, 0.0,
          "yarn only: DeepSeek's mscale (with --yarn_mscale_all_dim; 0: write attention_factor)");
ABSL_FLAG(double, yarn_mscale_all_dim, 0.0, "yarn only: DeepSeek's mscale_all_dim");
ABSL_FLAG(bool, tied, false, "tie lm_head to the embedding");
// deepseek_v3 only (MLA attention, MoE MLPs); --heads sets the query heads, --intermediate the
// dense layers' MLP; --kv_heads and --head_dim are not used.
ABSL_FLAG(int, q_lora_rank, 0, "deepseek_v3: query LoRA rank (0: a direct q_proj)");
ABSL_FLAG(int, kv_lora_rank, 32, "deepseek_v3: width of the KV latent");
ABSL_FLAG(int, qk_nope_head_dim, 16, "deepseek_v3: per-head key part without RoPE");
ABSL_FLAG(int, qk_rope_head_dim, 8, "deepseek_v3: shared rotary key part");
ABSL_FLAG(int, v_head_dim, 16, "deepseek_v3: per-head value width");
ABSL_FLAG(bool, rope_interleave, true, "deepseek_v3: interleaved rotary layout");
ABSL_FLAG(int, experts, 8, "deepseek_v3: routed experts (n_routed_experts)");
ABSL_FLAG(int, shared_experts, 1, "deepseek_v3: n_shared_experts (0: none)");
ABSL_FLAG(int, experts_per_tok, 2, "deepseek_v3: experts per token");
ABSL_FLAG(int, expert_groups, 1, "deepseek_v3: n_group");
ABSL_FLAG(int, topk_groups, 1, "deepseek_v3: topk_group");
ABSL_FLAG(int, moe_intermediate, 32, "deepseek_v3: each expert's MLP width");
ABSL_FLAG(int, first_dense, 1, "deepseek_v3: first_k_dense_replace (dense layers first)");
ABSL_FLAG(double, routed_scaling, 2.5, "deepseek_v3: routed_scaling_factor");
ABSL_FLAG(bool, norm_topk_prob, true, "deepseek_v3: normalize the chosen experts' weights");
ABSL_FLAG(int, bos, -1, "bos_token_id (-1: none)");
ABSL_FLAG(std::string, eos, "", "eos_token_id, comma-separated (empty: none)");
ABSL_FLAG(std::string, dtype, "f32", "f32 | bf16 | f16");
ABSL_FLAG(int, shards, 1, "number of safetensors files (> 1 writes model.safetensors.index.json)");
ABSL_FLAG(uint64_t, seed, 0, "random seed; same flags and seed give identical files");
ABSL_FLAG(double, init_std, 0.02, "standard deviation of the weights");
ABSL_FLAG(std::string, tokenizer, "", "optional tokenizer.json to copy into the model directory");
ABSL_FLAG(std::string, out, "", "output directory (required)");

namespace treespec {
namespace {

// MLA and MoE from the deepseek_v3 flags; WriteRandomModel's re-parse checks them.
void SetDeepseekFromFlags(ModelConfig& c) {
  c.attention = AttentionKind::kMla;
  c.num_kv_heads = c.num_q_heads;
  MlaConfig& m = c.mla;
  m.q_lora_rank = absl::GetFlag(FLAGS_q_lora_rank);
  m.kv_lora_rank = absl::GetFlag(FLAGS_kv_lora_rank);
  m.qk_nope_head_dim = absl::GetFlag(FLAGS_qk_nope_head_dim);
  m.qk_rope_head_dim = absl::GetFlag(FLAGS_qk_rope_head_dim);
  m.v_head_dim = absl::GetFlag(FLAGS_v_head_dim);
  m.rope_interleave = absl::GetFlag(FLAGS_rope_interleave);
  c.head_dim = m.qk_rope_head_dim;
  MoeConfig& e = c.moe;
  e.num_experts = absl::GetFlag(FLAGS_experts);
  e.num_shared_experts = absl::GetFlag(FLAGS_shared_experts);
  e.experts_per_token = absl::GetFlag(FLAGS_experts_per_tok);
  e.num_groups = absl::GetFlag(FLAGS_expert_groups);
  e.topk_groups = absl::GetFlag(FLAGS_topk_groups);
  e.expert_intermediate_size = absl::GetFlag(FLAGS_moe_intermediate);
  e.first_dense_layers = absl::GetFlag(FLAGS_first_dense);
  e.routed_scaling_factor = static_cast<float>(absl::GetFlag(FLAGS_routed_scaling));
  e.norm_topk_prob = absl::GetFlag(FLAGS_norm_topk_prob);
}

absl::StatusOr<ModelConfig> ConfigFromFlags() {
  ModelConfig c;
  const std::string arch = absl::GetFlag(FLAGS_arch);
  if (arch == "llama") {
    c.architecture = "LlamaForCausalLM";
  } else if (arch == "mistral") {
    c.architecture = "MistralForCausalLM";
  } else if (arch == "qwen2") {
    c.architecture = "Qwen2ForCausalLM";
  } else if (arch == "qwen3") {
    c.architecture = "Qwen3ForCausalLM";
  } else if (arch == "deepseek_v3") {
    c.architecture = "DeepseekV3ForCausalLM";
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--arch: unknown '", arch, "'"));
  }
  c.vocab_size = absl::GetFlag(FLAGS_vocab);
  c.hidden_size = absl::GetFlag(FLAGS_hidden);
  c.intermediate_size = absl::GetFlag(FLAGS_intermediate);
  c.num_layers = absl::GetFlag(FLAGS_layers);
  c.num_q_heads = absl::GetFlag(FLAGS_heads);
  c.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  c.head_dim = absl::GetFlag(FLAGS_head_dim);
  if (c.head_dim == 0 && c.num_q_heads > 0) c.head_dim = c.hidden_size / c.num_q_heads;
  c.max_position_embeddings = absl::GetFlag(FLAGS_context);
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = static_cast<float>(absl::GetFlag(FLAGS_rope_theta));
  c.tie_word_embeddings = absl::GetFlag(FLAGS_tied);
  c.qkv_bias = arch == "qwen2";
  c.qk_norm = arch == "qwen3";
  c.bos_token_id = absl::GetFlag(FLAGS_bos);
  for (absl::string_view id : absl::StrSplit(absl::GetFlag(FLAGS_eos), ',', absl::SkipEmpty())) {
    int v;
    if (!absl::SimpleAtoi(id, &v)) return absl::InvalidArgumentError("--eos: not a list of ids");
    c.eos_token_ids.push_back(v);
  }

  const std::string rope = absl::GetFlag(FLAGS_rope_scaling);
  if (rope != "none") {
    std::vector<std::string> parts = absl::StrSplit(rope, ':');
    float factor = 0;
    if (parts.size() != 2 || !absl::SimpleAtof(parts[1], &factor) || !(factor >= 1.0f)) {
      return absl::InvalidArgumentError(
          "--rope_scaling: expected none, linear:F, llama3:F or yarn:F");
    }
    RopeScaling& rs = c.rope_scaling;
    rs.factor = factor;
    // The context before scaling, which llama3 and yarn need.
    const int original = std::max(1, static_cast<int>(c.max_position_embeddings / factor));
    if (parts[0] == "linear") {
      rs.type = RopeScaling::Type::kLinear;
    } else if (parts[0] == "llama3") {
      rs.type = RopeScaling::Type::kLlama3;
      rs.original_max_position_embeddings = original;
    } else if (parts[0] == "yarn") {
      rs.type = RopeScaling::Type::kYarn;
      rs.original_max_position_embeddings = original;
      rs.mscale = static_cast<float>(absl::GetFlag(FLAGS_yarn_mscale));
      rs.mscale_all_dim = static_cast<float>(absl::GetFlag(FLAGS_yarn_mscale_all_dim));
      rs.attention_factor = 0.1f * std::log(factor) + 1.0f;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--rope_scaling: unknown type '", parts[0], "'"));
    }
  }
  if (arch == "deepseek_v3") SetDeepseekFromFlags(c);
  return c;
}

int Main() {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "--out is required\n");
    return 2;
  }
  absl::StatusOr<ModelConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  RandomModelOptions options;
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype == "f32") {
    options.dtype = DType::kF32;
  } else if (dtype == "bf16") {
    options.dtype = DType::kBF16;
  } else if (dtype == "f16") {
    options.dtype = DType::kF16;
  } else {
    std::fprintf(stderr, "--dtype: expected f32, bf16 or f16\n");
    return 2;
  }
  options.num_shards = absl::GetFlag(FLAGS_shards);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.init_std = static_cast<float>(absl::GetFlag(FLAGS_init_std));
  options.tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  absl::Status status = WriteRandomModel(*config, options, out);
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s (%s, %d layers, hidden %d, vocab %d, %s, %d shard%s)\n", out.c_str(),
              config->architecture.c_str(), config->num_layers, config->hidden_size,
              config->vocab_size, dtype.c_str(), options.num_shards,
              options.num_shards > 1 ? "s" : "");
  return 0;
}

}  // namespace
}  // namespace treespec

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes a random-weight Hugging Face checkpoint (Llama family or DeepSeek-V3).");
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "random_model/main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  return treespec::Main();
}
