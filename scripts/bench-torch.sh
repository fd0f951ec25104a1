#!/usr/bin/env bash
# zps.torch against plain PyTorch on the same model and batch, in one run: the TransformerEncoder
# LM of examples/train_lm.py, trained with torch.optim.AdamW in this process and through zps
# (embedded cluster on loopback), in alternating blocks of 5 steps (bench/torch_speed.py), for each
# model size. Prints one JSON line per size and a table of tokens/s with the ratio zps/plain
# (target >= 0.8 for the default size, 128x2).
#
#   scripts/bench-torch.sh          # env: SIZES ("128x2,256x4,512x4": d_model x layers), STEPS (40),
#                                   #      THREADS (2), BATCH (16), SEQ (64), SHARDS (2), SERVING (bf16)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[[ -f $root/build/lib/libzps_c.so ]] || "$root/scripts/build.sh"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
PYTHONPATH=$root/python /usr/bin/python3 "$root/bench/torch_speed.py" --sizes "${SIZES:-128x2,256x4,512x4}" \
  --steps "${STEPS:-40}" --threads "${THREADS:-2}" --batch "${BATCH:-16}" --seq-len "${SEQ:-64}" \
  --shards "${SHARDS:-2}" --serving "${SERVING:-bf16}" 2> >(grep -v '^[IW] ' >&2) | tee "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"result"')]
print()
print("d_model x layers | params | plain tokens/s | zps tokens/s | zps/plain (median of alternating 5-step blocks)")
for r in rows:
    print(f"{r['d_model']:>7} x {r['layers']:<6} | {r['params']:>8} | {r['plain_tokens_per_s']:>14.0f} |"
          f" {r['zps_tokens_per_s']:>12.0f} | {r['ratio']:.2f}{'  (target >= 0.8)' if r['d_model'] == 128 else ''}")
PY
