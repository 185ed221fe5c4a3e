#include "common/model/random_model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numbers>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "common/util/mix64.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace treespec {
namespace {

using OrderedJson = nlohmann::ordered_json;

// The double nearest to the shortest decimal that round-trips `f`, so config.json says
// 1e-05 rather than 9.999999747378752e-06.
double ShortestDouble(float f) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), f);
  *end = '\0';
  return std::strtod(buf, nullptr);
}

uint64_t TensorKey(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return Mix64(seed * 0x9e3779b97f4a7c15ull ^ h);
}

// Standard normals by Box-Muller from a counter-based hash: pair p yields elements 2p (cosine)
// and 2p + 1 (sine), so any element can be produced without its predecessors.
void FillNormal(uint64_t key, int64_t begin, absl::Span<float> out, float mean, float std) {
  const int64_t end = begin + static_cast<int64_t>(out.size());
  for (int64_t pair = begin / 2; 2 * pair < end; ++pair) {
    const uint64_t bits = Mix64(key + static_cast<uint64_t>(pair) * 0x9e3779b97f4a7c15ull);
    const double u1 = (static_cast<double>(bits >> 40) + 1.0) * 0x1p-24;  // (0, 1]
    const double u2 = static_cast<double>(bits & 0xffffffull) * 0x1p-24;  // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    const int64_t i = 2 * pair;
    if (i >= begin) out[i - begin] = static_cast<float>(mean + std * r * std::cos(angle));
    if (i + 1 >= begin && i + 1 < end) {
      out[i + 1 - begin] = static_cast<float>(mean + std * r * std::sin(angle));
    }
  }
}

OrderedJson RopeScalingJson(const RopeScaling& rs) {
  switch (rs.type) {
    case RopeScaling::Type::kNone:
      return nullptr;
    case RopeScaling::Type::kLinear:
      return {{"rope_type", "linear"}, {"factor", ShortestDouble(rs.factor)}};
    case RopeScaling::Type::kLlama3:
      return {{"rope_type", "llama3"},
              {"factor", ShortestDouble(rs.factor)},
              {"low_freq_factor", ShortestDouble(rs.low_freq_factor)},
              {"high_freq_factor", ShortestDouble(rs.high_freq_factor)},
              {"original_max_position_embeddings", rs.original_max_position_embeddings}};
    case RopeScaling::Type::kYarn: {
      OrderedJson j = {{"rope_type", "yarn"},
                       {"factor", ShortestDouble(rs.factor)},
                       {"original_max_position_embeddings", rs.original_max_position_embeddings},
                       {"beta_fast", ShortestDouble(rs.beta_fast)},
                       {"beta_slow", ShortestDouble(rs.beta_slow)}};
      if (rs.mscale != 0.0f || rs.mscale_all_dim != 0.0f) {
        // DeepSeek's spelling: the loader derives attention_factor from these two, and MLA's
        // softmax scale needs mscale_all_dim.
        j["mscale"] = ShortestDouble(rs.mscale);
        j["mscale_all_dim"] = ShortestDouble(rs.mscale_all_dim);
      } else {
        j["attention_factor"] = ShortestDouble(rs.attention_factor);
      }
      return j;
    }
  }
  return nullptr;
}

absl::Status RemoveStaleCheckpoint(const std::string& dir) {
  // error_code overloads throughout: filesystem errors must not become exceptions.
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == "model.safetensors" || name == "model.safetensors.index.json" ||
        (absl::StartsWith(name, "model-") && absl::EndsWith(name, ".safetensors"))) {
      stale.push_back(it->path());
    }
  }
  if (ec) return absl::InternalError(absl::StrCat(dir, ": cannot list: ", ec.message()));
  for (const auto& path : stale) {
    if (!std::filesystem::remove(path, ec) && ec) {
      return absl::InternalError(absl::StrCat(path.string(), ": cannot remove: ", ec.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace

std::string ModelConfigToHfJson(const ModelConfig& c, DType dtype, float initializer_range) {
  const bool llama = c.architecture == "LlamaForCausalLM";
  const bool mistral = c.architecture == "MistralForCausalLM";
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  const bool qwen3 = c.architecture == "Qwen3ForCausalLM";
  const bool deepseek = c.architecture == "DeepseekV3ForCausalLM";
  OrderedJson j;
  j["architectures"] = {c.architecture};
  j["model_type"] = llama      ? "llama"
                    : mistral  ? "mistral"
                    : qwen2    ? "qwen2"
                    : qwen3    ? "qwen3"
                    : deepseek ? "deepseek_v3"
                               : "unknown";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_q_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = ShortestDouble(c.rms_norm_eps);
  j["rope_theta"] = ShortestDouble(c.rope_theta);
  j["rope_scaling"] = RopeScalingJson(c.rope_scaling);
  // transformers 5 reads `rope_parameters` (theta and scaling together) and, like
  // transformers 5 itself, we write both spellings so either major version loads the file.
  OrderedJson rope_parameters =
      j["rope_scaling"].is_null() ? OrderedJson{{"rope_type", "default"}} : j["rope_scaling"];
  rope_parameters["rope_theta"] = j["rope_theta"];
  j["rope_parameters"] = std::move(rope_parameters);
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (llama) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  if (qwen3) j["attention_bias"] = false;
  if (deepseek) {
    // DeepseekV3Config's head_dim is always qk_rope_head_dim; write what it will hold.
    const MlaConfig& m = c.mla;
    j["q_lora_rank"] = m.q_lora_rank > 0 ? OrderedJson(m.q_lora_rank) : OrderedJson(nullptr);
    j["kv_lora_rank"] = m.kv_lora_rank;
    j["qk_nope_head_dim"] = m.qk_nope_head_dim;
    j["qk_rope_head_dim"] = m.qk_rope_head_dim;
    j["v_head_dim"] = m.v_head_dim;
    j["rope_interleave"] = m.rope_interleave;
    j["attention_bias"] = false;
    const MoeConfig& e = c.moe;
    j["first_k_dense_replace"] = e.num_experts > 0 ? e.first_dense_layers : c.num_layers;
    j["n_routed_experts"] = e.num_experts;
    j["n_shared_experts"] = e.num_shared_experts;
    j["num_experts_per_tok"] = e.experts_per_token;
    j["moe_intermediate_size"] = e.expert_intermediate_size;
    j["n_group"] = e.num_groups;
    j["topk_group"] = e.topk_groups;
    j["routed_scaling_factor"] = ShortestDouble(e.routed_scaling_factor);
    j["norm_topk_prob"] = e.norm_topk_prob;
    j["num_nextn_predict_layers"] = c.num_mtp_layers;
  }
  if (mistral) j["sliding_window"] = nullptr;
  if (qwen2 || qwen3) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  }
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = ShortestDouble(initializer_range);
  j["bos_token_id"] = c.bos_token_id >= 0 ? OrderedJson(c.bos_token_id) : OrderedJson(nullptr);
  if (c.eos_token_ids.empty()) {
    j["eos_token_id"] = nullptr;
  } else if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else {
    j["eos_token_id"] = c.eos_token_ids;
  }
  j["dtype"] = DTypeTorchName(dtype);        // transformers 5
  j["torch_dtype"] = DTypeTorchName(dtype);  // transformers 4
  j["use_cache"] = true;
  return j.dump(2, ' ', false, OrderedJson::error_handler_t::replace) + "\n";
}

void RandomTensorValues(uint64_t seed, float init_std, const std::string& hf_name, SlotKind kind,
                        int64_t begin, absl::Span<float> out) {
  FillNormal(TensorKey(seed, hf_name), begin, out, kind == SlotKind::kNorm ? 1.0f : 0.0f, init_std);
}

absl::Status WriteRandomModel(const ModelConfig& config, const RandomModelOptions& options,
                              const std::string& dir) {
  // Never write a checkpoint our own loader would refuse.
  const std::string config_json = ModelConfigToHfJson(config, options.dtype, options.init_std);
  if (absl::StatusOr<ModelConfig> parsed = ParseModelConfig(config_json); !parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteRandomModel: the config would not load: ", parsed.status().message()));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  RETURN_IF_ERROR(RemoveStaleCheckpoint(dir));

  // The tensors this config has, in ForEachTensor order, with shapes but no storage.
  std::vector<SafetensorsEntry> entries;
  absl::flat_hash_map<std::string, SlotKind> kinds;
  ModelWeights shapes_only;
  ForEachTensor(config, shapes_only, [&](TensorSlot& slot) {
    if (!slot.present) return;
    entries.push_back({slot.hf_name, options.dtype, slot.shape});
    kinds[slot.hf_name] = slot.kind;
  });
  const int shards = options.num_shards;
  if (shards < 1 || shards > static_cast<int>(entries.size())) {
    return absl::InvalidArgumentError(absl::StrCat("num_shards must be in [1, ", entries.size(),
                                                   "] for this model, got ", shards));
  }

  // Contiguous runs of tensors, cut where the running byte count passes k/shards of the total.
  const uint64_t total_bytes = SafetensorsWriter::DataBytes(entries);
  std::vector<std::vector<SafetensorsEntry>> shard_entries(shards);
  uint64_t running = 0;
  int shard = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!shard_entries[shard].empty() && shard + 1 < shards) {
      // Move on when this shard has its share, or when every later shard needs one of the
      // remaining tensors.
      const size_t left = entries.size() - i;
      const size_t empty_shards = static_cast<size_t>(shards - shard - 1);
      if (left <= empty_shards || running >= total_bytes * (shard + 1) / shards) ++shard;
    }
    shard_entries[shard].push_back(entries[i]);
    running += SafetensorsWriter::DataBytes({entries[i]});
  }

  OrderedJson weight_map = OrderedJson::object();
  const unsigned threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  constexpr int64_t kChunk = int64_t{1} << 22;  // elements generated per step
  std::vector<float> chunk;
  for (int s = 0; s < shards; ++s) {
    const std::string file_name =
        shards == 1 ? "model.safetensors"
                    : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards);
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                     SafetensorsWriter::Create(dir + "/" + file_name, shard_entries[s]));
    for (const SafetensorsEntry& e : shard_entries[s]) {
      weight_map[e.name] = file_name;
      const SlotKind kind = kinds.at(e.name);
      int64_t numel = 1;
      for (int64_t d : e.shape) numel *= d;
      for (int64_t begin = 0; begin < numel; begin += kChunk) {
        const int64_t n = std::min(kChunk, numel - begin);
        chunk.resize(n);
        const int64_t per = (n + threads - 1) / threads;
        std::vector<std::thread> workers;
        for (int64_t lo = 0; lo < n; lo += per) {
          const int64_t hi = std::min(n, lo + per);
          workers.emplace_back([&, lo, hi] {
            RandomTensorValues(options.seed, options.init_std, e.name, kind, begin + lo,
                               absl::MakeSpan(chunk).subspan(lo, hi - lo));
          });
        }
        for (auto& w : workers) w.join();
        RETURN_IF_ERROR(writer->Append(chunk));
      }
    }
    RETURN_IF_ERROR(writer->Finish());
  }
  if (shards > 1) {
    OrderedJson index;
    index["metadata"] = {{"total_size", total_bytes}};
    index["weight_map"] = std::move(weight_map);
    RETURN_IF_ERROR(
        WriteTextFile(dir + "/model.safetensors.index.json",
                      index.dump(2, ' ', false, OrderedJson::error_handler_t::replace) + "\n"));
  }
  RETURN_IF_ERROR(WriteTextFile(dir + "/config.json", config_json));
  if (!options.tokenizer_path.empty()) {
    std::filesystem::copy_file(options.tokenizer_path, dir + "/tokenizer.json",
                               std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) {
      return absl::NotFoundError(absl::StrCat(options.tokenizer_path, ": cannot copy to ", dir,
                                              "/tokenizer.json: ", ec.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace treespec
