#!/usr/bin/env bash
# Two builds of zps side by side, interleaved, on the optimizer, transport and training-step
# benchmarks: the check that a change (a refactoring, say) leaves the figures no worse.
#
#   scripts/bench-compare.sh BUILD_A BUILD_B        # e.g. build-before build
#
# Per round, each benchmark runs for A, then B (odd rounds) or B, then A (even rounds), so that a
# noisy neighbour hits both alike; each line also carries its reference from the same round:
#   - optimizer: `zps-bench optimizer` (fused AdamW, fp32 grad -> bf16 copy, 1 thread) beside the
#     roofline probe bench/adam_roofline.c (adam_fp32, 1 thread);
#   - transport: `zps-bench transport` (fetch and push through a real shard, UCX shm) beside
#     `ucx_perftest` ucp_am_bw on the same transport and size;
#   - step: `zps-train --mode local` (1 worker, 2 shards, UCX tcp) beside `--mode reference` (the
#     same training in one process).
# Prints JSON lines, then per benchmark the median over rounds of A, of B, and B / A.
# Env: ROUNDS (default 3), PARAMS (optimizer parameters, default 32Mi), SIZE (transport request
# size, default 16MiB), STEPS (training steps, default 30), PORT (ucx_perftest, default 13390).
set -euo pipefail
[[ $# -eq 2 ]] || { sed -n '2,17p' "$0" >&2; exit 2; }
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
builds=("$1" "$2")
for b in "${builds[@]}"; do
  for p in zps-bench zps-train zps-server; do
    [[ -x $b/bin/$p ]] || { echo "bench-compare: $b/bin/$p is missing (build it first)" >&2; exit 1; }
  done
done
rounds=${ROUNDS:-3}
params=${PARAMS:-33554432}
size=${SIZE:-16MiB}
steps=${STEPS:-30}
port=${PORT:-13390}
work=$(mktemp -d)
trap 'rm -rf "$work"; [[ -n ${perf_pid:-} ]] && kill "$perf_pid" 2>/dev/null || true' EXIT

cc -O3 -march=native -fno-math-errno -fopenmp "$root/bench/adam_roofline.c" -o "$work/probe" -lm
size_bytes=$(python3 -c "import sys; s=sys.argv[1]; print(int(s[:-3]) << {'KiB':10,'MiB':20,'GiB':30}[s[-3:]])" "$size")

out=$work/results.jsonl
emit() { echo "$1" | tee -a "$out"; }

optimizer() {  # $1 label, $2 build
  local fused ref
  fused=$("$2/bin/zps-bench" optimizer --json --threads 1 --params "$params" |
    python3 -c 'import json,sys
for l in sys.stdin:
    r=json.loads(l)
    if r.get("kernel")=="adamw_fused" and r["grad_dtype"]=="fp32" and r["out_dtype"]=="bf16": print(r["mparams_per_s"])')
  ref=$(OMP_NUM_THREADS=1 "$work/probe" "$params" |
    python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["adam_fp32_mparams_per_s"])')
  emit "{\"bench\": \"optimizer\", \"build\": \"$1\", \"value\": $fused, \"reference\": $ref, \"unit\": \"Mparam/s\"}"
}

transport() {  # $1 label, $2 build
  local ref
  UCX_TLS=posix,cma,self timeout 120 ucx_perftest -p "$port" >/dev/null 2>&1 &
  perf_pid=$!
  sleep 1
  # Its "Final:" line has the bandwidth in MB/s (2^20 bytes) as field 6.
  ref=$(UCX_TLS=posix,cma,self timeout 120 ucx_perftest 127.0.0.1 -p "$port" -t ucp_am_bw -s "$size_bytes" \
    -n 100 -w 10 2>&1 | awk '/^Final:/ {printf "%.3f", $6 * 1048576 / 1e9}')
  wait "$perf_pid" 2>/dev/null || true
  perf_pid=
  "$2/bin/zps-bench" transport --json --tls shm --sizes "$size" --ops fetch,push --reps 3 |
    python3 -c 'import json,sys
label, ref = sys.argv[1], float(sys.argv[2])
for l in sys.stdin:
    r = json.loads(l)
    if "gb_per_s" in r:
        print(json.dumps({"bench": "transport_" + r["op"], "build": label, "value": r["gb_per_s"],
                          "reference": ref, "unit": "GB/s"}))' "$1" "$ref" | tee -a "$out"
}

step() {  # $1 label, $2 build
  local common=(--steps "$steps" --world-size 1 --log-every 1000) ref dist
  ref=$("$2/bin/zps-train" --mode reference "${common[@]}" | sed -nE 's/.*[ (]([0-9.]+)s\/step.*/\1/p' | tail -1)
  dist=$("$2/bin/zps-train" --mode local --shards 2 --ucx-tls tcp "${common[@]}" |
    sed -nE 's/.*[ (]([0-9.]+)s\/step.*/\1/p' | tail -1)
  emit "{\"bench\": \"step\", \"build\": \"$1\", \"value\": $dist, \"reference\": $ref, \"unit\": \"s/step\"}"
}

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; A=${builds[0]} B=${builds[1]}; rounds=$rounds"
for r in $(seq 1 "$rounds"); do
  order=(A B)
  ((r % 2)) || order=(B A)
  for bench in optimizer transport step; do
    for label in "${order[@]}"; do
      b=${builds[0]}
      [[ $label == B ]] && b=${builds[1]}
      "$bench" "$label" "$b"
    done
  done
done

python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print()
print("bench | unit | A median | A / reference | B median | B / reference | B / A")
for bench in dict.fromkeys(r["bench"] for r in rows):
    def med(label, key):
        return statistics.median(r[key] for r in rows if r["bench"] == bench and r["build"] == label)
    a, b = med("A", "value"), med("B", "value")
    ar = statistics.median(r["value"] / r["reference"] for r in rows if r["bench"] == bench and r["build"] == "A")
    br = statistics.median(r["value"] / r["reference"] for r in rows if r["bench"] == bench and r["build"] == "B")
    unit = next(r["unit"] for r in rows if r["bench"] == bench)
    print(f"{bench} | {unit} | {a:.3f} | {ar:.2f} | {b:.3f} | {br:.2f} | {b / a:.3f}")
PY
