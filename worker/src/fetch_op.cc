#include "zps/worker/fetch_op.h"

#include <algorithm>
#include <string>

#include "fetch_op_state.h"
#include "zps/worker/param_source.h"

namespace zps::worker {

Result<std::shared_ptr<const ParamBuffer>> FetchOp::Wait(std::chrono::milliseconds timeout) {
  MutexLock lock(&state_->mu);
  if (!state_->cv.WaitFor(lock, timeout,
                          [&]() REQUIRES(state_->mu) { return state_->remaining == 0; })) {
    std::vector<uint32_t> who = state_->waiting;
    std::sort(who.begin(), who.end());
    who.erase(std::unique(who.begin(), who.end()), who.end());
    std::string by;
    for (uint32_t w : who) by += (by.empty() ? "" : ", ") + std::to_string(w);
    return DeadlineExceeded("fetch of parameter " + std::to_string(state_->buffer->param) +
                            " not answered by shard" + (who.size() == 1 ? " " : "s ") + by +
                            " within " + std::to_string(timeout.count()) + " ms");
  }
  if (!state_->error.ok()) return state_->error;
  state_->buffer->version = state_->version;
  return std::shared_ptr<const ParamBuffer>(state_->buffer);
}

bool FetchOp::done() const {
  MutexLock lock(&state_->mu);
  return state_->remaining == 0;
}

FetchPromise::FetchPromise(uint32_t param) : state_(std::make_shared<FetchOp::State>()) {
  state_->buffer = std::make_shared<ParamBuffer>();
  state_->buffer->param = param;
  MutexLock lock(&state_->mu);
  state_->remaining = 1;
}

// Both complete under the op's mutex in one go, so that of two racing calls only the first counts
// (Wait reads `buffer` under the same mutex).
void FetchPromise::Set(std::shared_ptr<ParamBuffer> buffer) {
  if (buffer == nullptr) return Fail(Internal("a fetch completed without a buffer"));
  {
    MutexLock lock(&state_->mu);
    if (state_->remaining == 0) return;
    state_->version = buffer->version;
    state_->buffer = std::move(buffer);
    state_->remaining = 0;
  }
  state_->cv.SignalAll();
}

void FetchPromise::Fail(const Status& error) {
  {
    MutexLock lock(&state_->mu);
    if (state_->remaining == 0) return;
    state_->error = error.ok() ? Internal("fetch failed with an OK status") : error;
    state_->remaining = 0;
  }
  state_->cv.SignalAll();
}

FetchOp ParamSource::FetchQuantizedAsync(uint32_t param, uint64_t, uint64_t, int64_t) {
  FetchPromise p(param);
  p.Fail(FailedPrecondition("this source serves no block-quantized copy"));
  return p.op();
}

}  // namespace zps::worker
