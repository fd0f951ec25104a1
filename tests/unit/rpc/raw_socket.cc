#include "raw_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "zps/common/bytes.h"
#include "zps/common/rpc.h"

namespace zps::rpc::testing {

RawSocket::RawSocket(uint16_t port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

RawSocket::~RawSocket() {
  if (fd_ >= 0) ::close(fd_);
}

bool RawSocket::Send(std::span<const std::byte> bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

void RawSocket::ShutdownWrite() { ::shutdown(fd_, SHUT_WR); }

bool RawSocket::ReadExact(std::byte* p, size_t n, std::chrono::steady_clock::time_point deadline) {
  size_t off = 0;
  while (off < n) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd_, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    ssize_t got = ::recv(fd_, p + off, n - off, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    off += static_cast<size_t>(got);
  }
  return true;
}

std::optional<std::vector<std::byte>> RawSocket::ReadFrame(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::byte> f(kFrameHeaderBytes);
  if (!ReadExact(f.data(), kFrameHeaderBytes, deadline)) return std::nullopt;
  uint32_t len;
  std::memcpy(&len, f.data() + 16, 4);
  if (len > kMaxPayloadBytes) return std::nullopt;
  f.resize(kFrameHeaderBytes + len);
  if (len > 0 && !ReadExact(f.data() + kFrameHeaderBytes, len, deadline)) return std::nullopt;
  return f;
}

bool RawSocket::WaitClosed(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::byte buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd_, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return false;
    ssize_t got = ::recv(fd_, buf, sizeof(buf), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return true;  // EOF or reset
  }
}

std::vector<std::byte> HelloPayload(std::string_view token, uint16_t version,
                                    std::string_view name) {
  ByteWriter w;
  w.U16(version);
  w.U32(static_cast<uint32_t>(PeerRole::kTool));  // role
  w.U32(3);                                       // rank
  w.Str(name);
  w.Str(token);
  w.U32(0);  // empty extra blob
  return w.Take();
}

}  // namespace zps::rpc::testing
