#include "common/model/dflash_config.h"

#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace treespec {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json field `", field, "`: ", what));
}

// An integer field of `object` (named `field` in messages); nullopt when absent.
absl::StatusOr<std::optional<int>> IntField(const Json& object, const std::string& key,
                                            absl::string_view field) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer())
    return Invalid(field, absl::StrCat("expected an integer, got ", it->dump()));
  const int64_t v = it->get<int64_t>();
  if (v < 0 || v > (int64_t{1} << 30)) return Invalid(field, absl::StrCat("out of range: ", v));
  return static_cast<int>(v);
}

}  // namespace

SeqTree DflashBlock(const DflashConfig& config, SeqId seq, int context_rows, int32_t bonus,
                    int size) {
  SeqTree t;
  t.seq = seq;
  t.committed_len = context_rows;
  t.tokens.assign(size, config.mask_token_id);
  t.tokens[0] = bonus;
  t.parents.resize(size);
  std::iota(t.parents.begin(), t.parents.end(), -1);
  t.bidirectional = true;
  return t;
}

absl::StatusOr<DflashConfig> ParseDflashConfig(const std::string& json_text) {
  const Json root = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError("config.json: expected a JSON object");
  }
  const Json archs = root.value("architectures", Json());
  if (archs != Json::array({"DFlashDraftModel"})) {
    if (archs.is_array() && archs.size() == 1 && archs[0].is_string()) {
      return absl::UnimplementedError(
          absl::StrCat("config.json field `architectures`: '", archs[0].get<std::string>(),
                       "' is not supported (supported: DFlashDraftModel, the block drafter without "
                       "DFlash2's convolutions and candidate selector)"));
    }
    return Invalid("architectures",
                   absl::StrCat("expected [\"DFlashDraftModel\"], got ", archs.dump()));
  }
  if (auto causal = root.find("is_causal");
      causal != root.end() && !causal->is_null() && *causal != false) {
    return absl::UnimplementedError(
        "config.json field `is_causal`: a causal block drafter is not supported (DFlash attends "
        "over the whole block)");
  }
  const Json dflash = root.value("dflash_config", Json::object());
  if (!dflash.is_object()) return Invalid("dflash_config", "expected an object");

  // The draft layers are a Qwen3 decoder's: that parser checks them (RoPE, norms, no sliding
  // window, silu).
  Json body = root;
  body["architectures"] = Json::array({"Qwen3ForCausalLM"});
  absl::StatusOr<ModelConfig> parsed = ParseModelConfig(body.dump());
  if (!parsed.ok()) return parsed.status();
  DflashConfig c;
  c.body = *std::move(parsed);
  c.body.architecture = "DFlashDraftModel";

  auto ids = dflash.find("target_layer_ids");
  if (ids == dflash.end() || !ids->is_array() || ids->empty()) {
    return Invalid("dflash_config.target_layer_ids",
                   "expected a non-empty list of the target layers the drafter reads");
  }
  for (const Json& id : *ids) {
    if (!id.is_number_integer()) {
      return Invalid("dflash_config.target_layer_ids",
                     absl::StrCat("expected integers, got ", id.dump()));
    }
    c.target_layers.push_back(id.get<int>());
  }
  absl::StatusOr<std::optional<int>> n = IntField(root, "num_target_layers", "num_target_layers");
  if (!n.ok()) return n.status();
  if (!n->has_value()) {
    n = IntField(dflash, "num_target_layers", "dflash_config.num_target_layers");
    if (!n.ok()) return n.status();
  }
  if (!n->has_value() || **n < 1) {
    return Invalid("num_target_layers",
                   "expected the target's layer count (which target the drafter was trained for)");
  }
  c.target_num_layers = **n;
  c.body.context_width = static_cast<int>(c.target_layers.size()) * c.body.hidden_size;
  if (!LayersAscendingWithin(c.target_layers, c.target_num_layers)) {
    return Invalid("dflash_config.target_layer_ids",
                   absl::StrCat("[", absl::StrJoin(c.target_layers, ", "),
                                "] must be strictly ascending within [0, ", c.target_num_layers,
                                ") (num_target_layers)"));
  }
  absl::StatusOr<std::optional<int>> mask =
      IntField(dflash, "mask_token_id", "dflash_config.mask_token_id");
  if (!mask.ok()) return mask.status();
  if (!mask->has_value() || **mask >= c.body.vocab_size) {
    return Invalid("dflash_config.mask_token_id",
                   absl::StrCat("expected a token id in [0, ", c.body.vocab_size, ")"));
  }
  c.mask_token_id = **mask;
  absl::StatusOr<std::optional<int>> block =
      IntField(dflash, "block_size", "dflash_config.block_size");
  if (!block.ok()) return block.status();
  if (!block->has_value()) {
    block = IntField(root, "block_size", "block_size");
    if (!block.ok()) return block.status();
  }
  c.block_size = block->value_or(16);
  if (c.block_size < 2) {
    return Invalid(
        "block_size",
        absl::StrCat("must be >= 2 (the bonus and a drafted position), got ", c.block_size));
  }
  return c;
}

absl::StatusOr<DflashConfig> LoadDflashConfig(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadConfigJson(dir, "a DFlash drafter directory");
  if (!text.ok()) return text.status();
  absl::StatusOr<DflashConfig> config = ParseDflashConfig(*text);
  if (!config.ok()) return NameConfigFile(config.status(), dir);
  return config;
}

}  // namespace treespec
