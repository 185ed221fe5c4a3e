// Test helpers for the engine: random models on disk, a sink that records updates, and
// in-process draft sources (a real drafter session, and fault injectors).
#ifndef TREESPEC_VERIFIER_SERVICE_ENGINE_TEST_UTIL_H_
#define TREESPEC_VERIFIER_SERVICE_ENGINE_TEST_UTIL_H_

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/model/config.h"
#include "drafter_service/drafter.h"
#include "verifier_service/draft_source.h"
#include "verifier_service/engine.h"

namespace treespec::testing {

// SmallLlamaConfig (vocab 512, 2 layers) untied, with context 512, BOS 1 and EOS 2.
ModelConfig SmallConfig();

// Writes a random model for `config` into a fresh temp directory and returns its path.
std::string WriteTempModel(const ModelConfig& config, uint64_t seed);

// Collects a request's updates; Wait() blocks until the final one.
class RecordingSink final : public RequestSink {
 public:
  void OnUpdate(GenerationUpdate update) override;
  // Waits for the final update (or `timeout_s`); returns false on timeout.
  bool Wait(double timeout_s = 120);
  std::vector<int32_t> ids() const;
  GenerationUpdate final_update() const;
  int updates() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> ids_;
  std::vector<GenerationUpdate> updates_;
  bool done_ = false;
};

// Runs drafter sessions in the caller's thread (the engine's): each Commit drafts at once.
class LocalDraftSource final : public DraftSource {
 public:
  explicit LocalDraftSource(DrafterFactory* factory) : factory_(factory) {}
  std::unique_ptr<DraftStream> Open(const DraftOpenParams& params,
                                    std::function<void()> on_arrival) override;
  std::string target() const override { return "local"; }

 private:
  DrafterFactory* factory_;
};

// Fault injection: every tree is produced by `make_tree(step, tokens)`; returning nullopt means
// the drafter stays silent for that step.
class ScriptedDraftSource final : public DraftSource {
 public:
  using TreeFn = std::function<std::optional<DraftedTree>(int64_t step)>;
  explicit ScriptedDraftSource(TreeFn fn) : fn_(std::move(fn)) {}
  std::unique_ptr<DraftStream> Open(const DraftOpenParams& params,
                                    std::function<void()> on_arrival) override;
  std::string target() const override { return "scripted"; }

 private:
  TreeFn fn_;
};

// A real drafter session whose trees arrive `delay(step)` after each commit, on another thread,
// like a remote drafter that is slow for a while; behind a pool that has stated `pool`. Counts
// the sessions opened.
class DelayedDraftSource final : public DraftSource {
 public:
  using DelayFn = std::function<absl::Duration(int64_t step)>;
  DelayedDraftSource(DrafterFactory* factory, DelayFn delay, DrafterPoolInfo pool = {})
      : factory_(factory), delay_(std::move(delay)), pool_(std::move(pool)) {}
  std::unique_ptr<DraftStream> Open(const DraftOpenParams& params,
                                    std::function<void()> on_arrival) override;
  std::string target() const override { return "delayed"; }
  DrafterPoolInfo PoolInfo() const override { return pool_; }
  int opened() const { return opened_; }

 private:
  DrafterFactory* factory_;
  DelayFn delay_;
  DrafterPoolInfo pool_;
  std::atomic<int> opened_ = 0;
};

// A local drafter behind a pool that has stated `pool`, as GrpcDraftSource learns it from its
// drafters' GetInfo answers and DraftOpened messages; keeps what each session was opened with.
class StatedPoolSource final : public DraftSource {
 public:
  StatedPoolSource(DrafterFactory* factory, DrafterPoolInfo pool)
      : local_(factory), pool_(std::move(pool)) {}
  std::unique_ptr<DraftStream> Open(const DraftOpenParams& params,
                                    std::function<void()> on_arrival) override;
  std::string target() const override { return "stated"; }
  DrafterPoolInfo PoolInfo() const override { return pool_; }
  const std::vector<DraftOpenParams>& opened() const { return opened_; }

 private:
  LocalDraftSource local_;
  DrafterPoolInfo pool_;
  std::vector<DraftOpenParams> opened_;
};

// `inner`'s drafter, stated as one that reads `needs`; log() is everything its newest session's
// context was given (the prompt, then every commit's tokens and features).
class RecordingFactory final : public DrafterFactory {
 public:
  RecordingFactory(DrafterFactory* inner, FeatureSpec needs)
      : inner_(inner), needs_(std::move(needs)) {}
  absl::StatusOr<std::unique_ptr<DraftSession>> NewSession() override;
  FeatureSpec features() const override { return needs_; }
  const DraftContext& log() const { return log_; }

 private:
  DrafterFactory* inner_;
  FeatureSpec needs_;
  DraftContext log_;
};

// Runs one request through `engine` and returns the final update (ids in token_ids).
GenerationUpdate RunToEnd(Engine& engine, GenerationRequest request);

}  // namespace treespec::testing

#endif  // TREESPEC_VERIFIER_SERVICE_ENGINE_TEST_UTIL_H_
