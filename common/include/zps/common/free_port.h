// zps/common/free_port.h — free loopback TCP ports for the servers a launcher or a test starts.
//
// A port is drawn at random from [10000, the kernel's ephemeral range's low end)
// (/proc/sys/net/ipv4/ip_local_port_range, 32768 by default) and checked free by binding it.
// Binding port 0 instead would hand out an ephemeral port, which every outgoing connection on the
// machine (UCX's tcp transport makes many) draws from too, so it is often taken again in the
// moment between this check and the server's own bind.
//
// A port handed out is also free to be handed out again until its server binds it. So every port
// handed out is written down with the time in a file per user, `$TMPDIR/zps-ports-<uid>` (TMPDIR
// unset: /tmp), locked with flock(2) while it is read and written, and is not handed out again,
// by any process, for kPortReserveSeconds. python/zps/ports.py keeps the same file in the same
// format (a line "<port> <unix time in seconds>" for each port), so C++ and Python launchers
// running side by side do not hand out each other's ports. Where the file cannot be used, the
// draw goes on without it; a process never hands out one port twice either way.
//
// Thread-safety: thread-safe (the draws of one process are serialised).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "zps/common/status.h"

namespace zps {

/// How long a port handed out stays reserved, in seconds (python/zps/ports.py's RESERVE_S).
inline constexpr int kPortReserveSeconds = 600;

/// A loopback port that nothing is bound to now, not in `taken`, and not handed out (by this
/// function or python/zps/ports.py) in the last kPortReserveSeconds. After 200 draws that find
/// none, the kernel's choice (port 0). Errors: IoError when no socket can be bound at all.
Result<uint16_t> FreeLoopbackPort(std::span<const uint16_t> taken = {});

/// `n` distinct ports, as FreeLoopbackPort. Errors: as FreeLoopbackPort.
Result<std::vector<uint16_t>> FreeLoopbackPorts(size_t n);

}  // namespace zps
