#include "tools/loadgen/driver.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/bearer_auth.h"
#include "common/rpc/health_checked_channel.h"

namespace treespec::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

double Millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// "UNAVAILABLE" etc.: gRPC and Abseil share the canonical code numbers.
std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace

v1::GenerateRequest BuildRequest(const Prompt& prompt, int index, const RequestOptions& o) {
  v1::GenerateRequest r;
  r.set_request_id(absl::StrCat("loadgen-", index));
  if (prompt.token_ids.empty()) {
    r.set_text(prompt.text);
  } else {
    r.mutable_token_ids()->mutable_ids()->Add(prompt.token_ids.begin(), prompt.token_ids.end());
  }
  v1::SamplingParams* s = r.mutable_sampling();
  s->set_max_new_tokens(prompt.output_len);
  s->set_temperature(static_cast<float>(o.temperature));
  if (o.top_p > 0) s->set_top_p(static_cast<float>(o.top_p));
  s->set_top_k(o.top_k);
  s->set_seed(o.seed + static_cast<uint64_t>(index));
  s->set_ignore_eos(o.ignore_eos);
  v1::SpeculationParams* spec = r.mutable_speculation();
  spec->set_mode(o.mode);
  if (o.tree_budget > 0) spec->set_tree_budget(o.tree_budget);
  if (o.max_depth > 0) spec->set_max_depth(o.max_depth);
  return r;
}

// What one Run shares with its calls; guarded by `mu` except the constant parts.
struct Driver::RunState {
  std::vector<Prompt> prompts;            // by index: scheduled, then follow-ups
  absl::Span<const CancelPoint> cancels;  // by scheduled index; empty = none
  const RequestOptions* request_options = nullptr;
  const ScheduleOptions* schedule = nullptr;
  ProgressBar* progress = nullptr;
  Clock::time_point start;
  absl::Time start_wall;

  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0, done = 0, failed = 0;
  Clock::time_point last_end;
  std::vector<RequestResult> results;  // by index
  std::vector<bool> sent;
  bool sent_all = false;  // every scheduled prompt sent (or left out by the duration)
  // Follow-ups waiting for their time.
  struct Due {
    Clock::time_point at;
    int index = 0;
    int target = -1;  // the target it prefers; -1: the next in the rotation
  };
  std::vector<Due> due;
};

// One attempt of one request: a server-streaming Generate call and its timings.
class Driver::Call final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  Call(Driver* driver, RunState* state, int index, int target, int attempt, Clock::time_point sent)
      : driver_(driver),
        state_(state),
        index_(index),
        target_(target),
        attempt_(attempt),
        sent_(sent),
        cancel_(static_cast<size_t>(index) < state->cancels.size() ? state->cancels[index]
                                                                   : CancelPoint{}) {}

  void Start(v1::Generation::Stub* stub, v1::GenerateRequest request) {
    request_ = std::move(request);
    context_.set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            Seconds(state_->schedule->request_timeout_s) - (Clock::now() - sent_)));
    AddBearerToken(driver_->bearer_token_, &context_);
    stub->async()->Generate(&context_, &request_, this);
    if (cancel_.after_ms >= 0) {
      // The hold keeps OnDone (and the reactor) back until the timer has either fired or been
      // disarmed, so the callback never meets a deleted call. A retry keeps the first send's
      // time, so the timer may fire at once.
      AddHold();
      timer_ = driver_->timers_.Arm(sent_ + Seconds(cancel_.after_ms / 1000), [this] {
        Cancel();
        RemoveHold();
      });
    }
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the stream ended: OnDone follows
      DisarmTimer();
      return;
    }
    const Clock::time_point now = Clock::now();
    ++messages_;
    last_message_ = now;
    if (const int n = response_.token_ids_size(); n > 0) {
      if (tokens_seen_ == 0) {
        record_.ttft_ms = Millis(now - sent_);
      } else {
        record_.itl_ms.push_back(Millis(now - last_tokens_));
      }
      tokens_seen_ += n;
      last_tokens_ = now;
      record_.output_ids.insert(record_.output_ids.end(), response_.token_ids().begin(),
                                response_.token_ids().end());
    }
    if (response_.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      finish_reason_ = v1::FinishReason_Name(response_.finish_reason());
      record_.input_tokens = response_.usage().prompt_tokens();
      record_.cached_tokens = response_.usage().cached_tokens();
      record_.output_tokens = response_.usage().completion_tokens();
      const v1::SpeculationStats& s = response_.speculation();
      record_.drafts = s.steps() - s.fallback_steps();
      record_.draft_tokens = s.drafted_tokens();
      record_.accepted_tokens = s.accepted_tokens();
      record_.accepted_per_depth.assign(s.accepted_per_depth().begin(),
                                        s.accepted_per_depth().end());
      DisarmTimer();  // complete: nothing left to cancel
    } else if (CancelDue()) {
      DisarmTimer();
      Cancel();  // the next read fails and OnDone follows with CANCELLED
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    Driver* const driver = driver_;
    RunState* const state = state_;
    const bool ended = driver->OnCallDone(this, status);
    // Deleted before Run may see the request end and return: the ClientContext lets go of its
    // call while the Driver, and with it the channels and gRPC's callback queue, still exist.
    delete this;
    if (ended) driver->OnRequestEnded(state);
  }

 private:
  friend class Driver;

  // Whether the plan says to cancel now, after a message that was not the last.
  bool CancelDue() const {
    if (cancelled_.load()) return false;
    if (cancel_.after_tokens > 0) return tokens_seen_ >= cancel_.after_tokens;
    return cancel_.after_ms >= 0 && tokens_seen_ > 0;  // the first token beat the timer
  }

  void Cancel() {
    cancelled_.store(true);
    context_.TryCancel();
  }

  // Stops a timer that has not fired and lets go of its hold; a timer that fired lets go itself.
  void DisarmTimer() {
    if (timer_ != 0 && driver_->timers_.Disarm(timer_)) RemoveHold();
    timer_ = 0;
  }

  Driver* const driver_;
  RunState* const state_;
  const int index_, target_, attempt_;
  const Clock::time_point sent_;  // of the request's first attempt
  const CancelPoint cancel_;
  uint64_t timer_ = 0;                  // the armed cancel timer's id; 0 = none
  std::atomic<bool> cancelled_{false};  // TryCancel was called (by a reaction or the timer)

  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  int messages_ = 0;
  int tokens_seen_ = 0;
  Clock::time_point last_message_, last_tokens_;
  RequestRecord record_;
  std::string finish_reason_;  // set by the final message
};

Driver::Driver(std::vector<std::string> targets,
               std::shared_ptr<grpc::ChannelCredentials> credentials, std::string bearer_token)
    : targets_(std::move(targets)), bearer_token_(std::move(bearer_token)) {
  for (const std::string& target : targets_) {
    channels_.push_back(HealthCheckedChannel(target, credentials));
    stubs_.push_back(v1::Generation::NewStub(channels_.back()));
  }
}

Driver::~Driver() = default;

absl::StatusOr<std::vector<v1::ModelInfo>> Driver::ModelInfos(absl::Duration timeout) {
  std::vector<v1::ModelInfo> infos(targets_.size());
  for (size_t t = 0; t < targets_.size(); ++t) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    AddBearerToken(bearer_token_, &context);
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    const grpc::Status status =
        stubs_[t]->GetModelInfo(&context, v1::GetModelInfoRequest(), &infos[t]);
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("target ", targets_[t], ": GetModelInfo: ",
                                       CodeName(status.error_code()), ": ", status.error_message(),
                                       status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                                           ? " (is a verifier serving there?)"
                                           : ""));
    }
  }
  return infos;
}

int Driver::PickTarget(int preferred) {
  const int n = static_cast<int>(targets_.size());
  for (int k = 0; k < n; ++k) {
    const int t = (preferred + k) % n;
    const grpc_connectivity_state state = channels_[t]->GetState(/*try_to_connect=*/true);
    if (state != GRPC_CHANNEL_TRANSIENT_FAILURE && state != GRPC_CHANNEL_SHUTDOWN) return t;
  }
  return preferred % n;
}

void Driver::Launch(RunState* state, int index, int target, int attempt, Clock::time_point sent) {
  v1::GenerateRequest request;
  {
    std::lock_guard<std::mutex> lock(state->mu);  // follow-ups grow `prompts`
    request = BuildRequest(state->prompts[index], index, *state->request_options);
  }
  auto* call = new Call(this, state, index, target, attempt, sent);
  call->Start(stubs_[target].get(), std::move(request));
}

bool Driver::OnCallDone(Call* call, const grpc::Status& status) {
  RunState* state = call->state_;
  const bool cancelled = call->cancelled_.load();  // by the client, as planned
  const bool is_cancelled = status.error_code() == grpc::StatusCode::CANCELLED;
  const bool refused =
      !cancelled && status.error_code() == grpc::StatusCode::UNAVAILABLE && call->messages_ == 0;
  if (refused && state->schedule->failover && call->attempt_ < static_cast<int>(targets_.size())) {
    Launch(state, call->index_, PickTarget(call->target_ + 1), call->attempt_ + 1, call->sent_);
    return false;
  }
  // Every token arrived: complete, even if the cancel raced the trailing status. An error that
  // reached the client before its cancel did is still a failure.
  const bool complete =
      !call->finish_reason_.empty() && (status.ok() || (cancelled && is_cancelled));
  const bool dropped = !complete && cancelled && is_cancelled;
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(state->mu);
  RequestResult& r = state->results[call->index_];
  r.index = call->index_;
  r.request_id = call->request_.request_id();
  r.target = targets_[call->target_];
  r.attempts = call->attempt_;
  r.record = std::move(call->record_);
  r.finish_reason = call->finish_reason_;
  r.cancel = call->cancel_;
  r.record.ok = complete;
  r.record.cancelled = dropped;
  if (r.record.ok) {
    r.record.e2el_ms = Millis(call->last_message_ - call->sent_);
  } else if (dropped) {
    r.record.output_tokens = call->tokens_seen_;  // where it was cancelled
  } else {
    r.error = status.ok()
                  ? "OK: the stream ended without its final message"
                  : absl::StrCat(CodeName(status.error_code()), ": ", status.error_message());
  }
  ++state->done;
  if (!r.record.ok && !dropped) ++state->failed;
  state->last_end = now;
  if (state->schedule->follow_up) {
    std::optional<FollowUp> next =
        state->schedule->follow_up(state->prompts[call->index_], r, state->sent_all);
    if (next.has_value()) {
      const int index = static_cast<int>(state->prompts.size());
      state->prompts.push_back(std::move(next->prompt));
      state->results.emplace_back();
      state->sent.push_back(false);
      state->due.push_back(
          {now + Seconds(next->delay_s), index, next->same_target ? call->target_ : -1});
      state->cv.notify_all();
    }
  }
  return true;
}

void Driver::OnRequestEnded(RunState* state) {
  std::lock_guard<std::mutex> lock(state->mu);
  --state->in_flight;
  if (state->progress != nullptr)
    state->progress->Set(state->done, state->failed, state->in_flight);
  state->cv.notify_all();
}

RunResult Driver::Run(absl::Span<const Prompt> prompts, absl::Span<const double> send_times,
                      absl::Span<const CancelPoint> cancels, const RequestOptions& request_options,
                      const ScheduleOptions& schedule, ProgressBar* progress) {
  RunState state;
  const int n = static_cast<int>(std::min(prompts.size(), send_times.size()));
  state.prompts.assign(prompts.begin(), prompts.begin() + n);
  state.cancels = cancels;
  state.request_options = &request_options;
  state.schedule = &schedule;
  state.progress = progress;
  state.results.resize(n);
  state.sent.assign(n, false);
  state.start = Clock::now();
  state.start_wall = absl::Now();
  state.last_end = state.start;
  RunResult out;
  const Clock::time_point never = Clock::time_point::max();
  const Clock::time_point end =
      schedule.duration_s > 0 ? state.start + Seconds(schedule.duration_s) : never;
  int next = 0;  // the next scheduled prompt
  std::unique_lock<std::mutex> lock(state.mu);
  while (true) {
    state.sent_all = next >= n;
    // What goes next: the earlier of the next scheduled prompt and the earliest due follow-up.
    const Clock::time_point scheduled_at =
        next < n ? state.start + Seconds(send_times[next]) : never;
    auto follow = std::min_element(
        state.due.begin(), state.due.end(),
        [](const RunState::Due& a, const RunState::Due& b) { return a.at < b.at; });
    const Clock::time_point follow_at = follow != state.due.end() ? follow->at : never;
    const Clock::time_point at = std::min(scheduled_at, follow_at);
    if (at == never) {
      if (state.in_flight == 0) break;
      state.cv.wait(lock);  // an ending request may bring a follow-up
      continue;
    }
    if (at >= end || Clock::now() >= end) {
      // The duration is over: nothing more is sent.
      out.not_sent = n - next;
      next = n;
      state.due.clear();
      continue;
    }
    if (Clock::now() < at) {
      state.cv.wait_until(lock, at);  // or an earlier follow-up
      continue;
    }
    if (schedule.max_concurrency > 0 && state.in_flight >= schedule.max_concurrency) {
      state.cv.wait(lock);
      continue;
    }
    int index, preferred = -1;
    if (scheduled_at <= follow_at) {
      index = next++;
    } else {
      index = follow->index;
      preferred = follow->target;
      state.due.erase(follow);
    }
    const Clock::time_point sent = Clock::now();
    ++state.in_flight;
    state.sent[index] = true;
    state.results[index].send_s = std::chrono::duration<double>(sent - state.start).count();
    state.results[index].send_unix_s =
        absl::ToDoubleSeconds(state.start_wall - absl::UnixEpoch()) + state.results[index].send_s;
    if (progress != nullptr) progress->Set(state.done, state.failed, state.in_flight);
    lock.unlock();
    const int target =
        preferred >= 0 ? preferred : static_cast<int>(next_target_++ % targets_.size());
    Launch(&state, index, PickTarget(target), 1, sent);
    lock.lock();
  }
  out.duration_s = std::chrono::duration<double>(state.last_end - state.start).count();
  for (size_t i = 0; i < state.prompts.size(); ++i) {
    if (state.sent[i]) out.requests.push_back(std::move(state.results[i]));
  }
  out.prompts = std::move(state.prompts);
  return out;
}

}  // namespace treespec::loadgen
