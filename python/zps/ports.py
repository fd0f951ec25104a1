"""Free loopback TCP ports for the servers an embedded cluster or a test starts.

A port is drawn at random from below the kernel's ephemeral range (ip_local_port_range, 32768
by default) and checked free by binding it. Binding port 0 instead would hand out an ephemeral
port, which every outgoing connection on the machine (UCX's tcp transport makes many) draws from
too, so it is often taken again in the moment between this check and the server's own bind
(seen as "bind 127.0.0.1:<port>: Address already in use" in tests run side by side).

    python3 -m zps.ports [N]     # prints N free ports (default 1), one per line
"""

import random
import socket
import sys

_LOWEST = 10000


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host="127.0.0.1", taken=()):
    """A port on `host` nobody listens on or is bound to now, not in `taken`; OSError if none is
    found (after 200 tries, then the kernel's choice is the fallback)."""
    high = _ephemeral_low() - 1
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(_LOWEST, high) if high > _LOWEST else 0
        if port in taken:
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


def free_ports(n, host="127.0.0.1"):
    """n distinct free ports."""
    ports = []
    while len(ports) < n:
        ports.append(free_port(host, taken=ports))
    return ports


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    print("\n".join(str(p) for p in free_ports(count)))
