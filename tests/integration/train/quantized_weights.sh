#!/usr/bin/env bash
# Quantized weights end to end: 2 zps-server shards (their /metrics scraped) x 2 zps-train
# workers, real processes on loopback (UCX tcp), three runs of the same job (fresh shards each):
#   B   bf16 serving copy, direct fetches        the 16-bit baseline
#   Q   --quantized-weights int8, direct
#   QB  --quantized-weights int8, bandwidth-centric (each rank fetches a slice, the ranks
#       all-gather the dequantized fp32 slices)
# and checks:
#   - shard egress per step from the shards' zps_fetch_bytes_total (the run's total over its
#     steps; every run fetches the same parameters the same number of times): Q at most
#     QUANT_MAXW (default 0.52) of B's;
#   - every run trains: the held-out loss of Q and QB falls by at least half as much as B's (a
#     few steps of a tiny model: a check that the weights arrive, not of quality).
# Q's bits against the in-process reference: integration.bit_identity.quantized_weights_int8.
# Usage: quantized_weights.sh BIN_DIR [extra zps-train flags...]
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
bin=$1
shift
world=2
shards=2
steps=${STEPS:-5}
# zps-train's default model shape: a smaller one has so many parameters of 64 to 256 elements,
# each fetched as whole 256-element blocks, that its int8 egress is 0.527x of bf16's (measured
# with d_model 64, 2 layers); at this shape it is the format's 1 + 4/256 bytes an element.
model=(--steps "$steps" --d-model 128 --n-layers 4 --n-heads 4 --d-ff 512 --seq-len 32 --batch 4
       --chunk-elems 262144 --world-size "$world" --shards "$shards" --max-grad-norm 0.05
       --log-every 1 --ucx-tls tcp "$@")
work_init quantized-weights-test-token
metric() {  # port name -> value
  curl -sf "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n {printf "%.0f\n", $2}'
}

run() {  # name [extra zps-train flags...]
  local name=$1 dir="$work/$1"
  shift
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
    "$bin/zps-train" --mode worker --endpoint "127.0.0.1:${cport[0]}" --token-file "$work/token" \
      --rank "$r" "${model[@]}" "${more[@]}" > "$dir/rank$r.out" 2>&1 &
    wpids+=($!); pids+=($!)
  done
  local failed=0
  for p in "${wpids[@]}"; do wait "$p" || failed=1; done
  if [[ $failed -ne 0 ]]; then
    dump_logs 20 "$dir"/*
    fail "run $name (${more[*]}) failed"
  fi
  local fetch=0
  for ((i = 0; i < shards; i++)); do fetch=$((fetch + $(metric "${mport[$i]}" zps_fetch_bytes_total))); done
  for p in "${spids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  echo "$fetch" > "$dir/fetch"
  echo "== $name (${more[*]}): shard egress $fetch B"
  grep -E '^(held-out|summary)' "$dir/rank0.out" | sed 's/^/   /'
}

run B
run Q --quantized-weights int8
run QB --quantized-weights int8 --fetch-strategy bandwidth-centric

python3 - "$steps" "$work" "${QUANT_MAXW:-0.52}" <<'PY' || fail "bytes or losses"
import re, sys
steps, work, limit = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
def per_step(name):
    return int(open(f"{work}/{name}/fetch").read()) / steps
def held_out(name):  # (start, end)
    for line in open(f"{work}/{name}/rank0.out"):
        m = re.match(r"held-out loss (\S+) -> (\S+)", line)
        if m: return float(m.group(1)), float(m.group(2))
    raise SystemExit(f"{name}: no held-out loss")
b = per_step("B")
ok = True
for name in ("Q", "QB"):
    r = per_step(name) / b
    print(f"egress per step: {name} {per_step(name):.0f} B = {r:.4f}x bf16's {b:.0f} B"
          + (f" (limit {limit})" if name == "Q" else ""))
    if name == "Q":
        ok &= r <= limit
h0, h1 = held_out("B")
for name in ("Q", "QB"):
    q0, q1 = held_out(name)
    r = (q0 - q1) / (h0 - h1)
    print(f"held-out loss: {name} {q0:.4f} -> {q1:.4f}, bf16 {h0:.4f} -> {h1:.4f}: {r:.2f}x bf16's "
          "fall (at least 0.5)")
    ok &= r >= 0.5
sys.exit(0 if ok else 1)
PY
echo "PASS"
