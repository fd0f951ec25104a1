#!/usr/bin/env bash
# Optimizer figures side by side, in one run, on this machine:
#   - bench/adam_roofline.c, the ceiling (the roofline probe: a plain compiler-vectorised Adam
#     over first-touched fp32 arrays, OpenMP; its adam_fp32 and adam_then_cast figures), at
#     OMP_NUM_THREADS=1 and 2;
#   - zps-bench optimizer (fused AdamW + 16-bit copy, grad stats) at 1 and 2 threads, with the
#     moments stored as fp32, bf16 and int8 (--state-dtype; docs/optimizer.md "Compact optimizer
#     state");
#   - torch.optim.Adam (foreach) over the same parameter count, when torch is installed.
# Runs are interleaved (probe, zps, torch for 1 thread, then for 2, and again for each round) so
# that a noisy neighbour hits all of them alike; each figure is the best over rounds of the
# best-of-steps inside each program. Prints the JSON lines, then the ratios against the targets,
# then each state dtype's pass against the fp32-state pass and its bytes moved per second against
# the probe's copy bandwidth (its cast_fp16 pass: read 4 B, write 2 B per parameter).
#
#   scripts/bench-optimizer.sh            # env: BUILD_DIR (default build), PARAMS (64Mi),
#                                         #      ROUNDS (2), THREADS ("1 2"),
#                                         #      STATE_DTYPES ("fp32 bf16 int8")
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
build=${BUILD_DIR:-$root/build}
params=${PARAMS:-67108864}
rounds=${ROUNDS:-2}
threads_list=${THREADS:-"1 2"}
state_dtypes=${STATE_DTYPES:-"fp32 bf16 int8"}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Build only the benchmark (REBUILD=0 uses the binary as it is).
if [[ ! -x $build/bin/zps-bench ]] || [[ ${REBUILD:-1} == 1 ]]; then
  if [[ ! -f $build/CMakeCache.txt ]]; then
    gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
    cmake -S "$root" -B "$build" "${gen[@]}" >/dev/null
  fi
  cmake --build "$build" --target zps-bench >/dev/null
fi

probe_src=$root/bench/adam_roofline.c
probe=""
if cc -O3 -march=native -fno-math-errno -fopenmp "$probe_src" -o "$work/adam_roofline" -lm; then
  probe=$work/adam_roofline
else
  echo "# skip probe: $probe_src did not build (needs a C compiler with OpenMP and _Float16)" >&2
fi

# torch: Debian's python3-torch lives in the system python, which a pyenv shim may hide.
torch_py=""
for py in python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null && "$py" -c "import torch" 2>/dev/null; then torch_py=$py; break; fi
done
[[ -n $torch_py ]] || echo "# skip torch: no python3 with torch (Debian: python3-torch)" >&2

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; params=$params rounds=$rounds"
results=$work/results.jsonl
for round in $(seq 1 "$rounds"); do
  for t in $threads_list; do
    if [[ -n $probe ]]; then
      OMP_NUM_THREADS=$t "$probe" "$params" | sed "s/^{/{\"bench\": \"probe\", \"round\": $round, /" | tee -a "$results"
    fi
    for sd in $state_dtypes; do
      "$build/bin/zps-bench" optimizer --json --threads "$t" --params "$params" --state-dtype "$sd" |
        sed "s/^{/{\"round\": $round, /" | tee -a "$results"
    done
    if [[ -n $torch_py ]]; then
      "$torch_py" "$root/bench/torch_adam.py" --threads "$t" --params "$params" |
        sed "s/^{/{\"round\": $round, /" | tee -a "$results"
    fi
  done
done

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def best(pred, key):
    v = [r[key] for r in rows if pred(r) and key in r]
    return max(v) if v else None
print()
print("threads | probe adam_fp32 | probe adam_then_cast | zps fused fp32->bf16 | zps fused fp16->fp16 |"
      " fused/adam_fp32 (>=0.9) | fused/adam_then_cast (>=1.3) | torch Adam | fused/torch")
for t in sorted({r["threads"] for r in rows}):
    pa = best(lambda r: r.get("bench") == "probe" and r["threads"] == t, "adam_fp32_mparams_per_s")
    pc = best(lambda r: r.get("bench") == "probe" and r["threads"] == t, "adam_then_cast_mparams_per_s")
    f32 = best(lambda r: r.get("kernel") == "adamw_fused" and r["threads"] == t and r["grad_dtype"] == "fp32"
               and r["out_dtype"] == "bf16" and r.get("state_dtype", "fp32") == "fp32", "mparams_per_s")
    f16 = best(lambda r: r.get("kernel") == "adamw_fused" and r["threads"] == t and r["grad_dtype"] == "fp16"
               and r["out_dtype"] == "fp16" and r.get("state_dtype", "fp32") == "fp32", "mparams_per_s")
    th = best(lambda r: r.get("bench") == "torch_adam" and r["threads"] == t, "mparams_per_s")
    def ratio(a, b):
        return f"{a / b:.2f}" if a and b else "n/a"
    def verdict(a, b, target):
        if not (a and b):
            return "n/a"
        return f"{a / b:.2f} {'MET' if a / b >= target else 'MISSED'}"
    print(f"{t:7d} | {pa or 'n/a':>15} | {pc or 'n/a':>20} | {f32:>20} | {f16:>20} |"
          f" {verdict(f32, pa, 0.9):>22} | {verdict(f32, pc, 1.3):>27} | {th or 'n/a':>10} | {ratio(f32, th):>11}")
print("(Mparam/s, best over rounds; ratios use the fp32-grad bf16-copy row, the harder of the two)")
print()
print("per round, fused fp32->bf16 / probe adam_fp32 and / adam_then_cast (same round, same threads):")
for rnd in sorted({r["round"] for r in rows}):
    parts = []
    for t in sorted({r["threads"] for r in rows}):
        pa = best(lambda r: r.get("bench") == "probe" and r["round"] == rnd and r["threads"] == t, "adam_fp32_mparams_per_s")
        pc = best(lambda r: r.get("bench") == "probe" and r["round"] == rnd and r["threads"] == t, "adam_then_cast_mparams_per_s")
        f = best(lambda r: r.get("kernel") == "adamw_fused" and r["round"] == rnd and r["threads"] == t
                 and r["grad_dtype"] == "fp32" and r["out_dtype"] == "bf16"
                 and r.get("state_dtype", "fp32") == "fp32", "mparams_per_s")
        if pa and pc and f:
            parts.append(f"{t} thr: {f / pa:.2f} / {f / pc:.2f}")
    print(f"  round {rnd}: " + ("; ".join(parts) if parts else "n/a"))

# Compact state: the fused pass (fp32 grad, bf16 copy) per state dtype, against fp32 state, and
# the bytes it moves per second against the probe's copy bandwidth (cast_fp16: 6 B/param).
print()
print("state dtype | threads | Mparam/s | x fp32 state (int8 target >= 1.3) | B/param | GB/s |"
      " probe copy GB/s | GB/s / copy")
for t in sorted({r["threads"] for r in rows}):
    cast = best(lambda r: r.get("bench") == "probe" and r["threads"] == t, "cast_fp16_mparams_per_s")
    copy_gbs = 6 * cast / 1e3 if cast else None
    def fused(sd, key="mparams_per_s"):
        return best(lambda r: r.get("kernel") == "adamw_fused" and r["threads"] == t
                    and r["grad_dtype"] == "fp32" and r["out_dtype"] == "bf16"
                    and r.get("state_dtype", "fp32") == sd, key)
    base = fused("fp32")
    for sd in ["fp32", "bf16", "int8"]:
        mps = fused(sd)
        if mps is None:
            continue
        bpp = next(r["bytes_per_param"] for r in rows if r.get("kernel") == "adamw_fused"
                   and r.get("state_dtype", "fp32") == sd and r["grad_dtype"] == "fp32"
                   and r["out_dtype"] == "bf16")
        gbs = mps * bpp / 1e3
        x = mps / base if base else None
        verdict = "" if sd != "int8" or x is None else (" MET" if x >= 1.3 else " MISSED")
        print(f"{sd:>11} | {t:7d} | {mps:8.0f} | {('%.2f' % x) if x else 'n/a':>6}{verdict:<28} |"
              f" {bpp:7.2f} | {gbs:4.1f} | {('%.1f' % copy_gbs) if copy_gbs else 'n/a':>15} |"
              f" {('%.2f' % (gbs / copy_gbs)) if copy_gbs else 'n/a':>11}")
print("(best over rounds; B/param counts the reads and writes the pass must make, int8's scales included)")
PY
