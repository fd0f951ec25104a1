#!/usr/bin/env bash
# Checkpoint write/read throughput (zps-bench checkpoint) beside fio sequential write/read
# (O_DIRECT, io_uring, 1 MiB, depth 16) on the same directory, in the same run; prints ratios.
#
#   scripts/bench-checkpoint.sh [DIR] [SIZE] [extra zps-bench flags...]
#   DIR: default $TMPDIR or /tmp; SIZE: default 2G (fio file and checkpoint state alike).
# Environment: ZPS_BENCH (default build/bin/zps-bench), ROUNDS (default 2: fio, zps, fio, zps...).
# Without fio (REF=disk, or fio not installed) the reference is `zps-bench disk`, the same
# sequential O_DIRECT io_uring 1 MiB x 16 pattern built in.
# Uses SIZE of disk at a time and removes everything it wrote.
set -euo pipefail
# shellcheck source=scripts/lib/disk-bench.sh
source "$(dirname "$0")/lib/disk-bench.sh"
bench_args "$@"
bench_workdir ckpt

ref=${REF:-fio}
command -v fio >/dev/null || ref=disk
declare -A disk_bw
disk_round() {  # one zps-bench disk write+read; fills disk_bw[write], disk_bw[read]
  local line
  line=$("$bench" disk --dir "$work" --bytes "$size" --json | tail -1)
  disk_bw[write]=$(sed -E 's/.*"write_mbps":([0-9.]+).*/\1/' <<<"$line")
  disk_bw[read]=$(sed -E 's/.*"read_mbps":([0-9.]+).*/\1/' <<<"$line")
}
fio_bw() {  # $1 = write|read; prints MB/s
  local rw=$1 field
  if [[ $ref == disk ]]; then echo "${disk_bw[$rw]}"; return; fi
  [[ $rw == write ]] && field=48 || field=7
  fio_seq "$rw" "$work/fio.tmp" "$size" | awk -F';' -v f="$field" '{printf "%.0f\n", $f * 1024 / 1e6}'
}

echo "dir $dir, size $size, $(nproc) CPUs, reference: $([[ $ref == fio ]] && fio --version || echo 'zps-bench disk')"
fw=() fr=() zw=() zr=()
for ((i = 0; i < rounds; i++)); do
  [[ $ref == disk ]] && disk_round
  fw+=("$(fio_bw write)")
  fr+=("$(fio_bw read)")
  rm -f "$work/fio.tmp" "$work/zps-bench-disk.tmp"
  line=$("$bench" checkpoint --dir "$work" --bytes "$size" --json "${extra[@]}" | tail -1)
  zw+=("$(sed -E 's/.*"write_gbps":([0-9.]+).*/\1/' <<<"$line" | awk '{printf "%.0f", $1 * 1000}')")
  zr+=("$(sed -E 's/.*"read_gbps":([0-9.]+).*/\1/' <<<"$line" | awk '{printf "%.0f", $1 * 1000}')")
  echo "round $i: $ref write ${fw[-1]} MB/s, read ${fr[-1]} MB/s | checkpoint write ${zw[-1]} MB/s, read ${zr[-1]} MB/s"
done
mfw=$(median "${fw[@]}") mfr=$(median "${fr[@]}") mzw=$(median "${zw[@]}") mzr=$(median "${zr[@]}")
echo "median: $ref write $mfw MB/s, read $mfr MB/s; checkpoint write $mzw MB/s, read $mzr MB/s"
awk -v a="$mzw" -v b="$mfw" -v c="$mzr" -v d="$mfr" -v r="$ref" 'BEGIN {
  printf "ratio checkpoint/%s: write %.2fx, read %.2fx (target >= 0.70x)\n", r, a / b, c / d }'
