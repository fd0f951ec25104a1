#!/usr/bin/env bash
# NVMe spill figures side by side, in one run, in one directory:
#   - fio (O_DIRECT, io_uring, 1 MiB blocks, iodepth 16), sequential write then read of 2 GiB:
#     the ceiling (the disk's own sequential bandwidth in the same directory);
#   - zps-bench spill: sequential write and read passes through ChunkStore (io_uring, O_DIRECT,
#     1 MiB requests, 16 in flight) and the full optimizer pass over spilled chunks.
# Rounds alternate fio and zps so a noisy neighbour hits both; each figure is the median over
# rounds. Prints each run, then ratios against the 0.85x target. Disk use: at most ~3.6 GB at
# once (fio's file is removed before zps runs); everything is removed at exit.
#
#   scripts/bench-spill.sh [DIR]     # env: BUILD_DIR (build), ZPS_BENCH (a zps-bench binary),
#                                    #      PARAMS (256M), BUDGET (320MiB), ROUNDS (2)
set -euo pipefail
# shellcheck source=scripts/lib/disk-bench.sh
source "$(dirname "$0")/lib/disk-bench.sh"
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
build=${BUILD_DIR:-$root/build}
dir=${1:-/var/tmp}
params=${PARAMS:-256M}
budget=${BUDGET:-320MiB}
rounds=${ROUNDS:-2}
bench=${ZPS_BENCH:-$build/bin/zps-bench}
bench_workdir spill
if [[ ! -x $bench ]]; then
  cmake --build "$build" --target zps-bench >/dev/null
fi
df -h "$dir" | tail -1

fio_bw() {  # rw -> MB/s (10^6 B/s)
  local field=7
  [[ $1 == write ]] && field=48  # terse v3: the bandwidth in KiB/s
  fio_seq "$1" "$work/fio.tmp" 2G | awk -F';' -v f="$field" '{printf "%.1f\n", $f * 1024 / 1e6}'
}

fw=(); fr=(); zw=(); zr=(); zo=()
for ((i = 1; i <= rounds; ++i)); do
  fw+=("$(fio_bw write)"); fr+=("$(fio_bw read)"); rm -f "$work/fio.tmp"
  echo "round $i fio: write ${fw[-1]} MB/s, read ${fr[-1]} MB/s"
  out=$("$bench" spill --dir "$work" --params "$params" --memory-budget "$budget" \
        --serving-budget 64MiB 2>/dev/null)
  echo "$out" | sed "s/^/round $i zps: /"
  res=$(echo "$out" | grep '^RESULT')
  zw+=("$(sed -E 's/.*spill_write_MBps=([0-9.]+).*/\1/' <<<"$res")")
  zr+=("$(sed -E 's/.*spill_read_MBps=([0-9.]+).*/\1/' <<<"$res")")
  zo+=("$(sed -E 's/.*optimizer_Mparams=([0-9.]+).*/\1/' <<<"$res")")
done
mfw=$(median "${fw[@]}"); mfr=$(median "${fr[@]}"); mzw=$(median "${zw[@]}"); mzr=$(median "${zr[@]}")
echo
printf '%-10s %12s %12s %8s %8s\n' "" "fio MB/s" "zps MB/s" "ratio" "target"
awk -v f="$mfw" -v z="$mzw" 'BEGIN {printf "%-10s %12.1f %12.1f %8.2f %8s %s\n", "write", f, z, z/f, "0.85", (z/f>=0.85)?"met":"MISSED"}'
awk -v f="$mfr" -v z="$mzr" 'BEGIN {printf "%-10s %12.1f %12.1f %8.2f %8s %s\n", "read", f, z, z/f, "0.85", (z/f>=0.85)?"met":"MISSED"}'
echo "optimizer pass over spilled chunks: $(median "${zo[@]}") Mparam/s (median)"
