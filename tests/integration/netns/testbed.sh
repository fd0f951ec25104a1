# shellcheck shell=bash
# Hosts in network namespaces joined through a bridge, with optional per-host link limits: the
# setup shared by netns.sh (partitions), testbed_test.sh and scripts/bench-network.sh. Sourced
# after ../lib.sh (it registers its cleanup with on_cleanup), never executed:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
#   source "$(dirname "${BASH_SOURCE[0]}")/testbed.sh"
#   work_init
#   testbed_init                     # exits 77 where namespaces cannot be made
#   testbed_host s0; testbed_host w0
#   testbed_shape s0 1000 0.1        # 1 Gbit/s each way, 0.1 ms delay (where netem exists)
#   testbed_wait_reachable w0 s0
#   ip netns exec "${tb_ns[s0]}" "$bin/zps-server" --bind "${tb_addr[s0]}" ... &
#   pids+=($!)
#
# Layout: a "switch" namespace holds a bridge (br0); each host is a namespace with one veth,
# "eth0" on its side (10.<net>.0.<n>/24) and "<tag><host>p" on the bridge. The host's own
# network is not touched. Every name carries a per-process tag, so parallel runs do not meet.
#
# A link limit is a tbf qdisc (token bucket) on both ends of the host's veth: eth0's egress
# limits what the host sends, the bridge port's egress what it receives, so each host has RATE
# each way, as a NIC would. A delay is a netem qdisc under the tbf; kernels without sch_netem
# (some VM kernels) get the rate alone and testbed_shape says so on stderr.
#
# Variables set: tb_tag (name prefix), tb_net (the /24's second octet), tb_sw (the switch
# namespace), tb_addr[HOST] (the host's address), tb_ns[HOST] (its namespace: start a program
# whose pid you keep with `ip netns exec "${tb_ns[HOST]}" PROGRAM &`, so that $! is the
# program's own pid; a shell function sent to the background is a subshell, and killing that
# would leave the program running), tb_hosts (in order of creation),
# tb_delay_applied (1 once a delay was put in force, else 0).
#
# Functions:
#   testbed_init
#       Probes that namespaces can be made (else prints "SKIP: ..." and exits 77), makes the
#       switch and registers testbed_delete with on_cleanup.
#   testbed_host NAME
#       Makes host NAME (next address in the /24), its veth and its bridge port, all up.
#   testbed_shape NAME RATE_MBIT [DELAY_MS]
#       Limits NAME's link to RATE_MBIT Mbit/s each way (replacing an earlier limit), with
#       DELAY_MS of delay each way where the kernel has netem. Returns 1 if tc refuses the rate.
#   testbed_unshape NAME
#       Removes NAME's limit.
#   testbed_cut NAME / testbed_restore NAME
#       Takes NAME's bridge port down / up (a partition of that host).
#   testbed_exec NAME CMD...
#       Runs CMD in NAME's namespace (`ip netns exec`), in the foreground (see tb_ns).
#   testbed_wait_reachable FROM TO
#       Waits (up to about 4 s) until a TCP connect from FROM to TO succeeds; fails the test
#       (lib.sh `fail`) if it never does.
#   testbed_transfer FROM TO BYTES
#       Sends BYTES over one TCP connection from FROM to TO and prints "<bytes> <seconds>", the
#       receiver's count and the time from its accept to the last byte.
#   testbed_delete
#       Deletes every namespace made (the cleanup; safe to call twice).

tb_tag=z$(($$ % 100000))
tb_net=$((10 + $$ % 200))
tb_sw=${tb_tag}sw
tb_hosts=()
# shellcheck disable=SC2034  # tb_delay_applied is read by the callers
tb_delay_applied=0
tb_netem_warned=0
tb_made=()
declare -A tb_addr=() tb_ns=()

testbed_delete() {
  local n
  for n in "${tb_made[@]}"; do ip netns del "$n" 2>/dev/null || true; done
  tb_made=()
}

tb_mkns() {
  ip netns add "$1" && tb_made+=("$1")
  ip -n "$1" link set lo up
}

testbed_init() {
  local err
  if ! err=$(ip netns add "${tb_tag}probe" 2>&1); then
    echo "SKIP: cannot create network namespaces here (${err}); run as root to test it"
    exit 77
  fi
  ip netns del "${tb_tag}probe"
  on_cleanup testbed_delete
  tb_mkns "$tb_sw"
  ip -n "$tb_sw" link add br0 type bridge
  ip -n "$tb_sw" link set br0 up
}

testbed_host() {  # name
  local h=$1 ns=${tb_tag}$1
  tb_hosts+=("$h")
  tb_addr[$h]=10.$tb_net.0.${#tb_hosts[@]}
  tb_ns[$h]=$ns
  tb_mkns "$ns"
  ip link add "$ns" type veth peer name "${ns}p"
  ip link set "$ns" netns "$ns"
  ip link set "${ns}p" netns "$tb_sw"
  ip -n "$ns" link set "$ns" name eth0
  ip -n "$ns" addr add "${tb_addr[$h]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$tb_sw" link set "${ns}p" master br0
  ip -n "$tb_sw" link set "${ns}p" up
}

# One end of a host's link: a tbf at `rate_mbit`, with a netem delay under it when asked for.
tb_shape_dev() {  # netns dev rate_mbit delay_ms
  local ns=$1 dev=$2 rate=$3 delay=$4
  # The bucket holds 4 ms of traffic (at least 256 KB: GSO hands the qdisc 64 KB packets) and
  # the queue 20 ms more, so TCP meets the rate rather than drops.
  local burst=$(( rate * 1000000 / 8 / 250 ))
  (( burst < 262144 )) && burst=262144
  tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
  tc -n "$ns" qdisc add dev "$dev" root handle 1: tbf rate "${rate}mbit" burst "$burst" \
    latency 20ms || return 1
  if [[ -n $delay && $delay != 0 ]]; then
    if tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: netem delay "${delay}ms" \
      2>/dev/null; then
      # shellcheck disable=SC2034  # read by the callers
      tb_delay_applied=1
    elif [[ $tb_netem_warned -eq 0 ]]; then
      tb_netem_warned=1
      echo "testbed: no netem qdisc in this kernel; the ${delay} ms delay is not applied" >&2
    fi
  fi
}

testbed_shape() {  # name rate_mbit [delay_ms]
  local ns=${tb_tag}$1
  tb_shape_dev "$ns" eth0 "$2" "${3:-}" && tb_shape_dev "$tb_sw" "${ns}p" "$2" "${3:-}"
}

testbed_unshape() {  # name
  local ns=${tb_tag}$1
  tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
  tc -n "$tb_sw" qdisc del dev "${ns}p" root 2>/dev/null || true
}

testbed_cut() { ip -n "$tb_sw" link set "${tb_tag}${1}p" down; }
testbed_restore() { ip -n "$tb_sw" link set "${tb_tag}${1}p" up; }

testbed_exec() {  # name cmd...
  local ns=${tb_tag}$1
  shift
  ip netns exec "$ns" "$@"
}

testbed_wait_reachable() {  # from to
  local port=7071 lp tries=0
  # (no ping installed): a listener in TO, a connect from FROM.
  ip netns exec "${tb_ns[$2]}" python3 -c '
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(10); s.accept()
' "${tb_addr[$2]}" "$port" &
  lp=$!
  until testbed_exec "$1" python3 -c '
import socket, sys
socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
' "${tb_addr[$2]}" "$port" 2> /dev/null; do
    tries=$((tries + 1))
    (( tries > 20 )) && fail "the namespaces cannot reach each other ($1 -> $2)"
    sleep 0.2
  done
  wait "$lp" || true
}

testbed_transfer() {  # from to bytes
  local port=7072 out
  out=$(mktemp)
  ip netns exec "${tb_ns[$2]}" python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(30)
c, _ = s.accept(); c.settimeout(120)
t0 = time.monotonic(); n = 0
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
print(n, time.monotonic() - t0)
' "${tb_addr[$2]}" "$port" > "$out" &
  local lp=$!
  local tries=0
  until testbed_exec "$1" python3 -c '
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
left = int(sys.argv[3]); buf = bytes(1 << 20)
while left > 0:
    k = min(left, len(buf)); c.sendall(buf[:k]); left -= k
c.close()
' "${tb_addr[$2]}" "$port" "$3" 2> /dev/null; do
    tries=$((tries + 1))
    (( tries > 20 )) && { kill "$lp" 2>/dev/null || true; rm -f "$out"; return 1; }
    sleep 0.2
  done
  wait "$lp" || true
  cat "$out"
  rm -f "$out"
}
