#!/usr/bin/env bash
# The memory target of zps.torch: a model of 4 GiB of fp32 weights (examples/big_model.py)
# built inside zt.init and trained for a few steps, with the worker's peak RSS (target: under
# 1.5 GiB) and its resident parameter bytes per step. The embedded shards run on this machine
# and spill beyond their memory budget to disk (DIR, default $TMPDIR or /tmp).
#
# --state-dtypes fp32,int8 (default fp32) trains the same model with the same budget once per
# state dtype, one after the other, and prints for each: the steady step time (the mean of the
# steps after the first, which has no optimizer pass before it), the bytes the shards read and
# wrote on the disk per step (/proc/<pid>/io of the shard processes: their spill files are
# O_DIRECT), those bytes at the disk's sequential rate measured in the same run before each
# training run (fio: O_DIRECT, io_uring, 1 MiB blocks, iodepth 16, 2 GiB; `zps-bench disk`
# with the same settings where fio is not installed), and the state bytes per parameter from
# the shards' zps_shard_state_bytes gauges. Then the step time of each dtype over the first.
# Extra arguments go to big_model.py (--layers, --hidden, --steps, --memory-budget, ...). The
# worker runs with glibc.malloc.hugetlb=1 in GLIBC_TUNABLES (scripts/lib/worker-env.sh; HUGETLB=0
# leaves it out).
#   scripts/bench-memory.sh --memory-budget 2147483648 --state-dtypes fp32,int8
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/worker-env.sh
source "$root/scripts/lib/worker-env.sh"
worker_huge_pages
dtypes=fp32
args=()
while (($#)); do
  case $1 in
    --state-dtypes) dtypes=$2; shift 2 ;;
    --state-dtypes=*) dtypes=${1#*=}; shift ;;
    --state-dtype | --state-dtype=*) echo "use --state-dtypes (a comma-separated list)" >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
dir=$(mktemp -d "${DIR:-${TMPDIR:-/tmp}}/zps-bench-memory.XXXXXX")
trap 'rm -rf "$dir"' EXIT
[[ -f $root/build/lib/libzps_c.so ]] || "$root/scripts/build.sh"
ref=fio
command -v fio >/dev/null || ref="zps-bench disk"
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB," \
     "load $(cut -d' ' -f1-3 /proc/loadavg); data dir $dir ($(df -h "$dir" | awk 'NR==2{print $4}') free);" \
     "disk reference: $([[ $ref == fio ]] && fio --version || echo "$ref"); GLIBC_TUNABLES=${GLIBC_TUNABLES:-}"

disk_mbps() {  # prints "write_MB/s read_MB/s" (10^6 B/s) of a sequential O_DIRECT pass in $dir
  if [[ $ref == fio ]]; then
    local rw
    for rw in write read; do
      # terse fields: 48 = write bandwidth, 7 = read bandwidth, in KiB/s
      fio --name="$rw" --filename="$dir/fio.tmp" --size=2G --bs=1M --rw="$rw" --direct=1 \
          --ioengine=io_uring --iodepth=16 --output-format=terse 2>/dev/null |
        awk -F';' -v f="$([[ $rw == write ]] && echo 48 || echo 7)" '{printf "%.0f ", $f * 1024 / 1e6}'
    done
    rm -f "$dir/fio.tmp"
    echo
  else
    "$root/build/bin/zps-bench" disk --dir "$dir" --bytes $((2 << 30)) --json | tail -1 |
      sed -E 's/.*"write_mbps":([0-9.]+).*"read_mbps":([0-9.]+).*/\1 \2/'
  fi
}

IFS=, read -ra dts <<<"$dtypes"
for dt in "${dts[@]}"; do
  read -r dw dr < <(disk_mbps)
  echo "## state dtype $dt: $ref sequential write $dw MB/s, read $dr MB/s; load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "{\"disk\": \"$ref\", \"state_dtype\": \"$dt\", \"write_mbps\": $dw, \"read_mbps\": $dr}" >"$dir/disk-$dt.json"
  TMPDIR=$dir PYTHONPATH=$root/python /usr/bin/python3 "$root/examples/big_model.py" \
    --data-dir "$dir/cluster-$dt" --state-dtype "$dt" "${args[@]}" 2> >(grep -v '^I ' >&2) |
    tee "$dir/out-$dt.txt"
  rm -rf "$dir/cluster-$dt"
done

/usr/bin/python3 - "$dir" "${dts[@]}" <<'PY'
import json, sys
d, dts = sys.argv[1], sys.argv[2:]
base = None
print()
for dt in dts:
    r = [json.loads(l) for l in open(f"{d}/out-{dt}.txt") if l.startswith('{"result"')][0]
    disk = json.load(open(f"{d}/disk-{dt}.json"))
    steady = r["steps"][1:] or r["steps"]
    n = len(steady)
    step_s = sum(s["seconds"] for s in steady) / n
    rd = sum(s["shard_read_bytes"] + s["worker_read_bytes"] for s in steady) / n
    wr = sum(s["shard_write_bytes"] + s["worker_write_bytes"] for s in steady) / n
    disk_s = rd / (disk["read_mbps"] * 1e6) + wr / (disk["write_mbps"] * 1e6)
    st = r["state_bytes"]
    per = (st["master"] + st["m"] + st["v"] + st["scales"] + st["serving"]) / r["params"]
    peak = r["peak_rss_bytes"] / 2**30
    base = base or step_s
    print(f"{dt}: model {r['params'] / 1e9:.2f} G parameters ({r['fp32_bytes'] / 2**30:.2f} GiB "
          f"fp32), {r['shards']} shards x memory budget {r['memory_budget'] / 2**30:.2f} GiB; "
          f"step {step_s:.1f} s (mean of steps 1-{len(r['steps']) - 1}; step 0 "
          f"{r['steps'][0]['seconds']:.1f} s), {step_s / base:.2f}x the {dts[0]} step; disk per "
          f"step: read {rd / 1e9:.2f} GB, wrote {wr / 1e9:.2f} GB = {disk_s:.1f} s at "
          f"{disk['disk']}'s {disk['read_mbps']:.0f}/{disk['write_mbps']:.0f} MB/s read/write "
          f"({disk_s / step_s:.2f} of the step); state bytes per parameter {per:.2f} (gradient "
          f"slots {st['grad'] / r['params']:.2f}); worker peak RSS {peak:.2f} GiB (target < 1.5: "
          f"{'MET' if peak < 1.5 else 'MISSED'}), shards' peak RSS "
          f"{r['shard_peak_rss_bytes'] / 2**30:.2f} GiB; resident parameter bytes per step: "
          + ", ".join(f"{s['resident_param_bytes'] / 2**20:.0f} MiB" for s in r["steps"]))
PY
