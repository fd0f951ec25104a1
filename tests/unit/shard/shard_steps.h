// shard_steps.h — how the ShardState tests drive a step from outside: a push through
// BeginPush/FinishPush, the wait for the speculation thread, a commit (gradients waited for,
// the step reduced, the order applied), and a fetch's outcome.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "zps/common/grad_quant.h"
#include "zps/server/shard_state.h"
#include "zps/testing/status_matchers.h"

namespace zps::server::testing {

/// One push of `data` (PushBytes(r.dtype, r.length) bytes) through BeginPush and FinishPush.
/// BeginPush's error as it is; INTERNAL where the ticket's destination is of another size.
inline Status Push(ShardState& s, const PushRequest& r, const void* data) {
  ZPS_ASSIGN_OR_RETURN(PushTicket t, s.BeginPush(r));
  if (t.destination().size() != PushBytes(r.dtype, r.length)) {
    return Internal("destination of " + std::to_string(t.destination().size()) + " bytes");
  }
  std::memcpy(t.destination().data(), data, t.destination().size());
  return s.FinishPush(std::move(t), Status::Ok());
}

/// Waits (10 s at most) until the speculation thread has speculated `n` chunks of the step in
/// progress.
inline void WaitSpeculated(const ShardState& s, uint32_t n) {
  using namespace std::chrono_literals;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (s.speculation_stats().in_flight < n && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(s.speculation_stats().in_flight, n);
}

/// Commits `order` as the coordinator would: waits for the step's gradients, reduces it, and
/// applies the order (with `next`, the following step's, for a speculating shard).
inline void Commit(ShardState& s, const CommitOrder& order, std::optional<CommitOrder> next) {
  using namespace std::chrono_literals;
  ASSERT_THAT(s.WaitForGradients(order.step, 1000ms), IsOk());
  ASSERT_THAT(s.ReduceStep(order.step), IsOk());
  ASSERT_THAT(s.ApplyCommit(order, next), IsOk());
}

/// A fetch's outcome, waited for (spilled copies and copies made on fetch are answered from the
/// serving reader thread).
struct FetchResult {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  int64_t version = -1;
  std::vector<std::byte> data;
  const std::byte* where = nullptr;
  std::shared_ptr<const void> owner;

  FetchCallback Callback(bool keep_owner = false) {
    return [this, keep_owner](const Status& s, int64_t v, std::span<const std::byte> d,
                              std::shared_ptr<const void> o) {
      std::lock_guard<std::mutex> lock(mu);
      status = s;
      version = v;
      data.assign(d.begin(), d.end());
      where = d.data();
      if (keep_owner) owner = std::move(o);
      done = true;
      cv.notify_all();
    };
  }
  // Waits for the answer (the bound only keeps a broken build from hanging; no timing asserted).
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; });
  }
  /// The i-th 16-bit word of the data.
  uint16_t Word(size_t i) const {
    uint16_t w = 0;
    std::memcpy(&w, data.data() + 2 * i, sizeof w);
    return w;
  }
  bool Done() {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }
};

}  // namespace zps::server::testing
