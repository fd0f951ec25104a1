#!/usr/bin/env bash
# Step time of zps-train through real shards against the in-process reference run (same model,
# same data, same optimizer, same machine, same run), with prefetch on and off.
#   scripts/bench-train.sh                 # defaults: STEPS=40 ROUNDS=2 BUILD_DIR=build
# Extra arguments go to every zps-train run (e.g. --d-model 256).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
STEPS=${STEPS:-40}
ROUNDS=${ROUNDS:-2}
TLS=${TLS:-tcp}
bin=$BUILD_DIR/bin/zps-train
[[ -x $bin ]] || { echo "build first: scripts/build.sh" >&2; exit 1; }
common=(--steps "$STEPS" --world-size 1 --log-every 1000 "$@")

step_time() { sed -nE 's/.*[ (]([0-9.]+)s\/step.*/\1/p' | tail -1; }

echo "# zps-train step time: distributed (1 worker, 2 shards, UCX $TLS) vs in-process reference"
echo "# model/options: ${common[*]}"
for r in $(seq 1 "$ROUNDS"); do
  ref=$("$bin" --mode reference "${common[@]}" | step_time)
  on=$("$bin" --mode local --shards 2 --ucx-tls "$TLS" "${common[@]}" | tee /tmp/zps-bench-train-on.log | step_time)
  wait_on=$(sed -nE 's/.* ([0-9.]+)s waiting for data.*/\1/p' /tmp/zps-bench-train-on.log)
  off=$("$bin" --mode local --shards 2 --ucx-tls "$TLS" --prefetch-bytes 0 "${common[@]}" | tee /tmp/zps-bench-train-off.log | step_time)
  wait_off=$(sed -nE 's/.* ([0-9.]+)s waiting for data.*/\1/p' /tmp/zps-bench-train-off.log)
  python3 - "$r" "$ref" "$on" "$off" "$wait_on" "$wait_off" "$STEPS" <<'PY'
import json, sys
r, ref, on, off, won, woff, steps = sys.argv[1:]
ref, on, off, won, woff, steps = map(float, (ref, on, off, won, woff, steps))
print(json.dumps({"round": int(r), "reference_s_per_step": ref, "zps_prefetch_s_per_step": on,
                  "zps_no_prefetch_s_per_step": off, "ratio_prefetch": round(on / ref, 3),
                  "ratio_no_prefetch": round(off / ref, 3),
                  "fetch_wait_s_per_step_prefetch": round(won / steps, 4),
                  "fetch_wait_s_per_step_no_prefetch": round(woff / steps, 4)}))
PY
done
