// zps/common/log_rate_limit.h — bounds how many log records of one kind a peer can cause.
//
//   LogRateLimit limit(10, std::chrono::seconds(1));
//   uint64_t held_back = 0;
//   if (limit.Allow(&held_back)) {
//     ZPS_LOG(WARNING) << "closing connection: " << why << " (" << held_back << " not logged)";
//   }
//
// A flood of malformed frames would otherwise write one line per frame (docs/operations.md,
// "Faults: what an operator sees"); the metric that counts them (zps_protocol_errors_total) still
// counts every one.
//
// Thread-safety: Allow may be called from any thread (one mutex; not for hot paths).
#pragma once

#include <chrono>
#include <cstdint>

#include "zps/common/thread_annotations.h"

namespace zps::log {

class LogRateLimit {
 public:
  using Clock = std::chrono::steady_clock;
  /// At most `burst` records per `window` (burst >= 1; a window <= 0 lets everything through).
  LogRateLimit(int burst, Clock::duration window)
      : burst_(burst < 1 ? 1 : burst), window_(window) {}

  /// True if a record may be written at `now`. Then *held_back is the number of records refused
  /// since the last one allowed (the caller says so in the record); otherwise it is not set.
  bool Allow(uint64_t* held_back, Clock::time_point now = Clock::now()) {
    MutexLock lock(&mu_);
    if (window_ <= Clock::duration::zero()) {
      *held_back = 0;
      return true;
    }
    if (!started_ || now - window_start_ >= window_) {
      started_ = true;
      window_start_ = now;
      in_window_ = 0;
    }
    if (in_window_ >= burst_) {
      ++held_back_;
      return false;
    }
    ++in_window_;
    *held_back = held_back_;
    held_back_ = 0;
    return true;
  }

 private:
  const int burst_;
  const Clock::duration window_;
  Mutex mu_;
  bool started_ GUARDED_BY(mu_) = false;
  Clock::time_point window_start_ GUARDED_BY(mu_);
  int in_window_ GUARDED_BY(mu_) = 0;
  uint64_t held_back_ GUARDED_BY(mu_) = 0;
};

}  // namespace zps::log
