// Loading tokenizer.json and the encode/decode pipeline:
//   text -> [added tokens, raw] -> normalizer -> [added tokens, normalized] -> pre-tokenizer
//        -> BPE per piece -> ids
// which is Hugging Face's TokenizerImpl::encode(text, add_special_tokens=false) for the
// components we accept. Anything in the file that would change results and that we do not
// implement is refused at load time with the field's name, never ignored.
#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/tiktoken.h"
#include "common/tokenizer/tokenizer_spec.h"
#include "common/tokenizer/unicode.h"
#include "common/tokenizer/utf8.h"
#include "common/util/status_macros.h"

namespace treespec {
namespace {

using Json = nlohmann::json;

// Real vocabularies stay far below this (Llama 3: 128256, Qwen2: 151665). Nothing is sized by
// the largest id (HfTokenizer::decoded_), so this only keeps ids sane, not memory bounded.
constexpr int64_t kMaxId = int64_t{1} << 24;

// Field-checked access to the parsed JSON; every error names the file and the field.
class SpecParser {
 public:
  explicit SpecParser(std::string_view origin) : origin_(origin) {}

  absl::Status Parse(const Json& root, TokenizerSpec* spec) {
    if (!root.is_object()) return Error("(top level)", "is not a JSON object");
    RETURN_IF_ERROR(CheckKeys(root, "",
                              {"version", "truncation", "padding", "added_tokens", "normalizer",
                               "pre_tokenizer", "post_processor", "decoder", "model"}));
    // Truncation and padding would cut or pad the ids; the engine decides lengths itself.
    for (const char* key : {"truncation", "padding"}) {
      if (root.contains(key) && !root[key].is_null()) {
        return Error(key, "must be null (truncation and padding are the engine's job)");
      }
    }
    // post_processor only adds BOS/EOS-style tokens for add_special_tokens=true: ignored.
    if (!root.contains("model")) return Error("model", "is missing");
    RETURN_IF_ERROR(ParseModel(root["model"], spec));
    RETURN_IF_ERROR(ParseNormalizer(root.value("normalizer", Json()), "normalizer", spec));
    RETURN_IF_ERROR(ParsePreTokenizer(root.value("pre_tokenizer", Json()), spec));
    RETURN_IF_ERROR(ParseDecoder(root.value("decoder", Json())));
    return ParseAddedTokens(root.value("added_tokens", Json::array()), spec);
  }

 private:
  absl::Status Error(absl::string_view field, absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(origin_, ": ", field, " ", message));
  }

  static std::string Path(absl::string_view parent, absl::string_view key) {
    return parent.empty() ? std::string(key) : absl::StrCat(parent, ".", key);
  }

  // Unknown keys are refused: a field we do not read could change results.
  absl::Status CheckKeys(const Json& obj, absl::string_view path,
                         std::initializer_list<std::string_view> allowed) const {
    for (const auto& [key, value] : obj.items()) {
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        return Error(Path(path, key), "is not a field this loader understands");
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<bool> OptionalBool(const Json& obj, absl::string_view path, const char* key,
                                    bool fallback) const {
    if (!obj.contains(key) || obj[key].is_null()) return fallback;
    if (!obj[key].is_boolean()) return Error(Path(path, key), "must be true or false");
    return obj[key].get<bool>();
  }

  absl::StatusOr<std::string> RequiredString(const Json& obj, absl::string_view path,
                                             const char* key) const {
    if (!obj.contains(key)) return Error(Path(path, key), "is missing");
    if (!obj[key].is_string()) return Error(Path(path, key), "must be a string");
    return obj[key].get<std::string>();
  }

  // A string field that must be null, absent or "" (its non-empty values are unsupported).
  absl::Status RequireEmptyString(const Json& obj, absl::string_view path, const char* key) const {
    if (!obj.contains(key) || obj[key].is_null()) return absl::OkStatus();
    if (obj[key].is_string() && obj[key].get<std::string>().empty()) return absl::OkStatus();
    return Error(Path(path, key), absl::StrCat("is ", obj[key].dump(), "; only null is supported"));
  }

  absl::Status ParseModel(const Json& model, TokenizerSpec* spec) {
    if (!model.is_object()) return Error("model", "must be an object");
    RETURN_IF_ERROR(CheckKeys(
        model, "model",
        {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
         "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"}));
    // Old files omit "type"; their BPE models are recognised by their merges.
    if (model.contains("type")) {
      ASSIGN_OR_RETURN(std::string type, RequiredString(model, "model", "type"));
      if (type != "BPE") {
        return Error("model.type", absl::StrCat("is \"", type, "\"; only \"BPE\" is supported"));
      }
    }
    if (model.contains("dropout") && !model["dropout"].is_null()) {
      return Error("model.dropout", "must be null (BPE dropout randomises encoding)");
    }
    RETURN_IF_ERROR(RequireEmptyString(model, "model", "continuing_subword_prefix"));
    RETURN_IF_ERROR(RequireEmptyString(model, "model", "end_of_word_suffix"));
    ASSIGN_OR_RETURN(const bool byte_fallback,
                     OptionalBool(model, "model", "byte_fallback", false));
    if (byte_fallback) {
      return Error("model.byte_fallback",
                   "is true; only byte-level BPE (byte_fallback false) is supported");
    }
    ASSIGN_OR_RETURN(spec->bpe_options.ignore_merges,
                     OptionalBool(model, "model", "ignore_merges", false));
    ASSIGN_OR_RETURN(spec->bpe_options.fuse_unk, OptionalBool(model, "model", "fuse_unk", false));
    if (model.contains("unk_token") && !model["unk_token"].is_null()) {
      ASSIGN_OR_RETURN(spec->unk_token, RequiredString(model, "model", "unk_token"));
    }

    if (!model.contains("vocab") || !model["vocab"].is_object()) {
      return Error("model.vocab", "must be an object mapping token strings to ids");
    }
    for (const auto& [token, id] : model["vocab"].items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxId) {
        return Error(absl::StrCat("model.vocab[", Json(token).dump(), "]"),
                     absl::StrCat("is ", id.dump(), "; ids must be integers in [0, 2^24)"));
      }
      const auto id32 = static_cast<int32_t>(id.get<int64_t>());
      const auto [it, inserted] = vocab_tokens_.emplace(id32, token);
      if (!inserted) {
        return Error("model.vocab",
                     absl::StrCat("gives id ", id32, " to both ", Json(it->second).dump(), " and ",
                                  Json(token).dump()));
      }
      spec->vocab.emplace(token, id32);
    }
    if (spec->vocab.empty()) return Error("model.vocab", "is empty");
    if (!spec->unk_token.empty()) {
      const auto it = spec->vocab.find(spec->unk_token);
      if (it == spec->vocab.end()) {
        return Error("model.unk_token",
                     absl::StrCat("\"", spec->unk_token, "\" is not in the vocab"));
      }
      spec->bpe_options.unk_id = it->second;
    }

    if (!model.contains("merges") || !model["merges"].is_array()) {
      return Error("model.merges", "must be an array");
    }
    for (size_t i = 0; i < model["merges"].size(); ++i) {
      const Json& merge = model["merges"][i];
      const std::string field = absl::StrCat("model.merges[", i, "]");
      if (merge.is_string()) {
        const std::string line = merge.get<std::string>();
        if (line.rfind("#version", 0) == 0) continue;  // old merges.txt header, not a merge
        const size_t space = line.find(' ');
        if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
          return Error(field, absl::StrCat("is ", merge.dump(),
                                           "; a merge string must be two tokens and one space"));
        }
        spec->merges.emplace_back(line.substr(0, space), line.substr(space + 1));
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
                 merge[1].is_string()) {
        spec->merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
      } else {
        return Error(field,
                     absl::StrCat("is ", merge.dump(), "; expected \"a b\" or [\"a\", \"b\"]"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ParseNormalizer(const Json& normalizer, const std::string& path,
                               TokenizerSpec* spec) const {
    if (normalizer.is_null()) return absl::OkStatus();
    if (!normalizer.is_object()) return Error(path, "must be null or an object");
    ASSIGN_OR_RETURN(std::string type, RequiredString(normalizer, path, "type"));
    if (type == "NFC") {
      RETURN_IF_ERROR(CheckKeys(normalizer, path, {"type"}));
      spec->nfc = true;
      return absl::OkStatus();
    }
    if (type == "Sequence") {
      RETURN_IF_ERROR(CheckKeys(normalizer, path, {"type", "normalizers"}));
      const Json& items = normalizer.value("normalizers", Json::array());
      if (!items.is_array()) return Error(Path(path, "normalizers"), "must be an array");
      for (size_t i = 0; i < items.size(); ++i) {
        // NFC is idempotent, so any number of NFCs in sequence is one NFC.
        RETURN_IF_ERROR(
            ParseNormalizer(items[i], absl::StrCat(path, ".normalizers[", i, "]"), spec));
      }
      return absl::OkStatus();
    }
    return Error(Path(path, "type"),
                 absl::StrCat("is \"", type, "\"; only null and \"NFC\" are supported"));
  }

  absl::StatusOr<PreTokenizerStep> ParseByteLevel(const Json& obj, const std::string& path) const {
    RETURN_IF_ERROR(
        CheckKeys(obj, path, {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    // trim_offsets only moves offsets, which we do not report.
    ASSIGN_OR_RETURN(step.add_prefix_space, OptionalBool(obj, path, "add_prefix_space", true));
    ASSIGN_OR_RETURN(step.use_regex, OptionalBool(obj, path, "use_regex", true));
    if (step.use_regex) {
      ASSIGN_OR_RETURN(step.regex, Regex::Compile(kGpt2Pattern));
    }
    return step;
  }

  absl::StatusOr<PreTokenizerStep> ParseSplit(const Json& obj, const std::string& path) const {
    RETURN_IF_ERROR(CheckKeys(obj, path, {"type", "pattern", "behavior", "invert"}));
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::Kind::kSplit;
    const std::string pattern_path = Path(path, "pattern");
    if (!obj.contains("pattern") || !obj["pattern"].is_object() || obj["pattern"].size() != 1) {
      return Error(pattern_path, "must be {\"Regex\": ...} or {\"String\": ...}");
    }
    const Json& pattern = obj["pattern"];
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      auto regex = Regex::Compile(pattern["Regex"].get<std::string>());
      if (!regex.ok()) return Error(pattern_path, regex.status().message());
      step.regex = *std::move(regex);
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      step.literal = pattern["String"].get<std::string>();
      if (step.literal.empty()) return Error(pattern_path, "has an empty String");
    } else {
      return Error(pattern_path, "must be {\"Regex\": ...} or {\"String\": ...}");
    }
    ASSIGN_OR_RETURN(std::string behavior, RequiredString(obj, path, "behavior"));
    static const auto* const kBehaviors = new absl::flat_hash_map<std::string, SplitBehavior>{
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    const auto it = kBehaviors->find(behavior);
    if (it == kBehaviors->end()) {
      return Error(Path(path, "behavior"),
                   absl::StrCat("is \"", behavior, "\"; not a known behavior"));
    }
    step.behavior = it->second;
    ASSIGN_OR_RETURN(step.invert, OptionalBool(obj, path, "invert", false));
    return step;
  }

  absl::StatusOr<PreTokenizerStep> ParseStep(const Json& obj, const std::string& path) const {
    if (!obj.is_object()) return Error(path, "must be an object");
    ASSIGN_OR_RETURN(std::string type, RequiredString(obj, path, "type"));
    if (type == "ByteLevel") return ParseByteLevel(obj, path);
    if (type == "Split") return ParseSplit(obj, path);
    return Error(Path(path, "type"),
                 absl::StrCat("is \"", type, "\"; only ByteLevel and Split are supported"));
  }

  absl::Status ParsePreTokenizer(const Json& pre, TokenizerSpec* spec) const {
    if (pre.is_null()) {
      return Error("pre_tokenizer", "is null; byte-level BPE needs a ByteLevel pre-tokenizer");
    }
    if (!pre.is_object()) return Error("pre_tokenizer", "must be an object");
    ASSIGN_OR_RETURN(std::string type, RequiredString(pre, "pre_tokenizer", "type"));
    if (type == "Sequence") {
      RETURN_IF_ERROR(CheckKeys(pre, "pre_tokenizer", {"type", "pretokenizers"}));
      if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array()) {
        return Error("pre_tokenizer.pretokenizers", "must be an array");
      }
      const Json& items = pre["pretokenizers"];
      for (size_t i = 0; i < items.size(); ++i) {
        ASSIGN_OR_RETURN(PreTokenizerStep step,
                         ParseStep(items[i], absl::StrCat("pre_tokenizer.pretokenizers[", i, "]")));
        spec->pre_tokenizer.push_back(std::move(step));
      }
    } else {
      ASSIGN_OR_RETURN(PreTokenizerStep step, ParseStep(pre, "pre_tokenizer"));
      spec->pre_tokenizer.push_back(std::move(step));
    }
    // Steps after ByteLevel would see the byte-level spelling, which our pipeline never
    // materialises (the mapping lives in the BPE vocabulary); without one, pieces are not bytes.
    const auto& steps = spec->pre_tokenizer;
    const auto n_byte_level = std::count_if(steps.begin(), steps.end(), [](const auto& s) {
      return s.kind == PreTokenizerStep::Kind::kByteLevel;
    });
    if (n_byte_level != 1 || steps.back().kind != PreTokenizerStep::Kind::kByteLevel) {
      return Error("pre_tokenizer",
                   "must be ByteLevel, or a Sequence of Splits ending in one ByteLevel");
    }
    return absl::OkStatus();
  }

  absl::Status ParseDecoder(const Json& decoder) const {
    if (decoder.is_null()) {
      return Error("decoder", "is null; byte-level BPE needs the ByteLevel decoder");
    }
    if (!decoder.is_object()) return Error("decoder", "must be an object");
    ASSIGN_OR_RETURN(std::string type, RequiredString(decoder, "decoder", "type"));
    if (type != "ByteLevel") {
      return Error("decoder.type",
                   absl::StrCat("is \"", type, "\"; only \"ByteLevel\" is supported"));
    }
    // The ByteLevel decoder ignores its options (they only matter to the pre-tokenizer).
    return CheckKeys(decoder, "decoder", {"type", "add_prefix_space", "trim_offsets", "use_regex"});
  }

  absl::Status ParseAddedTokens(const Json& list, TokenizerSpec* spec) const {
    if (list.is_null()) return absl::OkStatus();
    if (!list.is_array()) return Error("added_tokens", "must be an array");
    absl::flat_hash_set<std::string> contents;
    absl::flat_hash_set<int32_t> added_ids;
    for (size_t i = 0; i < list.size(); ++i) {
      const Json& item = list[i];
      const std::string path = absl::StrCat("added_tokens[", i, "]");
      if (!item.is_object()) return Error(path, "must be an object");
      RETURN_IF_ERROR(
          CheckKeys(item, path,
                    {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"}));
      AddedToken token;
      if (!item.contains("id") || !item["id"].is_number_integer() ||
          item["id"].get<int64_t>() < 0 || item["id"].get<int64_t>() >= kMaxId) {
        return Error(Path(path, "id"), "must be an integer in [0, 2^24)");
      }
      token.id = static_cast<int32_t>(item["id"].get<int64_t>());
      ASSIGN_OR_RETURN(token.content, RequiredString(item, path, "content"));
      ASSIGN_OR_RETURN(token.single_word, OptionalBool(item, path, "single_word", false));
      ASSIGN_OR_RETURN(token.lstrip, OptionalBool(item, path, "lstrip", false));
      ASSIGN_OR_RETURN(token.rstrip, OptionalBool(item, path, "rstrip", false));
      ASSIGN_OR_RETURN(token.special, OptionalBool(item, path, "special", false));
      ASSIGN_OR_RETURN(token.normalized, OptionalBool(item, path, "normalized", !token.special));
      if (token.content.empty()) continue;  // never matches; Hugging Face skips it too
      if (!contents.insert(token.content).second) {
        return Error(Path(path, "content"),
                     absl::StrCat(Json(token.content).dump(), " appears twice in added_tokens"));
      }
      // Hugging Face gives a token already in the vocab its vocab id; a file that says
      // otherwise is inconsistent, and we would not know which id it means.
      const auto it = spec->vocab.find(token.content);
      if (it != spec->vocab.end() && it->second != token.id) {
        return Error(Path(path, "id"),
                     absl::StrCat("is ", token.id, " but model.vocab gives ",
                                  Json(token.content).dump(), " id ", it->second));
      }
      const auto same_id = vocab_tokens_.find(token.id);
      if (same_id != vocab_tokens_.end() && same_id->second != token.content) {
        return Error(Path(path, "id"),
                     absl::StrCat("is ", token.id, ", which model.vocab gives to ",
                                  Json(same_id->second).dump()));
      }
      if (!added_ids.insert(token.id).second) {
        return Error(Path(path, "id"),
                     absl::StrCat("is ", token.id, ", used by another added token"));
      }
      spec->added_tokens.push_back(std::move(token));
    }
    return absl::OkStatus();
  }

  std::string origin_;
  // id -> token string of model.vocab, to report collisions by name.
  absl::flat_hash_map<int32_t, std::string> vocab_tokens_;
};

class HfTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Build(TokenizerSpec spec,
                                                            std::string_view origin);

  absl::StatusOr<std::vector<int32_t>> EncodeAtMost(const std::string& text,
                                                    size_t max_tokens) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override;
  int vocab_size() const override { return vocab_size_; }
  int32_t TokenToId(const std::string& token) const override {
    const auto it = token_to_id_.find(token);
    return it == token_to_id_.end() ? -1 : it->second;
  }

 private:
  HfTokenizer(bool nfc, TextChunking chunking, AddedTokenMatcher raw_matcher,
              AddedTokenMatcher normalized_matcher, PreTokenizer pre_tokenizer,
              std::unique_ptr<const BpeModel> bpe)
      : nfc_(nfc),
        chunking_(chunking),
        raw_matcher_(std::move(raw_matcher)),
        normalized_matcher_(std::move(normalized_matcher)),
        pre_tokenizer_(std::move(pre_tokenizer)),
        bpe_(std::move(bpe)) {}

  // Encodes text that holds no raw-matched added token: normalize, match the normalized added
  // tokens, pre-tokenize and merge the rest. Stops (OUT_OF_RANGE) once `ids` holds more than
  // max_tokens.
  absl::Status EncodeSegment(std::string_view text, size_t max_tokens,
                             std::vector<int32_t>* ids) const;

  // Encodes text that fits one chunk (TextChunking) from the raw added-token match on.
  absl::Status EncodeChunk(std::string_view text, size_t max_tokens,
                           std::vector<int32_t>* ids) const;

  const bool nfc_;
  const TextChunking chunking_;
  const AddedTokenMatcher raw_matcher_;         // added tokens with normalized == false
  const AddedTokenMatcher normalized_matcher_;  // added tokens with normalized == true
  const PreTokenizer pre_tokenizer_;
  const std::unique_ptr<const BpeModel> bpe_;  // not movable: its cache holds mutexes
  int vocab_size_ = 0;                         // largest id + 1
  size_t max_token_bytes_ = 1;                 // the most bytes any id decodes to
  // Id -> the bytes it decodes to, for the ids some token has. A hash map, not a vector
  // indexed by id: its memory follows the file's entries, whereas a table sized by the largest
  // id would make one id near 2^24 in a tiny file cost 0.6 GB at load. Refusing sparse ids instead
  // would need a density threshold that some real file might miss; a lookup per decoded token
  // costs nothing beside a model step.
  absl::flat_hash_map<int32_t, std::string> decoded_;
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
};

// The bytes Hugging Face's ByteLevel decoder gives for one token: its byte-level spelling
// undone, or, for a token with characters outside the byte map (added tokens such as "<s> x"),
// its text as it is.
std::string DecodedBytes(const std::string& token) {
  std::optional<std::string> bytes = byte_level::Decode(token);
  return bytes ? *std::move(bytes) : token;
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Build(TokenizerSpec spec,
                                                                std::string_view origin) {
  // Merges by id, as Hugging Face resolves them; a later duplicate overrides an earlier one
  // there (a HashMap collect), so it does here.
  absl::flat_hash_map<uint64_t, BpeMerge> merges;
  merges.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [left, right] = spec.merges[rank];
    const auto l = spec.vocab.find(left);
    const auto r = spec.vocab.find(right);
    const auto m = spec.vocab.find(left + right);
    for (const auto& [it, what] :
         {std::pair{l, left}, std::pair{r, right}, std::pair{m, left + right}}) {
      if (it == spec.vocab.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            std::string(origin), ": model.merges[", rank, "] (", Json(left).dump(), ", ",
            Json(right).dump(), ") uses ", Json(what).dump(), ", which is not in model.vocab"));
      }
    }
    merges[BpeModel::PairKey(l->second, r->second)] = {static_cast<int32_t>(rank), m->second};
  }

  // The BPE vocabulary in raw bytes: the pre-tokenizer's pieces are raw bytes, and spelling
  // each piece byte-level is a bijection, so lookups agree with Hugging Face's. Tokens with
  // characters outside the byte map can never be produced by BPE and are left out.
  absl::flat_hash_map<std::string, int32_t> byte_vocab;
  byte_vocab.reserve(spec.vocab.size());
  int32_t max_id = -1;
  for (const auto& [token, id] : spec.vocab) {
    if (std::optional<std::string> bytes = byte_level::Decode(token)) {
      byte_vocab.emplace(*std::move(bytes), id);
    }
    max_id = std::max(max_id, id);
  }
  for (const AddedToken& t : spec.added_tokens) max_id = std::max(max_id, t.id);

  std::vector<std::string> raw_patterns, normalized_patterns;
  std::vector<AddedToken> raw_tokens, normalized_tokens;
  for (const AddedToken& t : spec.added_tokens) {
    if (!t.normalized) {
      raw_patterns.push_back(t.content);
      raw_tokens.push_back(t);
      continue;
    }
    // A normalized token is looked for in normalized text, so in its normalized form.
    std::string pattern = t.content;
    if (spec.nfc) {
      ASSIGN_OR_RETURN(pattern, unicode::NormalizeNfc(t.content));
    }
    normalized_patterns.push_back(std::move(pattern));
    normalized_tokens.push_back(t);
  }

  const bool nfc = spec.nfc;
  std::unique_ptr<HfTokenizer> tokenizer(
      new HfTokenizer(nfc, spec.chunking, AddedTokenMatcher(raw_patterns, raw_tokens),
                      AddedTokenMatcher(normalized_patterns, normalized_tokens),
                      PreTokenizer(std::move(spec.pre_tokenizer)),
                      std::make_unique<const BpeModel>(std::move(byte_vocab), std::move(merges),
                                                       spec.bpe_options)));

  tokenizer->vocab_size_ = max_id + 1;
  tokenizer->decoded_.reserve(spec.vocab.size() + spec.added_tokens.size());
  for (const auto& [token, id] : spec.vocab) tokenizer->decoded_[id] = DecodedBytes(token);
  // An added token's content wins over a vocab entry with the same id, for decoding and lookup.
  for (const AddedToken& t : spec.added_tokens) {
    tokenizer->decoded_[t.id] = DecodedBytes(t.content);
  }
  for (const auto& [id, bytes] : tokenizer->decoded_) {
    tokenizer->max_token_bytes_ = std::max(tokenizer->max_token_bytes_, bytes.size());
  }
  tokenizer->token_to_id_ = std::move(spec.vocab);
  for (const AddedToken& t : spec.added_tokens) tokenizer->token_to_id_[t.content] = t.id;
  return tokenizer;
}

namespace {

absl::Status TooManyTokens(size_t max_tokens) {
  return absl::OutOfRangeError(absl::StrFormat("text is longer than %d tokens", max_tokens));
}

}  // namespace

absl::Status HfTokenizer::EncodeSegment(std::string_view text, size_t max_tokens,
                                        std::vector<int32_t>* ids) const {
  std::string normalized;
  if (nfc_) {
    ASSIGN_OR_RETURN(normalized, unicode::NormalizeNfc(text));
    text = normalized;
  }
  std::vector<TextSegment> segments;
  if (normalized_matcher_.empty()) {
    if (!text.empty()) segments.push_back({0, text.size(), -1});
  } else {
    normalized_matcher_.Split(text, &segments);
  }
  std::vector<std::string> pieces;
  for (const TextSegment& segment : segments) {
    if (segment.token_id >= 0) {
      ids->push_back(segment.token_id);
      if (ids->size() > max_tokens) return TooManyTokens(max_tokens);
      continue;
    }
    pieces.clear();
    RETURN_IF_ERROR(
        pre_tokenizer_.Split(text.substr(segment.begin, segment.end - segment.begin), &pieces));
    for (const std::string& piece : pieces) {
      bpe_->Encode(piece, ids);
      if (ids->size() > max_tokens) return TooManyTokens(max_tokens);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::EncodeAtMost(const std::string& text,
                                                               size_t max_tokens) const {
  const size_t bad = utf8::FindInvalid(text);
  if (bad != std::string_view::npos) {
    const bool truncated = utf8::Decode(text, bad).kind == utf8::StepKind::kIncomplete;
    return absl::InvalidArgumentError(
        absl::StrFormat("text is not valid UTF-8: %s at byte offset %d (byte 0x%02X)",
                        truncated ? "truncated character" : "ill-formed sequence", bad,
                        static_cast<uint8_t>(text[bad])));
  }
  // Every id stands for at most max_token_bytes_ bytes of the normalized text, and NFC makes a
  // text at most 3 times shorter (Hangul jamo: L, V and T, 3 bytes each, compose to one 3-byte
  // syllable), so a longer text has more than max_tokens ids whatever it holds.
  const size_t shrink = nfc_ ? 3 : 1;
  if (max_tokens < std::numeric_limits<size_t>::max() / (shrink * max_token_bytes_) &&
      text.size() > shrink * max_token_bytes_ * max_tokens) {
    return TooManyTokens(max_tokens);
  }
  std::vector<int32_t> ids;
  ids.reserve(std::min(text.size() / 3, max_tokens) + 1);
  for (const std::string_view chunk : SplitIntoChunks(text, chunking_)) {
    RETURN_IF_ERROR(EncodeChunk(chunk, max_tokens, &ids));
  }
  return ids;
}

absl::Status HfTokenizer::EncodeChunk(std::string_view text, size_t max_tokens,
                                      std::vector<int32_t>* ids) const {
  std::vector<TextSegment> segments;
  raw_matcher_.Split(text, &segments);
  for (const TextSegment& segment : segments) {
    if (segment.token_id >= 0) {
      ids->push_back(segment.token_id);
      if (ids->size() > max_tokens) return TooManyTokens(max_tokens);
    } else {
      RETURN_IF_ERROR(
          EncodeSegment(text.substr(segment.begin, segment.end - segment.begin), max_tokens, ids));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> HfTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("token id %d out of range [0, %d)", id, vocab_size()));
    }
    const auto it = decoded_.find(id);
    if (it == decoded_.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("token id %d is in [0, %d) but no token has it", id, vocab_size()));
    }
    out += it->second;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseTokenizerJson(std::string_view json_text,
                                                              std::string_view origin) {
  TokenizerSpec spec;
  // nlohmann_json reports errors by exception; none may leave this function.
  try {
    const Json root = Json::parse(json_text.begin(), json_text.end());
    RETURN_IF_ERROR(SpecParser(origin).Parse(root, &spec));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(origin), ": not valid JSON: ", e.what()));
  }
  return BuildTokenizer(std::move(spec), origin);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> BuildTokenizer(TokenizerSpec spec,
                                                          std::string_view origin) {
  ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> tokenizer,
                   HfTokenizer::Build(std::move(spec), origin));
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

std::vector<std::string_view> SplitIntoChunks(std::string_view text, const TextChunking& c) {
  std::vector<std::string_view> chunks;
  if (c.chunk_chars == 0 && c.max_run_chars == 0) {
    if (!text.empty()) chunks.push_back(text);
    return chunks;
  }
  // Python's str.isspace: White_Space, plus the separators U+001C..U+001F.
  auto is_space = [](char32_t ch) {
    return unicode::IsWhiteSpace(ch) || (ch >= 0x1C && ch <= 0x1F);
  };
  size_t at = 0;
  while (at < text.size()) {
    // One chunk of at most chunk_chars characters...
    size_t end = at, chars = 0;
    while (end < text.size() && (c.chunk_chars == 0 || chars < c.chunk_chars)) {
      end += utf8::Decode(text, end).length;
      ++chars;
    }
    // ...cut wherever a run of spaces or of non-spaces passes max_run_chars.
    size_t slice = at, run = 0;
    bool run_is_space = false;
    for (size_t i = at; i < end;) {
      const utf8::Step step = utf8::Decode(text, i);
      const bool space = is_space(step.code_point);
      if (i == at || space != run_is_space) {
        run = 1;
        run_is_space = space;
      } else if (++run > c.max_run_chars && c.max_run_chars > 0) {
        chunks.push_back(text.substr(slice, i - slice));
        slice = i;
        run = 1;
      }
      i += step.length;
    }
    chunks.push_back(text.substr(slice, end - slice));
    at = end;
  }
  return chunks;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& tokenizer_json_path) {
  std::ifstream in(tokenizer_json_path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", tokenizer_json_path));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("error reading tokenizer file ", tokenizer_json_path));
  }
  return ParseTokenizerJson(contents.str(), tokenizer_json_path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelTokenizer(const std::string& dir) {
  if (std::filesystem::exists(dir + "/tokenizer.json")) {
    return LoadTokenizer(dir + "/tokenizer.json");
  }
  if (!std::filesystem::exists(dir + "/tiktoken.model")) {
    return absl::NotFoundError(absl::StrCat(dir, " holds no tokenizer.json and no tiktoken.model"));
  }
  std::string tokenizer_class = "(none)";
  std::ifstream in(dir + "/tokenizer_config.json", std::ios::binary);
  if (in) {
    const Json config = Json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (config.is_object() && config.contains("tokenizer_class") &&
        config["tokenizer_class"].is_string()) {
      tokenizer_class = config["tokenizer_class"].get<std::string>();
    }
  }
  if (tokenizer_class != "TikTokenTokenizer") {
    return absl::UnimplementedError(absl::StrCat(
        dir, "/tiktoken.model: tokenizer_class ", tokenizer_class,
        " in tokenizer_config.json; only Kimi-K2's TikTokenTokenizer is read (its pre-tokenizer "
        "is in the model's own code)"));
  }
  return LoadKimiTokenizer(dir);
}

absl::StatusOr<std::string> IncrementalDecoder::Push(absl::Span<const int32_t> ids) {
  ASSIGN_OR_RETURN(std::string bytes, tokenizer_->Decode(ids));
  pending_ += bytes;
  std::string out;
  const size_t consumed = utf8::AppendLossy(pending_, /*at_end=*/false, &out);
  pending_.erase(0, consumed);
  return out;
}

std::string IncrementalDecoder::Flush() {
  std::string out = utf8::ToValidLossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace treespec
