// zps/common/pacer.h — spreads a long piece of background work over a time budget.
//
// A Pacer is made with the work's total (bytes, elements: any unit) and a budget in seconds.
// After doing part of the work the worker calls Wait(done): it returns once `done` of `total`
// is due, i.e. budget x done / total after the Pacer was made, so the work runs at an even rate
// instead of at full speed (the shard's background checkpoint writer: less of the write beside
// each training step). Hurry() makes every Wait, now and later, return at once: someone waits
// for the work to end.
//
// Thread-safety: Wait from one thread (the worker), Hurry from any thread.
#pragma once

#include <chrono>
#include <cstdint>

#include "zps/common/thread_annotations.h"

namespace zps {

class Pacer {
 public:
  /// A budget of 0 (or less), or a total of 0, never waits.
  Pacer(uint64_t total, double budget_seconds);
  Pacer(const Pacer&) = delete;
  Pacer& operator=(const Pacer&) = delete;

  /// Sleeps until `done` (capped at the total) is due, or until Hurry.
  void Wait(uint64_t done) EXCLUDES(mu_);
  /// Ends every wait, now and from now on.
  void Hurry() EXCLUDES(mu_);

 private:
  const std::chrono::steady_clock::time_point t0_;
  const uint64_t total_;
  const double budget_;
  Mutex mu_;
  CondVar cv_;
  bool hurry_ GUARDED_BY(mu_) = false;
};

}  // namespace zps
