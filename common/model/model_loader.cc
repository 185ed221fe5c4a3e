// LoadModelWeights: Hugging Face safetensors checkpoints (one file, or shards listed by
// model.safetensors.index.json) into fp32 ModelWeights.
//
// Tensors in the checkpoint that the config does not use:
//   - `*.rotary_emb.inv_freq` (old checkpoints saved the RoPE buffer): ignored.
//   - `lm_head.weight` of a tied model: fine when it equals the embedding (as tied checkpoints
//     store it); an error when it differs, because then config.json's tie_word_embeddings is
//     wrong and the output projection would silently change.
//   - the layers of multi-token prediction (DeepSeek-V3's num_nextn_predict_layers, stored as
//     `model.layers.{num_hidden_layers + i}.*`): skipped with one log line; they are a drafter
//     of their own, not part of the target's forward.
//   - any other `model.*` tensor (an o_proj bias, a q_norm on a Llama, a layer past
//     num_hidden_layers, ...): an error, since it means config.json describes a different model.
//   - anything else (outside the decoder, e.g. a value head): ignored.
//
// A MoE layer's experts are read from one tensor per expert (`mlp.experts.{e}.gate_proj.weight`,
// as the published checkpoints store them) or, where those are absent, from the fused tensors
// Transformers 5 holds in memory (`mlp.experts.gate_up_proj` [E, 2 I, H], `mlp.experts.down_proj`
// [E, H, I]), whose expert count must be n_routed_experts.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace treespec {
namespace {

using Json = nlohmann::json;

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The checkpoint's files and which file holds each tensor.
struct Checkpoint {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  absl::flat_hash_map<std::string, const SafetensorsFile*> where;

  std::string FileList() const {
    std::vector<std::string> paths;
    for (const auto& f : files) paths.push_back(f->path());
    return absl::StrJoin(paths, ", ");
  }
};

absl::Status AddFile(Checkpoint& ckpt, std::unique_ptr<SafetensorsFile> file) {
  for (const SafetensorsTensorInfo& t : file->tensors()) {
    auto [it, inserted] = ckpt.where.emplace(t.name, file.get());
    if (!inserted) {
      return absl::DataLossError(absl::StrCat("tensor '", t.name, "' is in both ",
                                              it->second->path(), " and ", file->path()));
    }
  }
  ckpt.files.push_back(std::move(file));
  return absl::OkStatus();
}

absl::StatusOr<Checkpoint> OpenSharded(const std::string& model_dir,
                                       const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(index_path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  Json index;
  try {
    index = Json::parse(text.str());
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrCat(index_path, ": not valid JSON: ", e.what()));
  }
  auto map_it = index.is_object() ? index.find("weight_map") : index.end();
  if (map_it == index.end() || !map_it->is_object()) {
    return absl::DataLossError(absl::StrCat(index_path, ": no `weight_map` object"));
  }
  // Each shard opens once; sorted, so model-00001-of-... comes first in messages.
  std::vector<std::string> shard_names;
  absl::flat_hash_map<std::string, std::string> listed;  // tensor -> shard file name
  for (const auto& [tensor, file] : map_it->items()) {
    if (!file.is_string()) {
      return absl::DataLossError(
          absl::StrCat(index_path, ": weight_map['", tensor, "'] is not a file name"));
    }
    const std::string name = file.get<std::string>();
    if (name.empty() || name[0] == '/' || absl::StrContains(name, "..")) {
      return absl::DataLossError(absl::StrCat(index_path, ": weight_map['", tensor, "'] names '",
                                              name, "', outside the model directory"));
    }
    if (std::find(shard_names.begin(), shard_names.end(), name) == shard_names.end()) {
      shard_names.push_back(name);
    }
    listed[tensor] = name;
  }
  std::sort(shard_names.begin(), shard_names.end());
  Checkpoint ckpt;
  for (const std::string& name : shard_names) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f,
                     SafetensorsFile::Open(model_dir + "/" + name));
    RETURN_IF_ERROR(AddFile(ckpt, std::move(f)));
  }
  for (const auto& [tensor, name] : listed) {
    auto it = ckpt.where.find(tensor);
    const std::string path = model_dir + "/" + name;
    if (it == ckpt.where.end() || it->second->path() != path) {
      return absl::DataLossError(absl::StrCat(index_path, ": weight_map puts tensor '", tensor,
                                              "' in ", name, ", but ", path,
                                              " has no such tensor"));
    }
  }
  return ckpt;
}

absl::StatusOr<Checkpoint> OpenCheckpoint(const std::string& model_dir) {
  if (!IsDirectory(model_dir)) {
    return absl::NotFoundError(absl::StrCat(model_dir, ": model directory does not exist"));
  }
  const std::string index_path = model_dir + "/model.safetensors.index.json";
  const std::string single_path = model_dir + "/model.safetensors";
  if (IsFile(index_path)) return OpenSharded(model_dir, index_path);
  if (IsFile(single_path)) {
    Checkpoint ckpt;
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::Open(single_path));
    RETURN_IF_ERROR(AddFile(ckpt, std::move(f)));
    return ckpt;
  }
  return absl::NotFoundError(absl::StrCat(model_dir, ": has neither model.safetensors nor ",
                                          "model.safetensors.index.json"));
}

// Why a tensor the config expects may be missing, for the error message.
std::string MissingHint(const std::string& name, const ModelConfig& c) {
  if (name == "lm_head.weight") return " (config.json says tie_word_embeddings=false)";
  if (c.attention == AttentionKind::kMla && absl::StrContains(name, "self_attn.")) {
    return absl::StrCat(" (config.json says multi-head latent attention with q_lora_rank=",
                        c.mla.q_lora_rank > 0 ? absl::StrCat(c.mla.q_lora_rank) : "null",
                        ", kv_lora_rank=", c.mla.kv_lora_rank, ")");
  }
  if (absl::StrContains(name, "_proj.bias"))
    return absl::StrCat(" (", c.architecture, " has q/k/v biases)");
  if (absl::StrContains(name, "mlp.experts.") || absl::StrContains(name, "mlp.shared_experts.") ||
      absl::StrContains(name, "mlp.gate.")) {
    return absl::StrCat(
        " (config.json says layers from first_k_dense_replace=", c.moe.first_dense_layers,
        " on are MoE with n_routed_experts=", c.moe.num_experts,
        ": one tensor per expert, or the fused mlp.experts.gate_up_proj and down_proj)");
  }
  if (absl::StrContains(name, "_norm.weight") && absl::StrContains(name, "self_attn")) {
    return absl::StrCat(" (", c.architecture, " has q/k RMSNorm)");
  }
  return "";
}

absl::Status CheckTiedHead(const Checkpoint& ckpt, const ModelWeights& w) {
  auto it = ckpt.where.find("lm_head.weight");
  const SafetensorsFile& file = *it->second;
  ASSIGN_OR_RETURN(Tensor head, file.Read("lm_head.weight"));
  if (head.shape() != w.embed.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": tensor 'lm_head.weight' has shape ", head.ShapeString(),
                     " but config.json says tie_word_embeddings=true and the embedding is ",
                     w.embed.ShapeString()));
  }
  for (int64_t i = 0; i < head.numel(); ++i) {
    const float a = head.data()[i];
    const float b = w.embed.data()[i];
    if (a != b && !(std::isnan(a) && std::isnan(b))) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.path(),
          ": tensor 'lm_head.weight' differs from 'model.embed_tokens.weight' (first at ",
          "element ", i, ": ", a, " vs ", b, ") but config.json says tie_word_embeddings=true"));
    }
  }
  return absl::OkStatus();
}

// Where one expert's projection lies in a fused experts tensor, the form Transformers 5 keeps
// in memory: `mlp.experts.gate_up_proj` [E, 2 I, H] (each expert's gate rows, then its up rows)
// and `mlp.experts.down_proj` [E, H, I].
struct FusedExpert {
  std::string name;      // the fused tensor
  int64_t expert = 0;    // the block of dim 0
  bool up_half = false;  // gate_up_proj's second half
  int halves = 1;        // 2 for gate_up_proj: the block holds twice the slot's rows
};

std::optional<FusedExpert> FusedExpertOf(const std::string& slot_name) {
  const size_t at = slot_name.rfind(".mlp.experts.");
  if (at == std::string::npos) return std::nullopt;
  const std::string prefix = slot_name.substr(0, at + std::strlen(".mlp.experts."));
  const std::string rest = slot_name.substr(prefix.size());  // "{e}.gate_proj.weight"
  const size_t dot = rest.find('.');
  int64_t expert = 0;
  if (dot == std::string::npos || !absl::SimpleAtoi(rest.substr(0, dot), &expert)) {
    return std::nullopt;
  }
  const std::string proj = rest.substr(dot + 1);
  if (proj == "gate_proj.weight" || proj == "up_proj.weight") {
    return FusedExpert{prefix + "gate_up_proj", expert, proj == "up_proj.weight", 2};
  }
  if (proj == "down_proj.weight") return FusedExpert{prefix + "down_proj", expert, false, 1};
  return std::nullopt;
}

// Reads `slot` (one expert's [rows, cols] projection) out of the fused tensor `f`; NOT_FOUND
// when the checkpoint lacks that too.
absl::Status ReadFusedExpert(const Checkpoint& ckpt, const FusedExpert& f, TensorSlot& slot) {
  auto it = ckpt.where.find(f.name);
  if (it == ckpt.where.end()) return absl::NotFoundError(f.name);
  const SafetensorsFile& file = *it->second;
  const SafetensorsTensorInfo& info = *file.Find(f.name);
  const int64_t rows = slot.shape[0], cols = slot.shape[1];
  if (info.shape.size() != 3 || info.shape[0] <= f.expert || info.shape[1] != f.halves * rows ||
      info.shape[2] != cols) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": fused tensor '", f.name, "' has shape ",
                     ShapeString(info.shape), " but config.json implies [n_routed_experts > ",
                     f.expert, ", ", f.halves * rows, ", ", cols, "]"));
  }
  if (!info.dtype.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor '", f.name,
                                                   "' has dtype ", info.dtype_name,
                                                   " (only F32, F16 and BF16 are read)"));
  }
  const int64_t first = (f.expert * info.shape[1] + (f.up_half ? rows : 0)) * cols;
  Tensor t(slot.shape);
  ConvertToFloat(*info.dtype, file.RawBytes(info).data() + first * DTypeSize(*info.dtype),
                 t.span());
  *slot.tensor = std::move(t);
  return absl::OkStatus();
}

// Reads every present slot `for_each` visits from `ckpt`; `used` gets the names of the
// tensors read, `fused_experts` the fused experts tensors read from with their expert count.
absl::Status ReadSlots(const Checkpoint& ckpt, const SlotVisitor& for_each,
                       const std::function<std::string(const std::string&)>& missing_hint,
                       absl::flat_hash_set<std::string>& used,
                       absl::flat_hash_map<std::string, int64_t>* fused_experts = nullptr) {
  absl::Status status;
  for_each([&](TensorSlot& slot) {
    if (!status.ok() || !slot.present) return;
    auto it = ckpt.where.find(slot.hf_name);
    if (it == ckpt.where.end()) {
      if (const std::optional<FusedExpert> f = FusedExpertOf(slot.hf_name)) {
        status = ReadFusedExpert(ckpt, *f, slot);
        if (status.ok()) {
          used.insert(f->name);
          if (fused_experts != nullptr) {
            (*fused_experts)[f->name] = ckpt.where.at(f->name)->Find(f->name)->shape[0];
          }
          return;
        }
        if (!absl::IsNotFound(status)) return;
      }
      status = absl::NotFoundError(absl::StrCat("tensor '", slot.hf_name, "' not found in ",
                                                ckpt.FileList(), missing_hint(slot.hf_name)));
      return;
    }
    const SafetensorsFile& file = *it->second;
    const SafetensorsTensorInfo& info = *file.Find(slot.hf_name);
    if (info.shape != slot.shape) {
      status = absl::InvalidArgumentError(absl::StrCat(
          file.path(), ": tensor '", slot.hf_name, "' has shape ", ShapeString(info.shape),
          " but config.json implies ", ShapeString(slot.shape)));
      return;
    }
    Tensor t(slot.shape);
    status = file.ReadInto(info, t.span());
    *slot.tensor = std::move(t);
    used.insert(slot.hf_name);
  });
  return status;
}

// The checkpoint's tensors no slot took, sorted; saved RoPE buffers are not counted.
std::vector<std::string> UnusedTensors(const Checkpoint& ckpt,
                                       const absl::flat_hash_set<std::string>& used) {
  std::vector<std::string> unused;
  for (const auto& [name, file] : ckpt.where) {
    if (!used.contains(name) && !absl::EndsWith(name, "rotary_emb.inv_freq")) {
      unused.push_back(name);
    }
  }
  std::sort(unused.begin(), unused.end());
  return unused;
}

// A tensor of a multi-token-prediction layer: model.layers.{i}.* with i in
// [num_layers, num_layers + num_mtp_layers).
bool IsMtpTensor(const std::string& name, const ModelConfig& config) {
  absl::string_view rest = name;
  if (config.num_mtp_layers == 0 || !absl::ConsumePrefix(&rest, "model.layers.")) return false;
  const size_t dot = rest.find('.');
  int layer = 0;
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, dot), &layer)) {
    return false;
  }
  return layer >= config.num_layers && layer < config.num_layers + config.num_mtp_layers;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> LoadTensorSlots(const std::string& model_dir,
                                                         const SlotVisitor& for_each) {
  ASSIGN_OR_RETURN(Checkpoint ckpt, OpenCheckpoint(model_dir));
  absl::flat_hash_set<std::string> used;
  RETURN_IF_ERROR(ReadSlots(
      ckpt, for_each, [](const std::string&) { return std::string(); }, used));
  return UnusedTensors(ckpt, used);
}

absl::StatusOr<ModelWeights> LoadModelWeights(const std::string& model_dir,
                                              const ModelConfig& config) {
  ASSIGN_OR_RETURN(Checkpoint ckpt, OpenCheckpoint(model_dir));
  ModelWeights weights;
  absl::flat_hash_set<std::string> used;
  absl::flat_hash_map<std::string, int64_t> fused_experts;
  RETURN_IF_ERROR(ReadSlots(
      ckpt, [&](const auto& fn) { ForEachTensor(config, weights, fn); },
      [&](const std::string& name) { return MissingHint(name, config); }, used, &fused_experts));
  for (const auto& [name, experts] : fused_experts) {
    if (experts != config.moe.num_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat(ckpt.where.at(name)->path(), ": fused tensor '", name, "' holds ", experts,
                       " experts but config.json says n_routed_experts=", config.moe.num_experts));
    }
  }

  std::vector<std::string> unexpected;
  int mtp_tensors = 0;
  for (const std::string& name : UnusedTensors(ckpt, used)) {
    if (name == "lm_head.weight" && config.tie_word_embeddings) {
      RETURN_IF_ERROR(CheckTiedHead(ckpt, weights));
      continue;
    }
    if (IsMtpTensor(name, config)) {
      ++mtp_tensors;
      continue;
    }
    if (absl::StartsWith(name, "model.")) unexpected.push_back(name);  // stays sorted
  }
  if (mtp_tensors > 0) {
    TS_LOG(kInfo,
           "%s: skipped %d tensors of the %d multi-token-prediction layer(s) "
           "(num_nextn_predict_layers): not part of the forward",
           model_dir, mtp_tensors, config.num_mtp_layers);
  }
  if (!unexpected.empty()) {
    const size_t shown = std::min<size_t>(unexpected.size(), 5);
    return absl::InvalidArgumentError(absl::StrCat(
        ckpt.where.at(unexpected[0])->path(), ": tensor", unexpected.size() > 1 ? "s " : " ", "'",
        absl::StrJoin(unexpected.begin(), unexpected.begin() + shown, "', '"), "'",
        unexpected.size() > shown ? absl::StrCat(" and ", unexpected.size() - shown, " more") : "",
        " not used by a ", config.architecture, " with this config.json (", config.num_layers,
        " layers", config.qkv_bias ? ", q/k/v bias" : "", config.qk_norm ? ", q/k norm" : "",
        "): the checkpoint and config.json disagree"));
  }
  return weights;
}

}  // namespace treespec
