// Helpers shared by the UCX tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "zps/common/crc32c.h"
#include "zps/common/status.h"

namespace zps::ucx::testing {

constexpr auto kTimeout = std::chrono::seconds(10);

/// Counts completions and remembers their statuses; waits with a deadline.
class Completions {
 public:
  std::function<void(Status)> Callback() {
    return [this](Status s) {
      std::lock_guard<std::mutex> lock(mu_);
      statuses_.push_back(std::move(s));
      cv_.notify_all();
    };
  }
  /// True if at least n completions arrived before the timeout.
  bool WaitFor(size_t n, std::chrono::milliseconds timeout = kTimeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return statuses_.size() >= n; });
  }
  std::vector<Status> statuses() {
    std::lock_guard<std::mutex> lock(mu_);
    return statuses_;
  }
  size_t ok_count() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (auto& s : statuses_) n += s.ok() ? 1 : 0;
    return n;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Status> statuses_;
};

inline std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::vector<std::byte> out(n);
  std::mt19937 rng(seed);
  for (auto& b : out) b = std::byte(rng() & 0xff);
  return out;
}

/// Message header of the tests: CRC32C of the payload and a sequence number.
struct TestHeader {
  uint32_t crc = 0;
  uint32_t seq = 0;
  uint64_t length = 0;
};

inline std::vector<std::byte> MakeHeader(std::span<const std::byte> payload, uint32_t seq) {
  TestHeader h{Crc32c(payload), seq, payload.size()};
  std::vector<std::byte> out(sizeof(h));
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

inline TestHeader ParseHeader(std::span<const std::byte> bytes) {
  TestHeader h;
  if (bytes.size() == sizeof(h)) std::memcpy(&h, bytes.data(), sizeof(h));
  return h;
}

inline std::string Hex(std::span<const std::byte> bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (std::byte b : bytes) {
    out.push_back(kDigits[static_cast<unsigned>(b) >> 4]);
    out.push_back(kDigits[static_cast<unsigned>(b) & 15]);
  }
  return out;
}

inline std::vector<std::byte> Unhex(std::string_view hex) {
  auto nibble = [](char c) -> unsigned {
    return c >= 'a' ? static_cast<unsigned>(c - 'a' + 10) : static_cast<unsigned>(c - '0');
  };
  std::vector<std::byte> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = std::byte((nibble(hex[2 * i]) << 4) | nibble(hex[2 * i + 1]));
  }
  return out;
}

}  // namespace zps::ucx::testing
