// Free loopback ports and their reservation file (zps/common/free_port.h).
#include "zps/common/free_port.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include "zps/common/scoped_fd.h"

namespace zps {
namespace {

constexpr int kLowest = 10000;
constexpr int kDraws = 200;

int EphemeralLow() {
  int low = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &low) != 1) low = 32768;
    std::fclose(f);
  }
  return low;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The reservation file, locked for the object's life: the ports handed out in the last
// kPortReserveSeconds (held), written back by Save. Not usable (no file, no lock): held is
// empty and Save does nothing.
class Reservations {
 public:
  Reservations() {
    const char* tmp = std::getenv("TMPDIR");
    const std::string path = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                             "/zps-ports-" + std::to_string(::getuid());
    fd_ = ScopedFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!fd_.valid()) return;
    if (::flock(fd_.get(), LOCK_EX) != 0) {
      fd_ = ScopedFd();  // unusable: closed
      return;
    }
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd_.get(), buf, sizeof(buf))) > 0;) text.append(buf, n);
    const double now = Now();
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      int port = 0;
      double when = 0;
      // A line cut short is dropped.
      if (std::sscanf(line.c_str(), "%d %lf", &port, &when) == 2 &&
          now - when < kPortReserveSeconds && port > 0 && port < 65536) {
        held[static_cast<uint16_t>(port)] = when;
      }
    }
  }
  Reservations(const Reservations&) = delete;
  Reservations& operator=(const Reservations&) = delete;

  void Save() {
    if (!fd_.valid()) return;
    std::string text;
    char line[64];
    for (const auto& [port, when] : held) {
      std::snprintf(line, sizeof(line), "%d %.3f\n", port, when);
      text += line;
    }
    if (::lseek(fd_.get(), 0, SEEK_SET) != 0 || ::ftruncate(fd_.get(), 0) != 0) return;
    (void)!::write(fd_.get(), text.data(), text.size());  // lost: the next draw goes without it
  }

  bool usable() const { return fd_.valid(); }

  std::map<uint16_t, double> held;

 private:
  ScopedFd fd_;  // closing it releases the lock
};

// Binds 127.0.0.1:port (0: the kernel's choice); the port bound, or 0 if it was taken.
Result<uint16_t> TryBind(uint16_t port) {
  ScopedFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket", errno);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  socklen_t len = sizeof(a);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    if (port == 0) return ErrnoError("bind 127.0.0.1:0", errno);
    return uint16_t{0};
  }
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return ErrnoError("getsockname", errno);
  }
  return ntohs(a.sin_port);
}

std::mutex g_mu;
std::set<uint16_t> g_handed_out;  // by this process, under g_mu (used without the file)

}  // namespace

Result<uint16_t> FreeLoopbackPort(std::span<const uint16_t> taken) {
  std::lock_guard<std::mutex> lock(g_mu);
  Reservations reserved;
  // The file holds every port handed out lately, by this process too; without it, this
  // process's own record does.
  auto avoid = [&](uint16_t p) {
    return std::find(taken.begin(), taken.end(), p) != taken.end() ||
           (reserved.usable() ? reserved.held.count(p) : g_handed_out.count(p)) != 0;
  };
  const int high = EphemeralLow() - 1;
  std::random_device rd;
  std::uniform_int_distribution<int> pick(kLowest, std::max(kLowest, high));
  uint16_t port = 0;
  for (int draw = 0; draw < kDraws && port == 0 && high > kLowest; ++draw) {
    const auto want = static_cast<uint16_t>(pick(rd));
    if (avoid(want)) continue;
    ZPS_ASSIGN_OR_RETURN(port, TryBind(want));
  }
  if (port == 0) {
    ZPS_ASSIGN_OR_RETURN(port, TryBind(0));
  }
  g_handed_out.insert(port);
  reserved.held[port] = Now();
  reserved.Save();
  return port;
}

Result<std::vector<uint16_t>> FreeLoopbackPorts(size_t n) {
  std::vector<uint16_t> ports;
  while (ports.size() < n) {
    ZPS_ASSIGN_OR_RETURN(uint16_t p, FreeLoopbackPort(ports));
    ports.push_back(p);
  }
  return ports;
}

}  // namespace zps
