#!/usr/bin/env bash
# Worker collectives end to end: SHARDS zps-server shards (their /metrics scraped) x WORLD
# zps-train workers, real processes on loopback, Gloo over tcp, rendezvous through the
# coordinator's kv.
# Usage: [SHARDS=2] [RUNS=all] collectives.sh BIN_DIR WORLD [extra zps-train flags...]
#
# RUNS=scale (the 8 x 4 test) runs only A and B and checks, from them, ingress 1x vs WORLD x,
# egress 1x vs WORLD x and the agreement of the losses. RUNS=all (default), six runs of the same
# job (fresh shards each):
#   A  server-sum,  direct              the baseline
#   B  pre-reduced, bandwidth-centric   both collectives modes
#   C  = B again                        determinism: the same bits (every chunk's CRC)
#   D  pre-reduced, direct              the fetch strategy changes no value: CRCs of B
#   E  server-sum,  bandwidth-centric   CRCs of A
#   F  pre-reduced, direct, one reduce-scatter per parameter (--bucket-bytes 0; B-E use the
#      default 16 MiB buckets, one per step here): ingress 1x, losses as A's
# and checks, from the shards' zps_push_bytes_total / zps_fetch_bytes_total:
#   - ingress: pre-reduced pushes 1x the model per step (A: WORLD x), exactly
#     (params x 4 B x steps, plus rank 0's initial values);
#   - egress: bandwidth-centric fetches 1x per step, direct WORLD x (rank 0's two direct
#     evaluation passes taken out);
#   - server-sum and pre-reduced agree within a tolerance: every logged training loss and the
#     final held-out loss within 2e-3 (the summation order differs: rank order on the shard,
#     Gloo's halving-doubling among the workers).
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
bin=$1
world=$2
shift 2
shards=${SHARDS:-2}
runs=${RUNS:-all}
steps=${STEPS:-8}
model=(--steps "$steps" --d-model 32 --n-layers 2 --n-heads 2 --d-ff 64 --seq-len 32 --batch 4
       --chunk-elems 8192 --world-size "$world" --shards "$shards" --max-grad-norm 0.05
       --log-every 1 --ucx-tls tcp "$@")
work_init collectives-test-token
metric() {  # port name -> value
  curl -sf "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n {printf "%.0f\n", $2}'
}

run() {  # name reduction fetch-strategy [extra zps-train flags...]
  local name=$1 red=$2 fs=$3 dir="$work/$1"
  shift 3
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
      --rank "$r" --reduction "$red" --fetch-strategy "$fs" "${model[@]}" "${more[@]}" "${extra[@]}" \
      > "$dir/rank$r.out" 2>&1 &
    wpids+=($!); pids+=($!)
  done
  local failed=0
  for p in "${wpids[@]}"; do wait "$p" || failed=1; done
  if [[ $failed -ne 0 ]]; then
    dump_logs 20 "$dir"/*
    fail "run $name ($red, $fs) failed"
  fi
  local push=0 fetch=0
  for ((i = 0; i < shards; i++)); do
    push=$((push + $(metric "${mport[$i]}" zps_push_bytes_total)))
    fetch=$((fetch + $(metric "${mport[$i]}" zps_fetch_bytes_total)))
  done
  for p in "${spids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  grep '^chunk_crc' "$dir/rank0.out" > "$dir/crc"
  echo "$push" > "$dir/push"
  echo "$fetch" > "$dir/fetch"
  echo "== $name ($red, $fs, world $world, $shards shards): shard ingress $push B, egress $fetch B"
  grep -E '^(step|held-out|summary|prefetch)' "$dir/rank0.out" | sed 's/^/   /'
}

run A server-sum direct
run B pre-reduced bandwidth-centric
if [[ $runs == scale ]]; then
  params=$(awk '/^rank 0: [0-9]+ parameters/ {print $3}' "$work/A/rank0.out")
  [[ -n $params ]] || fail "no parameter count in rank 0's output"
  model_bytes=$((params * 4))
  want_pre=$((model_bytes * (steps + 1)))          # initial values + 1x per step
  want_sum=$((model_bytes * (world * steps + 1)))  # initial values + WORLD x per step
  [[ $(cat "$work/B/push") -eq $want_pre ]] || fail "pre-reduced ingress $(cat "$work/B/push") != $want_pre"
  [[ $(cat "$work/A/push") -eq $want_sum ]] || fail "server-sum ingress $(cat "$work/A/push") != $want_sum"
  echo "ingress per step: pre-reduced $((($(cat "$work/B/push") - model_bytes) / steps)) B (1x the" \
       "model's $model_bytes B), server-sum $((($(cat "$work/A/push") - model_bytes) / steps)) B ($world x)"
  eval_bytes=$((params * 2 * 2))  # rank 0's held-out evaluations at start and end (bf16, direct)
  direct=$(( $(cat "$work/A/fetch") - eval_bytes ))
  bw=$(( $(cat "$work/B/fetch") - eval_bytes ))
  python3 - "$direct" "$bw" "$world" "$params" "$steps" <<'PY' || fail "egress"
import sys
d, b, w, p, s = map(int, sys.argv[1:])
print(f"egress over training: direct {d} B, bandwidth-centric {b} B, ratio {d / b:.4f} (want {w}); "
      f"per step: {b / s / (p * 2):.3f}x and {d / s / (p * 2):.3f}x the bf16 model (with the prefetch "
      f"of step {s}, which the run never uses)")
sys.exit(0 if abs(d / b - w) < 1e-9 else 1)
PY
  python3 - "$work/A/rank0.out" "$work/B/rank0.out" <<'PY' || fail "server-sum and pre-reduced disagree"
import re, sys
def losses(path):
    out = []
    for line in open(path):
        m = re.match(r"step\s+\d+\s+loss (\S+)", line)
        if m: out.append(float(m.group(1)))
        m = re.match(r"held-out loss (\S+) -> (\S+)", line)
        if m: out += [float(m.group(1)), float(m.group(2))]
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == len(b) and a, (a, b)
worst = max(abs(x - y) for x, y in zip(a, b))
print(f"server-sum vs pre-reduced: {len(a)} losses, largest difference {worst:.2e} (tolerance 2e-3)")
sys.exit(0 if worst <= 2e-3 else 1)
PY
  echo "PASS"
  exit 0
fi
run C pre-reduced bandwidth-centric
run D pre-reduced direct
run E server-sum bandwidth-centric
run F pre-reduced direct --bucket-bytes 0

[[ $(wc -l < "$work/A/crc") -ge 4 ]] || fail "expected CRCs of at least 4 chunks"
diff "$work/B/crc" "$work/C/crc" > /dev/null || fail "pre-reduced runs B and C differ (not deterministic)"
diff "$work/B/crc" "$work/D/crc" > /dev/null || fail "bandwidth-centric (B) and direct (D) fetch differ"
diff "$work/A/crc" "$work/E/crc" > /dev/null || fail "bandwidth-centric (E) and direct (A) fetch differ"
echo "determinism: B = C, B = D, A = E (every chunk's CRC)"
if diff "$work/A/crc" "$work/B/crc" > /dev/null; then
  echo "server-sum (A) and pre-reduced (B) end bit-identical at world $world"
else
  echo "server-sum (A) and pre-reduced (B) differ in $(diff "$work/A/crc" "$work/B/crc" | grep -c '^<') chunks' bits at world $world (summation order)"
fi

params=$(awk '/^rank 0: [0-9]+ parameters/ {print $3}' "$work/A/rank0.out")
[[ -n $params ]] || fail "no parameter count in rank 0's output"
model_bytes=$((params * 4))
want_pre=$((model_bytes * (steps + 1)))          # initial values + 1x per step
want_sum=$((model_bytes * (world * steps + 1)))  # initial values + WORLD x per step
[[ $(cat "$work/D/push") -eq $want_pre ]] || fail "pre-reduced ingress $(cat "$work/D/push") != $want_pre"
[[ $(cat "$work/F/push") -eq $want_pre ]] || fail "pre-reduced (per parameter) ingress $(cat "$work/F/push") != $want_pre"
[[ $(cat "$work/A/push") -eq $want_sum ]] || fail "server-sum ingress $(cat "$work/A/push") != $want_sum"
echo "ingress per step: pre-reduced $((($(cat "$work/D/push") - model_bytes) / steps)) B (1x the" \
     "model's $model_bytes B), server-sum $((($(cat "$work/A/push") - model_bytes) / steps)) B"

eval_bytes=$((params * 2 * 2))  # rank 0's held-out evaluations at start and end (bf16, direct)
direct=$(( $(cat "$work/A/fetch") - eval_bytes ))
bw=$(( $(cat "$work/E/fetch") - eval_bytes ))
python3 - "$direct" "$bw" "$world" <<'PY' || fail "egress ratio"
import sys
d, b, w = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ratio = d / b
print(f"egress over training: direct {d} B, bandwidth-centric {b} B, ratio {ratio:.4f} (want {w})")
sys.exit(0 if abs(ratio - w) < 1e-9 else 1)
PY

python3 - "$work/A/rank0.out" "$work/B/rank0.out" "$work/F/rank0.out" <<'PY' || fail "server-sum and pre-reduced disagree"
import re, sys
def losses(path):
    out = []
    for line in open(path):
        m = re.match(r"step\s+\d+\s+loss (\S+)", line)
        if m: out.append(float(m.group(1)))
        m = re.match(r"held-out loss (\S+) -> (\S+)", line)
        if m: out += [float(m.group(1)), float(m.group(2))]
    return out
a, b, f = losses(sys.argv[1]), losses(sys.argv[2]), losses(sys.argv[3])
assert len(a) == len(b) == len(f) and a, (a, b, f)
worst = max(max(abs(x - y) for x, y in zip(a, b)), max(abs(x - y) for x, y in zip(a, f)))
print(f"server-sum vs pre-reduced (bucketed and per parameter): {len(a)} losses, largest difference {worst:.2e} (tolerance 2e-3)")
sys.exit(0 if worst <= 2e-3 else 1)
PY
echo "PASS"
