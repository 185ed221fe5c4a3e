#include "drafter_service/draft_batcher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/log.h"

namespace treespec {

DraftBatcher::DraftBatcher(std::unique_ptr<CausalLm> model)
    : model_(std::move(model)), thread_([this] { Loop(); }) {}

DraftBatcher::~DraftBatcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

absl::Status DraftBatcher::Run(DraftJob& job) {
  Pending pending{&job};
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_) return absl::CancelledError("the drafter is shutting down");
  incoming_.push_back(&pending);
  work_cv_.notify_all();
  pending.done_cv.wait(lock, [&] { return pending.done; });
  return pending.status;
}

void DraftBatcher::Complete(Pending* pending, absl::Status status) {
  pending->job->OnEnd(*model_, status);
  std::lock_guard<std::mutex> lock(mu_);
  pending->status = std::move(status);
  pending->done = true;
  // Under mu_: the caller may return (and destroy *pending) as soon as it sees done.
  pending->done_cv.notify_one();
}

void DraftBatcher::Advance(Pending* pending, std::vector<Entry>& next) {
  Entry e{pending, SeqTree(), 1, TopKRows::kAllNew};
  if (pending->job->NextForward(&e.tree, &e.k, &e.rows)) {
    next.push_back(std::move(e));
  } else {
    Complete(pending, absl::OkStatus());
  }
}

void DraftBatcher::RunGroup(std::vector<Entry>& entries, TopKRows rows, std::vector<Entry>& next) {
  std::vector<SeqTree> batch;
  int k = 1;
  for (Entry& e : entries) {
    k = std::max(k, e.k);
    batch.push_back(std::move(e.tree));
  }
  absl::StatusOr<std::vector<std::vector<TokenLogProb>>> ranked =
      model_->ForwardTopK(batch, k, rows);
  if (!ranked.ok() && entries.size() > 1) {
    // Keep one session's failure its own: each entry alone.
    TS_LOG(kDebug, "batched draft forward of %d entries failed (%s): each entry alone",
           static_cast<int>(entries.size()), ranked.status().ToString());
    for (size_t i = 0; i < entries.size(); ++i) {
      std::vector<Entry> one;
      one.push_back(Entry{entries[i].pending, std::move(batch[i]), entries[i].k, rows});
      RunGroup(one, rows, next);
    }
    return;
  }
  if (!ranked.ok()) {
    Complete(entries[0].pending, ranked.status());
    return;
  }
  // Entry i's rows: its new rows, or its last one.
  auto rows_of = [&](size_t i) -> size_t {
    const int new_rows = static_cast<int>(batch[i].tokens.size()) - batch[i].first_new;
    return rows == TopKRows::kLastNew ? (new_rows > 0 ? 1 : 0) : std::max(new_rows, 0);
  };
  size_t expected = 0;
  for (size_t i = 0; i < entries.size(); ++i) expected += rows_of(i);
  if (ranked->size() != expected) {
    for (Entry& e : entries) {
      Complete(e.pending, absl::InternalError(absl::StrCat("draft model returned ", ranked->size(),
                                                           " ranked rows for ", expected)));
    }
    return;
  }
  size_t row = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const size_t n = rows_of(i);
    std::vector<std::vector<TokenLogProb>> mine(std::make_move_iterator(ranked->begin() + row),
                                                std::make_move_iterator(ranked->begin() + row + n));
    row += n;
    absl::Status status = entries[i].pending->job->OnForward(*model_, std::move(mine));
    if (status.ok()) {
      Advance(entries[i].pending, next);
    } else {
      Complete(entries[i].pending, std::move(status));
    }
  }
}

std::vector<DraftBatcher::Pending*> DraftBatcher::AppendContexts(
    const std::deque<Pending*>& fresh) {
  std::vector<Pending*> go_on, appending;
  std::vector<ContextRows> batch;
  for (Pending* p : fresh) {
    if (const ContextRows* rows = p->job->Context(); rows != nullptr) {
      appending.push_back(p);
      batch.push_back(*rows);
    } else {
      go_on.push_back(p);
    }
  }
  if (batch.empty()) return go_on;
  absl::Status status = model_->AppendContext(batch);
  if (status.ok()) {
    for (Pending* p : appending) {
      p->job->OnContext();
      go_on.push_back(p);
    }
    return go_on;
  }
  if (appending.size() > 1) {
    TS_LOG(kDebug, "batched context append of %d entries failed (%s): each entry alone",
           static_cast<int>(appending.size()), status.ToString());
  }
  for (size_t i = 0; i < appending.size(); ++i) {
    absl::Status alone =
        appending.size() > 1 ? model_->AppendContext(absl::MakeConstSpan(&batch[i], 1)) : status;
    if (alone.ok()) {
      appending[i]->job->OnContext();
      go_on.push_back(appending[i]);
    } else {
      Complete(appending[i], std::move(alone));
    }
  }
  return go_on;
}

void DraftBatcher::Loop() {
  std::vector<Entry> active;
  while (true) {
    std::deque<Pending*> fresh;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || !incoming_.empty() || !active.empty(); });
      if (stopping_ && incoming_.empty() && active.empty()) return;
      fresh.swap(incoming_);
    }
    // Sessions opening or closing (WithModel) go first: the mutex is not fair, and this
    // thread would otherwise take it back at once, round after round.
    while (model_waiters_.load() > 0) std::this_thread::yield();
    std::lock_guard<std::mutex> model_lock(model_mu_);
    for (Pending* p : AppendContexts(fresh)) Advance(p, active);
    std::vector<Entry> next;
    for (TopKRows rows : {TopKRows::kLastNew, TopKRows::kAllNew}) {
      std::vector<Entry> group;
      for (Entry& e : active) {
        if (e.rows == rows) group.push_back(std::move(e));
      }
      if (!group.empty()) RunGroup(group, rows, next);
    }
    active.swap(next);
  }
}

}  // namespace treespec
