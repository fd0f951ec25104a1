#!/usr/bin/env bash
# Quantized gradients end to end: 2 zps-server shards (their /metrics scraped) x 2 zps-train
# workers, real processes on loopback (UCX tcp), five runs of the same job (fresh shards each):
#   H   server-sum, bf16 gradients          the 16-bit baseline
#   Q8  server-sum, --quantized-grads int8
#   Q4  server-sum, --quantized-grads int4
#   P4  pre-reduced (Gloo reduce-scatter, each rank pushes its slice), int4
#   P4b = P4 again                          determinism: the same bits (every chunk's CRC)
# and checks:
#   - P4 = P4b bit for bit (Q8 and Q4 against the in-process reference: bit_identity tests);
#   - shard ingress per step from the shards' zps_push_bytes_total (rank 0's fp32 initial values
#     taken out): int8 at most QUANT_MAX8 (default 0.52) and int4 at most QUANT_MAX4 (0.27) of
#     bf16's;
#   - every run trains: the held-out loss of Q8, Q4 and P4 falls by at least half as much as H's
#     (a few steps of a tiny model: a check that the gradients arrive, not of quality, which
#     scripts/bench-quality.sh measures).
# Usage: quantized_grads.sh BIN_DIR [extra zps-train flags...]
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
bin=$1
shift
world=2
shards=2
steps=${STEPS:-8}
model=(--steps "$steps" --d-model 64 --n-layers 2 --n-heads 2 --d-ff 256 --seq-len 32 --batch 4
       --chunk-elems 16384 --world-size "$world" --shards "$shards" --max-grad-norm 0.05
       --log-every 1 --ucx-tls tcp "$@")
work_init quantized-grads-test-token
metric() {  # port name -> value
  curl -sf "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n {printf "%.0f\n", $2}'
}

run() {  # name reduction [extra zps-train flags...]
  local name=$1 red=$2 dir="$work/$1"
  shift 2
  local more=("$@")
  mkdir -p "$dir"
  local cport=() mport=() spids=()
  for ((i = 0; i < shards; i++)); do cport[$i]=$(free_port); mport[$i]=$(free_port); done
  for ((i = 0; i < shards; i++)); do
    local args=(--ordinal "$i" --shards "$shards" --port "${cport[$i]}" --bind 127.0.0.1
                --token-file "$work/token" --metrics-port "${mport[$i]}"
                --ucx-tls tcp --threads 1)
    [[ $i -ne 0 ]] && args+=(--coordinator "127.0.0.1:${cport[0]}")
    "$bin/zps-server" "${args[@]}" > "$dir/shard$i.log" 2>&1 &
    spids+=($!); pids+=($!)
  done
  local wpids=()
  for ((r = 0; r < world; r++)); do
    local extra=()
    [[ $r -eq 0 ]] && extra=(--print-crcs)
    "$bin/zps-train" --mode worker --endpoint "127.0.0.1:${cport[0]}" --token-file "$work/token" \
      --rank "$r" --reduction "$red" "${model[@]}" "${more[@]}" "${extra[@]}" \
      > "$dir/rank$r.out" 2>&1 &
    wpids+=($!); pids+=($!)
  done
  local failed=0
  for p in "${wpids[@]}"; do wait "$p" || failed=1; done
  if [[ $failed -ne 0 ]]; then
    dump_logs 20 "$dir"/*
    fail "run $name ($red ${more[*]}) failed"
  fi
  local push=0
  for ((i = 0; i < shards; i++)); do push=$((push + $(metric "${mport[$i]}" zps_push_bytes_total))); done
  for p in "${spids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  grep '^chunk_crc' "$dir/rank0.out" > "$dir/crc"
  echo "$push" > "$dir/push"
  echo "== $name ($red ${more[*]}): shard ingress $push B"
  grep -E '^(step|held-out|summary)' "$dir/rank0.out" | sed 's/^/   /'
}

run H server-sum --grad-dtype bf16
run Q8 server-sum --quantized-grads int8
run Q4 server-sum --quantized-grads int4
run P4 pre-reduced --quantized-grads int4
run P4b pre-reduced --quantized-grads int4

[[ $(wc -l < "$work/P4/crc") -ge 4 ]] || fail "expected CRCs of at least 4 chunks"
diff "$work/P4/crc" "$work/P4b/crc" > /dev/null || fail "pre-reduced int4 runs differ (not deterministic)"
echo "determinism: pre-reduced int4 P4 = P4b (every chunk's CRC)"

params=$(awk '/^rank 0: [0-9]+ parameters/ {print $3}' "$work/H/rank0.out")
[[ -n $params ]] || fail "no parameter count in rank 0's output"
python3 - "$params" "$steps" "$work" "${QUANT_MAX8:-0.52}" "${QUANT_MAX4:-0.27}" <<'PY' || fail "bytes or losses"
import re, sys
params, steps, work = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
max8, max4 = float(sys.argv[4]), float(sys.argv[5])
def per_step(name):  # shard ingress per step, rank 0's fp32 initial values taken out
    return (int(open(f"{work}/{name}/push").read()) - params * 4) / steps
def held_out(name):  # (start, end)
    for line in open(f"{work}/{name}/rank0.out"):
        m = re.match(r"held-out loss (\S+) -> (\S+)", line)
        if m: return float(m.group(1)), float(m.group(2))
    raise SystemExit(f"{name}: no held-out loss")
h = per_step("H")
ok = True
for name, limit in (("Q8", max8), ("Q4", max4)):
    r = per_step(name) / h
    print(f"ingress per step: {name} {per_step(name):.0f} B = {r:.4f}x bf16's {h:.0f} B (limit {limit})")
    ok &= r <= limit
h0, h1 = held_out("H")
for name in ("Q8", "Q4", "P4"):
    q0, q1 = held_out(name)
    r = (q0 - q1) / (h0 - h1)
    print(f"held-out loss: {name} {q0:.4f} -> {q1:.4f}, bf16 {h0:.4f} -> {h1:.4f}: {r:.2f}x bf16's "
          "fall (at least 0.5)")
    ok &= r >= 0.5
sys.exit(0 if ok else 1)
PY
echo "PASS"
