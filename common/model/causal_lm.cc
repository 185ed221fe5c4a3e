#include "common/model/causal_lm.h"

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/sampling.h"
#include "common/tree/token_tree.h"
#include "common/util/status_macros.h"

namespace treespec {

absl::StatusOr<std::vector<std::vector<TokenLogProb>>> CausalLm::ForwardTopK(
    absl::Span<const SeqTree> batch, int k, TopKRows rows) {
  if (k < 1) return absl::InvalidArgumentError(absl::StrCat("ForwardTopK: k ", k, " < 1"));
  absl::StatusOr<std::vector<float>> logits = Forward(batch);
  if (!logits.ok()) return logits.status();
  const size_t vocab = config().vocab_size;
  std::vector<float> logprobs(vocab);
  std::vector<std::vector<TokenLogProb>> out;
  size_t row = 0;
  for (const SeqTree& t : batch) {
    const size_t n = t.tokens.size() - t.first_new;
    for (size_t r = rows == TopKRows::kLastNew && n > 0 ? n - 1 : 0; r < n; ++r) {
      LogSoftmax(absl::MakeConstSpan(logits->data() + (row + r) * vocab, vocab),
                 absl::MakeSpan(logprobs));
      out.push_back(TopKLogProbs(logprobs, k));
    }
    row += n;
  }
  return out;
}

absl::StatusOr<std::vector<StepResult>> CausalLm::VerifyStep(absl::Span<const SeqTree> batch,
                                                             absl::Span<const StepSpec> specs) {
  if (specs.size() != batch.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("VerifyStep: ", specs.size(), " specs for ", batch.size(), " batch entries"));
  }
  for (size_t b = 0; b < batch.size(); ++b) {
    if (batch[b].first_new != 0) {
      return absl::InvalidArgumentError(absl::StrCat("VerifyStep: batch entry ", b,
                                                     " has first_new ", batch[b].first_new,
                                                     "; a verify step computes whole trees"));
    }
  }
  RETURN_IF_ERROR(CheckFeatureCapture(specs));
  const bool capture =
      std::any_of(specs.begin(), specs.end(), [](const StepSpec& s) { return s.capture_features; });
  std::vector<uint16_t> features;
  absl::StatusOr<std::vector<float>> logits =
      capture ? ForwardCapturing(batch, &features) : Forward(batch);
  if (!logits.ok()) return logits.status();
  const int vocab = config().vocab_size;
  const int width = static_cast<int>(feature_layers_.size()) * config().hidden_size;
  std::vector<StepResult> results(batch.size());
  size_t row = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const SeqTree& t = batch[b];
    const int n = static_cast<int>(t.tokens.size());
    const float* rows = logits->data() + row * vocab;
    const size_t first_row = row;
    row += n;
    StepResult& r = results[b];
    if (specs[b].prefill) {
      r.path.resize(n);
      std::iota(r.path.begin(), r.path.end(), 0);
      r.emitted.push_back(ChooseToken(absl::MakeConstSpan(rows + (n - 1) * vocab, vocab),
                                      specs[b].sampling, t.committed_len + n));
    } else {
      const std::vector<int32_t> depth = NodeDepths(t.parents);
      std::vector<int32_t> choice(n);
      for (int i = 0; i < n; ++i) {
        choice[i] = ChooseToken(absl::MakeConstSpan(rows + i * vocab, vocab), specs[b].sampling,
                                t.committed_len + depth[i] + 1);
      }
      const std::vector<int32_t> path = WalkTree(t.tokens, t.parents, choice);
      r.path.assign(path.begin(), path.end());
      for (size_t j = 1; j < path.size(); ++j) r.emitted.push_back(t.tokens[path[j]]);
      r.emitted.push_back(choice[path.back()]);
    }
    Commit(t.seq, t.committed_len, r.path);
    if (specs[b].capture_features) {
      r.features = SelectRows(features.data(), width, first_row, r.path);
    }
  }
  return results;
}

absl::Status CausalLm::CheckFeatureCapture(absl::Span<const StepSpec> specs) const {
  for (size_t b = 0; b < specs.size(); ++b) {
    if (specs[b].capture_features && feature_layers_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("VerifyStep: batch entry ", b,
                       " asks for target features, but no feature layers are set "
                       "(SetFeatureLayers)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CausalLm::SetFeatureLayers(std::vector<int> layers) {
  if (!LayersAscendingWithin(layers, config().num_layers)) {
    return absl::InvalidArgumentError(absl::StrCat("feature layers [", absl::StrJoin(layers, ", "),
                                                   "] must be strictly ascending within [0, ",
                                                   config().num_layers, ") (the target's layers)"));
  }
  feature_layers_ = std::move(layers);
  return absl::OkStatus();
}

absl::Status CausalLm::AppendContext(absl::Span<const ContextRows> /*batch*/) {
  return absl::FailedPreconditionError(
      absl::StrCat("the ", device(), " backend takes no context rows"));
}

absl::StatusOr<std::vector<float>> CausalLm::ForwardCapturing(absl::Span<const SeqTree> batch,
                                                              std::vector<uint16_t>* features) {
  if (features != nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("the ", device(), " backend does not capture target features"));
  }
  return Forward(batch);
}

}  // namespace treespec
