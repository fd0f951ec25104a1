#!/usr/bin/env bash
# bench-transport.sh — the UCX data-plane layer (zps-bench transport-raw) and the real server
# path (zps-bench transport: shard server + worker Client) beside ucx_perftest, on the same
# transport, in the same run, on loopback. Prints JSON lines for all three and, per
# (bench, op, size), the ratio to the best ucx_perftest figure (ucp_am_bw, tag_bw, ucp_get) at
# that size.
#
#   scripts/bench-transport.sh                       # tcp and shm, 4/16/64 MiB
#   scripts/bench-transport.sh --tls shm --sizes 4MiB --reps 3
#   BUILD_DIR=build-ucx scripts/bench-transport.sh --port 13500
#
# Options: --tls tcp|shm|both (default both), --sizes LIST (default 4MiB,16MiB,64MiB),
# --benches LIST (transport-raw, transport or both, default both), --ops LIST (zps-bench
# transport's ops: fetch, push, push_shared; default all three),
# --reps N (interleaved rounds of ucx_perftest then zps-bench; medians; default 3), --port P (default 13370; the
# perftest server listens on 127.0.0.1:P), --window N (zps-bench operations in flight, default 2).
# Extra UCX_* variables in the environment apply to both programs. --base-args "ARGS" also runs
# zps-bench transport with ARGS in every round (e.g. "--in-process --push-mode am", the shape
# before the shard moved to its own process) and reports it as srv_<op>_base.
# The machines are shared and noisy: compare ratios from one run, not figures across runs.
set -euo pipefail

BUILD_DIR=${BUILD_DIR:-build}
BENCH="$BUILD_DIR/bin/zps-bench"
TLS=both
SIZES="4MiB,16MiB,64MiB"
REPS=3
PORT=13370
WINDOW=2
BENCHES=transport-raw,transport
BASE_ARGS=
OPS=fetch,push,push_shared
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tls) TLS=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --window) WINDOW=$2; shift 2 ;;
    --benches) BENCHES=$2; shift 2 ;;
    --base-args) BASE_ARGS=$2; shift 2 ;;
    --ops) OPS=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "bench-transport.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
command -v ucx_perftest >/dev/null || { echo "bench-transport.sh: ucx_perftest missing (Debian ucx-utils)" >&2; exit 1; }
[[ -x "$BENCH" ]] || { echo "bench-transport.sh: $BENCH missing; build zps-bench first" >&2; exit 1; }

to_bytes() {  # 4MiB -> 4194304
  local v=${1%iB}; v=${v%B}
  case "$v" in
    *K|*k) echo $(( ${v%?} * 1024 )) ;;
    *M|*m) echo $(( ${v%?} * 1048576 )) ;;
    *G|*g) echo $(( ${v%?} * 1073741824 )) ;;
    *) echo "$v" ;;
  esac
}

ucx_tls() { [[ $1 == shm ]] && echo "posix,cma,self" || echo "$1"; }

# One ucx_perftest run; prints MB/s (2^20 bytes) or nothing.
perftest_once() {
  local tls=$1 test=$2 size=$3 iters=$4 spid out
  UCX_TLS=$(ucx_tls "$tls") timeout 120 ucx_perftest -p "$PORT" >/dev/null 2>&1 &
  spid=$!
  sleep 0.4
  out=$(UCX_TLS=$(ucx_tls "$tls") timeout 120 ucx_perftest 127.0.0.1 -p "$PORT" -t "$test" \
        -s "$size" -n "$iters" -w $(( iters / 10 + 1 )) 2>&1 | awk '/^Final:/ {print $6}') || true
  wait "$spid" 2>/dev/null || true
  echo "$out"
}

RESULTS=$(mktemp)
trap 'rm -f "$RESULTS"' EXIT
IFS=',' read -r -a SIZE_LIST <<< "$SIZES"
case "$TLS" in both) TLS_LIST=(tcp shm) ;; *) TLS_LIST=("$TLS") ;; esac

# Rounds interleave ucx_perftest and zps-bench per size, so that load from other processes hits
# both alike; each zps-bench figure is divided by the best ucx_perftest figure of its own round.
for ((round = 0; round < REPS; round++)); do
  for tls in "${TLS_LIST[@]}"; do
    for s in "${SIZE_LIST[@]}"; do
      size=$(to_bytes "$s")
      iters=$(( 512 * 1048576 / size )); (( iters < 10 )) && iters=10
      for test in ucp_am_bw tag_bw ucp_get; do
        v=$(perftest_once "$tls" "$test" "$size" "$iters")
        [[ -z "$v" ]] && { echo "bench-transport.sh: ucx_perftest $test $tls $size failed" >&2; continue; }
        printf '{"bench":"ucx_perftest","round":%d,"test":"%s","tls":"%s","size_bytes":%s,"gb_per_s":%.3f}\n' \
          "$round" "$test" "$tls" "$size" "$(awk -v m="$v" 'BEGIN {print m * 1048576 / 1e9}')" | tee -a "$RESULTS"
      done
      if [[ ",$BENCHES," == *,transport-raw,* ]]; then
        "$BENCH" transport-raw --json --tls "$tls" --sizes "$s" --window "$WINDOW" --reps 1 \
            --bytes-per-rep 512MiB | sed "s/^{/{\"round\":$round,/" | tee -a "$RESULTS"
      fi
      if [[ ",$BENCHES," == *,transport,* ]]; then
        "$BENCH" transport --json --tls "$tls" --sizes "$s" --window "$WINDOW" --reps 1 \
            --bytes-per-rep 512MiB --ops "$OPS" | sed "s/^{/{\"round\":$round,/" | tee -a "$RESULTS"
        if [[ -n "$BASE_ARGS" ]]; then
          # shellcheck disable=SC2086  # BASE_ARGS is a list of flags
          "$BENCH" transport --json --tls "$tls" --sizes "$s" --window "$WINDOW" --reps 1 \
              --bytes-per-rep 512MiB --ops "$OPS" $BASE_ARGS |
            sed -e "s/^{/{\"round\":$round,/" -e 's/"op":"\([a-z_]*\)"/"op":"\1_base"/' |
            tee -a "$RESULTS"
        fi
      fi
    done
  done
done

python3 - "$RESULTS" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
best = {}
for r in rows:
    if r["bench"] == "ucx_perftest":
        k = (r["round"], r["tls"], r["size_bytes"])
        if r["gb_per_s"] > best.get(k, (0, ""))[0]:
            best[k] = (r["gb_per_s"], r["test"])
cases = {}
for r in rows:
    if r["bench"] not in ("transport-raw", "transport"):
        continue
    b, t = best.get((r["round"], r["tls"], r["size_bytes"]), (0, "-"))
    if b:
        op = r["op"] if r["bench"] == "transport-raw" else "srv_" + r["op"]
        cases.setdefault((r["tls"], op, r["size_bytes"]), []).append((r["gb_per_s"], b, t))
print("\nmedians over %d round(s); ratio = zps / best ucx_perftest of the same round" %
      (1 + max([r["round"] for r in rows] or [0])))
print("(srv_* = zps-bench transport, through the shard server and worker Client)")
print("%-4s %-9s %10s %9s %20s %7s" % ("tls", "op", "size", "GB/s", "best perftest GB/s", "ratio"))
for (tls, op, size), v in cases.items():
    ours = statistics.median(x[0] for x in v)
    ref = statistics.median(x[1] for x in v)
    ratio = statistics.median(x[0] / x[1] for x in v)
    tests = sorted(set(x[2] for x in v))
    print("%-4s %-9s %10d %9.3f %12.3f %-7s %7.2f" % (tls, op, size, ours, ref, ",".join(tests), ratio))
    print(json.dumps({"bench": "transport-ratio", "tls": tls, "op": op, "size_bytes": size,
                      "gb_per_s": round(ours, 3), "perftest_best_gb_per_s": round(ref, 3),
                      "perftest_best_test": ",".join(tests), "ratio": round(ratio, 3),
                      "rounds": len(v)}))
EOF
