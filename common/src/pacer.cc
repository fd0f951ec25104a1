#include "zps/common/pacer.h"

#include <algorithm>

namespace zps {

using Clock = std::chrono::steady_clock;

Pacer::Pacer(uint64_t total, double budget_seconds)
    : t0_(Clock::now()), total_(total), budget_(budget_seconds) {}

void Pacer::Wait(uint64_t done) {
  if (budget_ <= 0.0 || total_ == 0) return;
  const double share = static_cast<double>(std::min(done, total_)) / static_cast<double>(total_);
  const auto due = t0_ + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(budget_ * share));
  MutexLock lock(&mu_);
  cv_.WaitUntil(lock, due, [&]() REQUIRES(mu_) { return hurry_; });
}

void Pacer::Hurry() {
  {
    MutexLock lock(&mu_);
    hurry_ = true;
  }
  cv_.SignalAll();
}

}  // namespace zps
