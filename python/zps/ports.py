"""Free loopback TCP ports for the servers an embedded cluster or a test starts.

A port is drawn at random from below the kernel's ephemeral range (ip_local_port_range, 32768
by default) and checked free by binding it. Binding port 0 instead would hand out an ephemeral
port, which every outgoing connection on the machine (UCX's tcp transport makes many) draws from
too, so it is often taken again in the moment between this check and the server's own bind
(seen as "bind 127.0.0.1:<port>: Address already in use" in tests run side by side).

A port handed out is also free to be handed out again until its server binds it, and a job's
ports are often drawn one call at a time (a test script runs `python3 -m zps.ports` once per
port). So every port handed out is written down with the time, in a file per user in the
temporary directory (locked while it is read and written), and is not handed out again, by any
process, for RESERVE_S seconds: without that, a shard's RPC port could be drawn again as the
other shard's /metrics port, and whichever bound it first made the other fail. Where the file
cannot be used, the draw goes on without it. The C++ launchers (zps-train's local mode, the C++
tests) draw their ports the same way through the same file (zps/common/free_port.h), so the
format of its lines, "<port> <unix time>", is shared.

    python3 -m zps.ports [N]     # prints N free ports (default 1), one per line
"""

import contextlib
import fcntl
import os
import random
import socket
import sys
import tempfile
import time

_LOWEST = 10000
RESERVE_S = 600


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _reservations_path():
    return os.path.join(tempfile.gettempdir(), "zps-ports-%d" % os.getuid())


@contextlib.contextmanager
def _reservations():
    """Yields the dict {port: time handed out} of the last RESERVE_S seconds, locked against
    other processes, and writes it back on exit; yields a dict that is not kept where the file
    cannot be opened or locked."""
    try:
        fd = os.open(_reservations_path(), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield {}
        return
    with os.fdopen(fd, "r+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError:
            yield {}
            return
        now = time.time()
        held = {}
        for line in f.read().splitlines():
            try:
                port, when = line.split()
                if now - float(when) < RESERVE_S:
                    held[int(port)] = float(when)
            except ValueError:
                continue  # a line cut short: dropped
        yield held
        f.seek(0)
        f.truncate()
        f.write("".join("%d %.3f\n" % (p, t) for p, t in sorted(held.items())))


def _draw(host, avoid):
    high = _ephemeral_low() - 1
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(_LOWEST, high) if high > _LOWEST else 0
        if port in avoid:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return s.getsockname()[1]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port(host="127.0.0.1", taken=()):
    """A port on `host` nobody listens on or is bound to now, not in `taken` and not handed out
    by this module in the last RESERVE_S seconds; OSError if none is found (after 200 tries, then
    the kernel's choice is the fallback)."""
    with _reservations() as held:
        port = _draw(host, set(taken) | set(held))
        held[port] = time.time()
        return port


def free_ports(n, host="127.0.0.1"):
    """n distinct free ports."""
    ports = []
    while len(ports) < n:
        ports.append(free_port(host, taken=ports))
    return ports


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    print("\n".join(str(p) for p in free_ports(count)))
