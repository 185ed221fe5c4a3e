#include "common/rpc/draft_context_proto.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/drafter_kind_proto.h"

namespace treespec {

namespace {

// Rows [first, first + rows) of `f` into `out`'s features.
void PackRows(const TargetFeatures& f, int first, int rows, v1::DraftCommit* out) {
  out->set_feature_rows(rows);
  std::string* bytes = out->mutable_features();
  const size_t begin = static_cast<size_t>(first) * f.width;
  const size_t count = static_cast<size_t>(rows) * f.width;
#ifdef ABSL_IS_LITTLE_ENDIAN
  // The wire is little-endian: on such a host the rows are their own encoding. A commit of a
  // large target's rows is megabytes on the engine thread, so this is one copy (no zero-fill
  // first, no loop).
  if (count == 0) {
    bytes->clear();
  } else {
    bytes->assign(reinterpret_cast<const char*>(f.bf16.data() + begin), count * 2);
  }
#else
  bytes->resize(count * 2);
  for (size_t i = 0; i < count; ++i) {
    const uint16_t v = f.bf16[begin + i];
    (*bytes)[2 * i] = static_cast<char>(v & 0xff);
    (*bytes)[2 * i + 1] = static_cast<char>(v >> 8);
  }
#endif
}

}  // namespace

void ToProto(const DraftContext& context, v1::DraftCommit* out) {
  out->mutable_tokens()->Assign(context.tokens.begin(), context.tokens.end());
  PackRows(context.features, 0, context.features.rows, out);
}

std::vector<v1::DraftRequest> CommitParts(int64_t step, const DraftContext& context,
                                          size_t max_feature_bytes) {
  const TargetFeatures& f = context.features;
  const size_t row_bytes = static_cast<size_t>(f.width) * 2;
  const int per_part =
      f.empty() ? 1 : static_cast<int>(std::max<size_t>(1, max_feature_bytes / row_bytes));
  std::vector<v1::DraftRequest> parts;
  int first = 0;
  do {
    const int rows = std::min(per_part, f.rows - first);
    v1::DraftCommit* part = parts.emplace_back().mutable_commit();
    part->set_step(step);
    PackRows(f, first, rows, part);
    first += rows;
    if (first < f.rows) {
      part->set_more(true);
    } else {
      part->mutable_tokens()->Assign(context.tokens.begin(), context.tokens.end());
    }
  } while (first < f.rows);
  return parts;
}

absl::StatusOr<DraftContext> DraftContextFromProto(const v1::DraftCommit& commit,
                                                   absl::string_view what) {
  DraftContext context;
  context.tokens.assign(commit.tokens().begin(), commit.tokens().end());
  const std::string& bytes = commit.features();
  const int rows = commit.feature_rows();
  if (rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": feature_rows is ", rows, "; it must be >= 0"));
  }
  if ((rows == 0) != bytes.empty() || (rows > 0 && bytes.size() % (2 * size_t{1} * rows) != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": features has ", bytes.size(), " bytes for feature_rows ", rows,
                     "; it must be feature_rows whole rows of bf16 (2 bytes a value)"));
  }
  TargetFeatures& f = context.features;
  f.rows = rows;
  f.width = rows > 0 ? static_cast<int>(bytes.size() / 2 / rows) : 0;
  f.bf16.resize(bytes.size() / 2);
#ifdef ABSL_IS_LITTLE_ENDIAN
  // An empty vector's data() may be null, which memcpy must not get even for 0 bytes.
  if (!bytes.empty()) std::memcpy(f.bf16.data(), bytes.data(), bytes.size());
#else
  for (size_t i = 0; i < f.bf16.size(); ++i) {
    f.bf16[i] = static_cast<uint16_t>(static_cast<uint8_t>(bytes[2 * i]) |
                                      static_cast<uint8_t>(bytes[2 * i + 1]) << 8);
  }
#endif
  if (absl::Status s = CheckTargetFeatures(f, absl::StrCat(what, ": features")); !s.ok()) return s;
  return context;
}

void ToProto(DrafterKind kind, const FeatureSpec& needs, v1::FeatureNeeds* out) {
  out->set_mode(ToProto(kind));
  out->mutable_target_layers()->Assign(needs.layers.begin(), needs.layers.end());
  out->set_target_hidden_size(needs.hidden);
  out->set_target_num_layers(needs.num_layers);
  out->set_target_vocab_size(needs.vocab);
}

FeatureSpec FromProto(const v1::FeatureNeeds& needs) {
  return {{needs.target_layers().begin(), needs.target_layers().end()},
          needs.target_hidden_size(),
          needs.target_num_layers(),
          needs.target_vocab_size()};
}

}  // namespace treespec
