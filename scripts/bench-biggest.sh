#!/usr/bin/env bash
# The biggest model on one machine: examples/big_model.py with int8 optimizer state, built in
# zt.init and trained STEPS steps (default 2) by one worker and SHARDS embedded shards (default
# 2) that keep at most MEMORY_BUDGET bytes of state and SERVING_BUDGET bytes of serving copies
# each in RAM and spill the rest to disk (DIR, default $TMPDIR or /tmp: use a disk, not a tmpfs).
# The default model is LAYERS=179 residual blocks of HIDDEN=4096: 3.00 G parameters, 12.0 GB
# (11.2 GiB) of fp32 weights.
#
# It prints the step times, the worker's peak RSS (its own ru_maxrss; target < 2 GiB), the
# shards' peak RSS (VmHWM) and the run's peak RSS summed over its processes (sampled), the disk
# the run used at its peak (du of DIR's run folder: the zt.init staging file, then the spill
# files), the state bytes per parameter from the shards' zps_shard_state_bytes gauges, and what
# the same model needs with fp32 state (docs/state-bytes.md's layout).
#
# The gradient slots (4 bytes per parameter with fp32 gradients, in RAM whatever the budgets;
# docs/nvme.md) come on top of the budgets: it refuses to start where MemAvailable cannot hold
# them, the budgets and 2 GiB for the worker, or the disk the spill and the staging file need
# (FORCE=1 starts anyway). Extra arguments go to big_model.py. The worker runs with
# glibc.malloc.hugetlb=1 in GLIBC_TUNABLES (scripts/lib/worker-env.sh; HUGETLB=0 leaves it out).
#   DIR=/data scripts/bench-biggest.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/worker-env.sh
source "$root/scripts/lib/worker-env.sh"
worker_huge_pages
layers=${LAYERS:-179} hidden=${HIDDEN:-4096} steps=${STEPS:-2} shards=${SHARDS:-2}
budget=${MEMORY_BUDGET:-$((1 << 30))} serving=${SERVING_BUDGET:-$((256 << 20))}
dtype=${STATE_DTYPE:-int8}
[[ -f $root/build/lib/libzps_c.so ]] || "$root/scripts/build.sh"
base=${DIR:-${TMPDIR:-/tmp}}
params=$((layers * hidden * hidden))
# RAM: gradient slots + the budgets + the worker; disk: the staging file (fp32 values) and the
# spill files (state records of about 6.06 bytes per parameter with int8 moments, 8 with bf16, 12
# with fp32, plus 2 of serving copies) beyond the budgets. Sixteenths of a byte per parameter.
case $dtype in int8) rec16=97 ;; bf16) rec16=128 ;; *) rec16=192 ;; esac
need_ram=$((4 * params + shards * (budget + serving) + (2 << 30)))
need_disk=$((4 * params + (rec16 + 32) * params / 16 - shards * (budget + serving)))
avail_ram=$(($(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) * 1024))
avail_disk=$(df -B1 --output=avail "$base" | tail -1)
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB," \
     "load $(cut -d' ' -f1-3 /proc/loadavg); $layers x $hidden^2 = $params parameters," \
     "$dtype state, $shards shards x (memory budget $budget + serving budget $serving) bytes;" \
     "GLIBC_TUNABLES=${GLIBC_TUNABLES:-}"
echo "# needs about $((need_ram >> 20)) MiB of RAM (MemAvailable $((avail_ram >> 20)) MiB) and" \
     "$((need_disk >> 20)) MiB of disk in $base ($((avail_disk >> 20)) MiB free)"
if [[ ${FORCE:-0} != 1 ]] && ((need_ram > avail_ram || need_disk > avail_disk)); then
  echo "not started: too little RAM or disk for this model here (FORCE=1 starts anyway)" >&2
  exit 1
fi
dir=$(mktemp -d "$base/zps-bench-biggest.XXXXXX")
trap 'rm -rf "$dir"' EXIT
TMPDIR=$dir PYTHONPATH=$root/python /usr/bin/python3 "$root/examples/big_model.py" \
  --data-dir "$dir/cluster" --layers "$layers" --hidden "$hidden" --steps "$steps" \
  --shards "$shards" --memory-budget "$budget" --serving-budget "$serving" --state-dtype "$dtype" \
  "$@" >"$dir/out.txt" 2> >(grep -v '^I ' >&2) &
pid=$!
tail -n +1 -f --pid="$pid" "$dir/out.txt" &
# Every 2 s: the run folder's allocated bytes and the PSS of the worker and its shards (PSS, not
# RSS: the shared-memory regions the worker and the shards both map are counted once).
pss() {
  local p s=0
  for p in "$pid" $(pgrep -P "$pid" || true); do
    s=$((s + $(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)))
  done
  echo $((s * 1024))
}
while kill -0 "$pid" 2>/dev/null; do
  echo "$(du -sB1 "$dir" 2>/dev/null | cut -f1) $(pss)" >>"$dir/samples.txt"
  sleep 2
done
wait "$pid"
sleep 1  # tail's last lines

/usr/bin/python3 - "$dir/out.txt" "$dir/samples.txt" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"result"')][0]
samples = [tuple(map(int, l.split())) for l in open(sys.argv[2]) if len(l.split()) == 2]
p, st = r["params"], r["state_bytes"]
per = (st["master"] + st["m"] + st["v"] + st["scales"] + st["serving"]) / p
peak = r["peak_rss_bytes"] / 2**30
budgets = r["shards"] * (r["memory_budget"] + r["serving_budget"])
steps = ", ".join(f"step {s['step']} {s['seconds']:.1f} s (shards read {s['shard_read_bytes'] / 1e9:.1f} "
                  f"GB, wrote {s['shard_write_bytes'] / 1e9:.1f} GB)" for s in r["steps"])
print(f"\nmodel {p / 1e9:.2f} G parameters ({r['fp32_bytes'] / 1e9:.1f} GB = "
      f"{r['fp32_bytes'] / 2**30:.2f} GiB fp32), {r['state_dtype']} state, {r['shards']} shards, "
      f"budgets {budgets / 2**30:.2f} GiB in all (memory {r['memory_budget'] / 2**30:.2f} + serving "
      f"{r['serving_budget'] / 2**30:.2f} GiB per shard; target <= 8): {steps}")
print(f"worker peak RSS {peak:.2f} GiB (target < 2: {'MET' if peak < 2 else 'MISSED'}); shards' "
      f"peak RSS {r['shard_peak_rss_bytes'] / 2**30:.2f} GiB (gradient slots "
      f"{st['grad'] / 2**30:.2f} GiB of it); the run's peak PSS, sampled every 2 s, "
      f"{max(s[1] for s in samples) / 2**30:.2f} GiB")
# The spill files are preallocated when the shards load the job, before initialize uploads (and
# then deletes) the staging file: the peak is the two together.
spill = max(s[0] for s in samples) - r["fp32_bytes"]
print(f"disk used: peak {max(s[0] for s in samples) / 1e9:.1f} GB (the zt.init staging file, "
      f"{r['fp32_bytes'] / 1e9:.1f} GB, and the spill files, {spill / 1e9:.1f} GB), "
      f"{samples[-1][0] / 1e9:.1f} GB at the last sample")
print(f"state bytes per parameter {per:.2f}: {per * p / 1e9:.1f} GB (master "
      f"{st['master'] / p:.2f}, moments {(st['m'] + st['v']) / p:.2f}, scales {st['scales'] / p:.2f}, "
      f"serving {st['serving'] / p:.2f}); gradient slots {st['grad'] / p:.2f}")
# fp32 state, docs/state-bytes.md: master 4 + m 4 + v 4 + serving 2. The state records grow from
# (master + m + v + scales) to 12 bytes per parameter, all of it spilled where the budgets are as
# small as here.
fp32 = 14 * p
more = (12 - (st["master"] + st["m"] + st["v"] + st["scales"]) / p) * p
print(f"the same model with fp32 state: 14.00 bytes per parameter = {fp32 / 1e9:.1f} GB "
      f"({fp32 / (per * p):.2f}x the {per * p / 1e9:.1f} GB here); its state records are "
      f"{more / 1e9:.1f} GB larger, so about {(spill + more) / 1e9:.1f} GB of spill files with the "
      f"same budgets, and {more * 2 / 1e9:.0f} GB more read and written per step")
PY
