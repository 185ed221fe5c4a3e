// The draft model's forwards for every session at once. A drafter process serves many sessions (one
// per running request of every verifier it serves) with one model on one device; run one session at
// a time, N sessions cost N times the forwards of one, and at batch 16 the verifier would wait on
// the drafter most of each step (measured: docs/experiments/README.md, 'the drafter batches its
// sessions' forwards'). Here each session hands its work to the batcher as a DraftJob — a sequence
// of forwards, each depending on the result of the one before (append the emitted tokens, then one
// forward per tree depth) — and blocks until the job ends. The batcher's thread runs rounds: the
// next forward of every job in flight goes into one ForwardTopK (one per kind of rows), so N
// sessions cost about the forwards of one, only wider. Jobs that arrive during a round join the
// next one. A job may bring context rows to append first (a DFlash session's new target
// features): those of the jobs that join a round go into one CausalLm::AppendContext before its
// forwards.
//
// A batched forward or append that fails (say RESOURCE_EXHAUSTED: the KV pool cannot hold every
// entry at once) is retried entry by entry, so one session's failure never becomes another's.
#ifndef TREESPEC_DRAFTER_SERVICE_DRAFT_BATCHER_H_
#define TREESPEC_DRAFTER_SERVICE_DRAFT_BATCHER_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/model/causal_lm.h"

namespace treespec {

// One session's work as a sequence of forwards. Both methods run on the batcher's thread while
// the session's own thread waits in DraftBatcher::Run, so the job needs no lock of its own.
class DraftJob {
 public:
  virtual ~DraftJob() = default;
  // Context rows to append before the job's first forward, or null (the default); read once,
  // when the job joins a round, and must stay valid until OnContext or the job's end.
  virtual const ContextRows* Context() { return nullptr; }
  // Those rows are in the model (an append that fails ends the job with its status instead).
  virtual void OnContext() {}
  // The next forward: its tree (one batch entry), the k it needs ranked and which rows; false
  // when the job is done.
  virtual bool NextForward(SeqTree* tree, int* k, TopKRows* rows) = 0;
  // The ranked rows of that forward (at least the k asked for where the vocabulary allows, in
  // the order ForwardTopK gives them for one entry), with the model locked. An error ends the
  // job with it.
  virtual absl::Status OnForward(CausalLm& model,
                                 std::vector<std::vector<TokenLogProb>> ranked) = 0;
  // The job ended (done, or failed with `status`); with the model locked, e.g. to drop a
  // draft's K/V here rather than from the session's thread, which would have to wait for the
  // model between rounds.
  virtual void OnEnd(CausalLm& /*model*/, const absl::Status& /*status*/) {}
};

class DraftBatcher {
 public:
  explicit DraftBatcher(std::unique_ptr<CausalLm> model);
  // Finishes the jobs in flight, then stops the thread.
  ~DraftBatcher();
  DraftBatcher(const DraftBatcher&) = delete;
  DraftBatcher& operator=(const DraftBatcher&) = delete;

  // Runs `job` to its end, batched with the other sessions' jobs; its status. Thread-safe.
  absl::Status Run(DraftJob& job);

  // Runs fn(model) with the model locked (sequence lifetime, rollback). Thread-safe.
  template <typename F>
  auto WithModel(F fn) {
    ++model_waiters_;  // the batcher lets us in between two rounds
    std::lock_guard<std::mutex> lock(model_mu_);
    --model_waiters_;
    return fn(*model_);
  }
  const ModelConfig& config() const { return model_->config(); }

 private:
  struct Pending {
    DraftJob* job;
    absl::Status status;
    bool done = false;
    std::condition_variable done_cv;  // wakes just this job's caller
  };
  // A job in flight with the forward it waits for.
  struct Entry {
    Pending* pending;
    SeqTree tree;
    int k;
    TopKRows rows;
  };
  void Loop();
  // Appends the context rows of the jobs in `fresh` (one AppendContext; each alone if that
  // fails); returns the jobs that go on to their forwards, ends the others. Model locked.
  std::vector<Pending*> AppendContexts(const std::deque<Pending*>& fresh);
  // Runs one ForwardTopK over `entries` (all of one kind of rows) and hands each job its rows;
  // moves the jobs that go on into `next`. Model locked.
  void RunGroup(std::vector<Entry>& entries, TopKRows rows, std::vector<Entry>& next);
  // The job's next forward into `next`, or its end (status ok).
  void Advance(Pending* pending, std::vector<Entry>& next);
  void Complete(Pending* pending, absl::Status status);

  std::mutex model_mu_;  // the model: forwards (batcher thread) and WithModel callers
  std::atomic<int> model_waiters_{0};
  const std::unique_ptr<CausalLm> model_;

  std::mutex mu_;
  std::condition_variable work_cv_;  // incoming_ or stopping_
  std::deque<Pending*> incoming_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace treespec

#endif  // TREESPEC_DRAFTER_SERVICE_DRAFT_BATCHER_H_
