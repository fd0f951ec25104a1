#!/usr/bin/env bash
# zps.torch against plain PyTorch on the same model and batch, in one run: the TransformerEncoder
# LM of examples/train_lm.py trained with torch.optim.AdamW in one process, then through zps
# (embedded cluster on loopback), alternating, for each model size. Prints each run's JSON line
# and a table of tokens/s with the ratio zps/plain (target >= 0.8 for the default size).
#
#   scripts/bench-torch.sh                      # env: SIZES ("128x2 256x4 512x4": d_model x layers),
#                                               #      STEPS (40), ROUNDS (2), THREADS (2),
#                                               #      BATCH (16), SEQ (64), SHARDS (2), SERVING
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sizes=${SIZES:-"128x2 256x4 512x4"}
steps=${STEPS:-40}
rounds=${ROUNDS:-2}
threads=${THREADS:-2}
batch=${BATCH:-16}
seq=${SEQ:-64}
shards=${SHARDS:-2}
py=/usr/bin/python3
[[ -x $root/build/lib/libzps_c.so || -f $root/build/lib/libzps_c.so ]] || "$root/scripts/build.sh"
results=$(mktemp)
trap 'rm -f "$results"' EXIT
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg);" \
     "torch $($py -c 'import torch; print(torch.__version__)'), threads=$threads batch=$batch seq=$seq steps=$steps"
for round in $(seq 1 "$rounds"); do
  for size in $sizes; do
    d=${size%x*} l=${size#*x}
    common=(--steps "$steps" --batch "$batch" --seq-len "$seq" --d-model "$d" --layers "$l"
            --threads "$threads" --shards "$shards")
    for mode in plain zps; do
      extra=(); [[ $mode == plain ]] && extra=(--plain)
      PYTHONPATH=$root/python $py "$root/examples/train_lm.py" "${common[@]}" "${extra[@]}" 2>/dev/null |
        grep '^{"result"' | sed "s/^{/{\"round\": $round, /" | tee -a "$results"
    done
  done
done
$py - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print()
print("d_model x layers | params | plain tokens/s | zps tokens/s | zps/plain (best of rounds; per round)")
for key in sorted({(r["d_model"], r["layers"]) for r in rows}):
    sel = [r for r in rows if (r["d_model"], r["layers"]) == key]
    plain = max(r["tokens_per_s"] for r in sel if r["mode"] == "plain")
    zps = max(r["tokens_per_s"] for r in sel if r["mode"] == "zps")
    per = []
    for rnd in sorted({r["round"] for r in sel}):
        p = [r["tokens_per_s"] for r in sel if r["round"] == rnd and r["mode"] == "plain"]
        z = [r["tokens_per_s"] for r in sel if r["round"] == rnd and r["mode"] == "zps"]
        if p and z:
            per.append(f"{z[0] / p[0]:.2f}")
    print(f"{key[0]:>7} x {key[1]:<6} | {sel[0]['params']:>7} | {plain:>14.0f} | {zps:>12.0f} |"
          f" {zps / plain:.2f} ({', '.join(per)})")
PY
