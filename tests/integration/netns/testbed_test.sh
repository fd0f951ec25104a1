#!/usr/bin/env bash
# The slow-network testbed (testbed.sh, which scripts/bench-network.sh runs zps-train on):
#   link    a host's link limited with tc to 50 Mbit/s carries a TCP transfer at
#           under 3x that rate (the limit is in force; the bound is wide because a loaded
#           2-core machine may be slow but is never faster than the limit), while the same
#           transfer unlimited goes at least twice as fast as the limited one (so the limit,
#           not the machine, is what held it).
#   job     2 shards and 2 workers, each host's link limited to 1 Gbit/s, train a small job to
#           the end, bit-identical to the in-process reference, and the shards count its bytes.
# Creates and removes its namespaces; exits 77 (skipped) where they cannot be made.
# Usage: testbed_test.sh BIN_DIR
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
# shellcheck source=SCRIPTDIR/testbed.sh
source "$(dirname "${BASH_SOURCE[0]}")/testbed.sh"
bin=$(cd "$1" && pwd)
model=(--steps 8 --d-model 32 --n-layers 2 --n-heads 2 --d-ff 64 --seq-len 32 --batch 4
       --chunk-elems 8192 --world-size 2 --shards 2)
rate=50
bytes=$((12500 * 1000))  # 2 s at the limit

work_init testbed-test-token
testbed_init
for h in s0 s1 w; do testbed_host "$h"; done
testbed_wait_reachable w s0

read -r got_free secs_free <<< "$(testbed_transfer w s0 "$bytes")" || fail "unlimited transfer"
testbed_shape s0 "$rate" || fail "tc refused a ${rate} Mbit/s tbf"
read -r got secs <<< "$(testbed_transfer w s0 "$bytes")" || fail "limited transfer"
[[ $got -eq $bytes && $got_free -eq $bytes ]] || fail "received $got / $got_free of $bytes bytes"
python3 - "$rate" "$bytes" "$secs" "$secs_free" <<'PY' || fail "the link limit is not in force"
import sys
rate, n, secs, secs_free = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
limited = n * 8 / secs / 1e6
free = n * 8 / secs_free / 1e6
print(f"link: limited to {rate} Mbit/s: {limited:.0f} Mbit/s; unlimited: {free:.0f} Mbit/s")
ok = limited < 3 * rate and free >= 2 * limited
sys.exit(0 if ok else 1)
PY
echo "PASS link"

reference_crcs "${model[@]}"
for h in s0 s1 w; do testbed_shape "$h" 1000 0.1 || fail "tc refused a 1 Gbit/s tbf"; done
mport=9090
sp=()
for i in 0 1; do
  args=(--ordinal "$i" --shards 2 --port 7070 --bind "${tb_addr[s$i]}"
        --advertise-host "${tb_addr[s$i]}" --token-file "$work/token" --metrics-port "$mport"
        --ucx-tls tcp --step-timeout 60 --threads 1)
  [[ $i -ne 0 ]] && args+=(--coordinator "${tb_addr[s0]}:7070")
  ip netns exec "${tb_ns[s$i]}" "$bin/zps-server" "${args[@]}" > "$work/shard$i.log" 2>&1 &
  sp+=($!); pids+=($!)
done
w=()
for r in 0 1; do
  ip netns exec "${tb_ns[w]}" "$bin/zps-train" --mode worker --endpoint "${tb_addr[s0]}:7070" \
    --token-file "$work/token" --rank "$r" "${model[@]}" --ucx-tls tcp --op-timeout 60 \
    --print-crcs > "$work/worker$r.out" 2> "$work/worker$r.err" &
  w+=($!); pids+=($!)
done
if ! join_pids 180 "${w[@]}"; then
  dump_logs 12 "$work"/worker0.err "$work"/worker1.err "$work"/shard0.log "$work"/shard1.log
  fail "the job did not train on the testbed"
fi
grep '^chunk_crc' "$work/worker0.out" > "$work/dist.crc" || true
if ! diff -q "$work/ref.crc" "$work/dist.crc" > /dev/null; then
  diff "$work/ref.crc" "$work/dist.crc" | head -5
  fail "the job on the testbed is not bit-identical to the reference"
fi
pushed=0
for i in 0 1; do
  n=$(testbed_exec "s$i" python3 -c '
import sys, urllib.request
text = urllib.request.urlopen(f"http://{sys.argv[1]}:{sys.argv[2]}/metrics", timeout=10).read()
for line in text.decode().splitlines():
    if line.startswith("zps_push_bytes_total "): print(int(float(line.split()[1])))
' "${tb_addr[s$i]}" "$mport")
  [[ -n $n && $n -gt 0 ]] || fail "shard $i counted no pushed bytes"
  pushed=$((pushed + n))
done
kill -TERM "${sp[@]}" 2>/dev/null || true
join_pids 30 "${sp[@]}" || true
echo "PASS job: $(wc -l < "$work/dist.crc") chunks bit-identical; shards received $pushed bytes"
echo "PASS: the slow-network testbed"
