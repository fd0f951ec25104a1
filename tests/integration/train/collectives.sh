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
here=$(cd "$(dirname "$0")" && pwd)
runs=${RUNS:-all}
metered_init collectives-test-token "$2" "${SHARDS:-2}" "${STEPS:-8}" --d-model 32 --n-layers 2 \
  --n-heads 2 --d-ff 64 --seq-len 32 --batch 4 --chunk-elems 8192 --max-grad-norm 0.05 \
  --eval-windows 4 "${@:3}"
echo "world $world, $shards shards"

run() {  # name reduction fetch-strategy [extra zps-train flags...]
  metered_run "$1" --reduction "$2" --fetch-strategy "$3" "${@:4}"
}

run A server-sum direct
run B pre-reduced bandwidth-centric
if [[ $runs == scale ]]; then
  pre_runs=(B)     # pre-reduced: ingress 1x
  bw_run=B         # bandwidth-centric: egress 1x (A, direct: WORLD x)
  agree_runs=(B)   # losses within the tolerance of A's
else
  run C pre-reduced bandwidth-centric
  run D pre-reduced direct
  run E server-sum bandwidth-centric
  run F pre-reduced direct --bucket-bytes 0
  [[ $(wc -l < "$work/A/final.crc") -ge 4 ]] || fail "expected CRCs of at least 4 chunks"
  diff "$work/B/final.crc" "$work/C/final.crc" > /dev/null || fail "pre-reduced runs B and C differ (not deterministic)"
  diff "$work/B/final.crc" "$work/D/final.crc" > /dev/null || fail "bandwidth-centric (B) and direct (D) fetch differ"
  diff "$work/A/final.crc" "$work/E/final.crc" > /dev/null || fail "bandwidth-centric (E) and direct (A) fetch differ"
  echo "determinism: B = C, B = D, A = E (every chunk's CRC)"
  if diff "$work/A/final.crc" "$work/B/final.crc" > /dev/null; then
    echo "server-sum (A) and pre-reduced (B) end bit-identical at world $world"
  else
    echo "server-sum (A) and pre-reduced (B) differ in $(diff "$work/A/final.crc" "$work/B/final.crc" | grep -c '^<') chunks' bits at world $world (summation order)"
  fi
  pre_runs=(D F)
  bw_run=E
  agree_runs=(B F)
fi

params=$(awk '/^rank 0: [0-9]+ parameters/ {print $3}' "$work/A/worker0.$steps.out")
[[ -n $params ]] || fail "no parameter count in rank 0's output"
model_bytes=$((params * 4))
want_pre=$((model_bytes * (steps + 1)))          # initial values + 1x per step
want_sum=$((model_bytes * (world * steps + 1)))  # initial values + WORLD x per step
for r in "${pre_runs[@]}"; do
  [[ $(cat "$work/$r/push") -eq $want_pre ]] || fail "pre-reduced ingress ($r) $(cat "$work/$r/push") != $want_pre"
done
[[ $(cat "$work/A/push") -eq $want_sum ]] || fail "server-sum ingress $(cat "$work/A/push") != $want_sum"
echo "ingress per step: pre-reduced $((($(cat "$work/${pre_runs[0]}/push") - model_bytes) / steps)) B (1x the" \
     "model's $model_bytes B), server-sum $((($(cat "$work/A/push") - model_bytes) / steps)) B ($world x)"

# rank 0's held-out evaluations at start and end (bf16, direct): --eval-windows 4 = --batch, one
# pass each
eval_bytes=$((params * 2 * 2))
direct=$(( $(cat "$work/A/fetch") - eval_bytes ))
bw=$(( $(cat "$work/$bw_run/fetch") - eval_bytes ))
python3 - "$direct" "$bw" "$world" "$params" "$steps" <<'PY' || fail "egress ratio"
import sys
d, b, w, p, s = map(int, sys.argv[1:])
print(f"egress over training: direct {d} B, bandwidth-centric {b} B, ratio {d / b:.4f} (want {w}); "
      f"per step: {b / s / (p * 2):.3f}x and {d / s / (p * 2):.3f}x the bf16 model (with the prefetch "
      f"of step {s}, which the run never uses)")
sys.exit(0 if abs(d / b - w) < 1e-9 else 1)
PY

agree=()
for r in "${agree_runs[@]}"; do agree+=("$r=$work/$r/worker0.$steps.out"); done
python3 "$here/losses.py" agree 2e-3 "server-sum (A) vs pre-reduced (${agree_runs[*]})" \
  A="$work/A/worker0.$steps.out" "${agree[@]}" || fail "server-sum and pre-reduced disagree"
echo "PASS"
