#!/usr/bin/env bash
# The memory target of zps.torch: a model of 4 GiB of fp32 weights (examples/big_model.py)
# built inside zt.init and trained for a few steps, with the worker's peak RSS (target: under
# 1.5 GiB) and its resident parameter bytes per step. The embedded shards run on this machine
# and spill beyond their memory budget to disk (DIR, default $TMPDIR or /tmp). Extra arguments
# go to big_model.py (--layers, --hidden, --steps, --memory-budget, ...).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d "${DIR:-${TMPDIR:-/tmp}}/zps-bench-memory.XXXXXX")
trap 'rm -rf "$dir"' EXIT
[[ -f $root/build/lib/libzps_c.so ]] || "$root/scripts/build.sh"
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB," \
     "load $(cut -d' ' -f1-3 /proc/loadavg); data dir $dir ($(df -h "$dir" | awk 'NR==2{print $4}') free)"
TMPDIR=$dir PYTHONPATH=$root/python /usr/bin/python3 "$root/examples/big_model.py" \
  --data-dir "$dir/cluster" "$@" 2> >(grep -v '^I ' >&2) | tee "$dir/out.txt"
/usr/bin/python3 - "$dir/out.txt" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"result"')][0]
peak = r["peak_rss_bytes"] / 2**30
print(f"\nmodel {r['fp32_bytes'] / 2**30:.2f} GiB fp32; worker peak RSS {peak:.2f} GiB "
      f"(target < 1.5): {'MET' if peak < 1.5 else 'MISSED'}; resident parameter bytes per step: "
      + ", ".join(f"{s['resident_param_bytes'] / 2**20:.0f} MiB" for s in r["steps"]))
PY
