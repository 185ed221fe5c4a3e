// A CausalLm that passes every call to another one: the base of test and benchmark wrappers
// that watch, time or perturb a few calls (they override those and call the base or inner()
// for the real work). VerifyStep goes to the inner model's own (so a GPU backend keeps its
// on-device step), not through this wrapper's Forward.
#ifndef TREESPEC_COMMON_MODEL_FORWARDING_CAUSAL_LM_H_
#define TREESPEC_COMMON_MODEL_FORWARDING_CAUSAL_LM_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/model/causal_lm.h"

namespace treespec {

class ForwardingCausalLm : public CausalLm {
 public:
  explicit ForwardingCausalLm(std::unique_ptr<CausalLm> inner) : inner_(std::move(inner)) {}

  const ModelConfig& config() const override { return inner_->config(); }
  int tensor_parallel() const override { return inner_->tensor_parallel(); }
  std::string device() const override { return inner_->device(); }
  SeqId CreateSequence() override { return inner_->CreateSequence(); }
  void FreeSequence(SeqId seq) override { inner_->FreeSequence(seq); }
  PagedKvCache& kv_cache() override { return inner_->kv_cache(); }
  absl::StatusOr<std::vector<float>> Forward(absl::Span<const SeqTree> batch) override {
    return inner_->Forward(batch);
  }
  absl::StatusOr<std::vector<std::vector<TokenLogProb>>> ForwardTopK(
      absl::Span<const SeqTree> batch, int k, TopKRows rows) override {
    return inner_->ForwardTopK(batch, k, rows);
  }
  void Commit(SeqId seq, int committed_len, absl::Span<const int> path) override {
    inner_->Commit(seq, committed_len, path);
  }
  void Truncate(SeqId seq, int len) override { inner_->Truncate(seq, len); }
  absl::StatusOr<std::vector<StepResult>> VerifyStep(absl::Span<const SeqTree> batch,
                                                     absl::Span<const StepSpec> specs) override {
    return inner_->VerifyStep(batch, specs);
  }
  absl::Status SetFeatureLayers(std::vector<int> layers) override {
    if (absl::Status s = inner_->SetFeatureLayers(layers); !s.ok()) return s;
    return CausalLm::SetFeatureLayers(std::move(layers));
  }
  absl::Status AppendContext(absl::Span<const ContextRows> batch) override {
    return inner_->AppendContext(batch);
  }
  using CausalLm::AppendContext;

 protected:
  CausalLm& inner() { return *inner_; }

 private:
  std::unique_ptr<CausalLm> inner_;
};

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_FORWARDING_CAUSAL_LM_H_
