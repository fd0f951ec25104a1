#!/usr/bin/env bash
# Quantized weights end to end: 2 zps-server shards (their /metrics scraped) x 2 zps-train
# workers, real processes on loopback (UCX tcp), three runs of the same job (fresh shards each):
#   B   bf16 serving copy, direct fetches        the 16-bit baseline
#   Q   --quantized-weights int8, direct
#   QB  --quantized-weights int8, bandwidth-centric (each rank fetches a slice, the ranks
#       all-gather the int8 block records and dequantize after the gather)
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
here=$(cd "$(dirname "$0")" && pwd)
# zps-train's default model shape: a smaller one has so many parameters of 64 to 256 elements,
# each fetched as whole 256-element blocks, that its int8 egress is 0.527x of bf16's (measured
# with d_model 64, 2 layers); at this shape it is the format's 1 + 4/256 bytes an element.
metered_init quantized-weights-test-token 2 2 "${STEPS:-5}" --d-model 128 --n-layers 4 --n-heads 4 \
  --d-ff 512 --seq-len 32 --batch 4 --chunk-elems 262144 --max-grad-norm 0.05 "$@"

metered_run B
metered_run Q --quantized-weights int8
metered_run QB --quantized-weights int8 --fetch-strategy bandwidth-centric

python3 - "$steps" "$work" "${QUANT_MAXW:-0.52}" <<'PY' || fail "bytes"
import sys
steps, work, limit = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
def per_step(name):
    return int(open(f"{work}/{name}/fetch").read()) / steps
b = per_step("B")
ok = True
for name in ("Q", "QB"):
    r = per_step(name) / b
    print(f"egress per step: {name} {per_step(name):.0f} B = {r:.4f}x bf16's {b:.0f} B"
          + (f" (limit {limit})" if name == "Q" else ""))
    if name == "Q":
        ok &= r <= limit
sys.exit(0 if ok else 1)
PY
python3 "$here/losses.py" falls bf16="$work/B/worker0.$steps.out" Q="$work/Q/worker0.$steps.out" \
  QB="$work/QB/worker0.$steps.out" || fail "losses"
echo "PASS"
