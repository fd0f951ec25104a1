// Test helper: a blocking POSIX TCP client that sends arbitrary bytes, for feeding the rpc server
// input that the real Client would never produce.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zps/common/frame.h"

namespace zps::rpc::testing {

class RawSocket {
 public:
  /// Connects to 127.0.0.1:port; fd() < 0 on failure.
  explicit RawSocket(uint16_t port);
  ~RawSocket();
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  int fd() const { return fd_; }
  bool Send(std::span<const std::byte> bytes);
  bool Send(const std::vector<std::byte>& bytes) { return Send(std::span<const std::byte>(bytes)); }
  /// Half-closes the sending side (the server sees EOF).
  void ShutdownWrite();

  /// Reads one whole frame within `timeout`; nullopt on EOF, reset or timeout.
  std::optional<std::vector<std::byte>> ReadFrame(std::chrono::milliseconds timeout);
  /// True if the peer closed the connection (EOF or reset) within `timeout`; bytes that arrive
  /// before the close are discarded.
  bool WaitClosed(std::chrono::milliseconds timeout);

 private:
  /// Reads exactly n bytes; false on EOF/reset/timeout.
  bool ReadExact(std::byte* p, size_t n, std::chrono::steady_clock::time_point deadline);
  int fd_ = -1;
};

/// Hello payload exactly as docs/protocol.md specifies it, built independently of the library.
std::vector<std::byte> HelloPayload(std::string_view token, uint16_t version = kProtocolVersion,
                                    std::string_view name = "raw");

}  // namespace zps::rpc::testing
