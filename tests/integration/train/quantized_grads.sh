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
here=$(cd "$(dirname "$0")" && pwd)
metered_init quantized-grads-test-token 2 2 "${STEPS:-8}" --d-model 64 --n-layers 2 --n-heads 2 \
  --d-ff 256 --seq-len 32 --batch 4 --chunk-elems 16384 --max-grad-norm 0.05 "$@"

run() {  # name reduction [extra zps-train flags...]
  metered_run "$1" --reduction "$2" "${@:3}"
}

run H server-sum --grad-dtype bf16
run Q8 server-sum --quantized-grads int8
run Q4 server-sum --quantized-grads int4
run P4 pre-reduced --quantized-grads int4
run P4b pre-reduced --quantized-grads int4

[[ $(wc -l < "$work/P4/final.crc") -ge 4 ]] || fail "expected CRCs of at least 4 chunks"
diff "$work/P4/final.crc" "$work/P4b/final.crc" > /dev/null || fail "pre-reduced int4 runs differ (not deterministic)"
echo "determinism: pre-reduced int4 P4 = P4b (every chunk's CRC)"

params=$(awk '/^rank 0: [0-9]+ parameters/ {print $3}' "$work/H/worker0.$steps.out")
[[ -n $params ]] || fail "no parameter count in rank 0's output"
python3 - "$params" "$steps" "$work" "${QUANT_MAX8:-0.52}" "${QUANT_MAX4:-0.27}" <<'PY' || fail "bytes"
import sys
params, steps, work = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
max8, max4 = float(sys.argv[4]), float(sys.argv[5])
def per_step(name):  # shard ingress per step, rank 0's fp32 initial values taken out
    return (int(open(f"{work}/{name}/push").read()) - params * 4) / steps
h = per_step("H")
ok = True
for name, limit in (("Q8", max8), ("Q4", max4)):
    r = per_step(name) / h
    print(f"ingress per step: {name} {per_step(name):.0f} B = {r:.4f}x bf16's {h:.0f} B (limit {limit})")
    ok &= r <= limit
sys.exit(0 if ok else 1)
PY
python3 "$here/losses.py" falls bf16="$work/H/worker0.$steps.out" Q8="$work/Q8/worker0.$steps.out" \
  Q4="$work/Q4/worker0.$steps.out" P4="$work/P4/worker0.$steps.out" || fail "losses"
echo "PASS"
