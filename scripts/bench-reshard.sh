#!/usr/bin/env bash
# Offline resharding time (zps-bench reshard: `zps-ckpt reshard` of SIZE of chunk state from 2 to
# 3 shards, inputs read from the disk, outputs committed) against fio reading and writing the same
# bytes on the same directory, in the same run: the reference time is fio's sequential read of
# SIZE plus its sequential write of SIZE (O_DIRECT, io_uring, 1 MiB, depth 16), and the ratio is
# that time over the reshard's (>= 0.70x: the reshard takes at most 1/0.7 of fio's time). Each
# round also times the online path (zps-bench reshard --online: ReshardAtStart on a thread per new
# shard, over loopback endpoints) on the same bytes, against the same fio figure.
#
#   scripts/bench-reshard.sh [DIR] [SIZE] [extra zps-bench reshard flags...]
#   DIR: default $TMPDIR or /tmp; SIZE: default 2G.
# Environment: ZPS_BENCH (default build/bin/zps-bench), ROUNDS (default 2: fio, reshard, ...),
# PATHS (default "offline online"; "offline" skips the online path).
# Uses about 2 x SIZE of disk at a time and removes everything it wrote.
set -euo pipefail
# shellcheck source=scripts/lib/disk-bench.sh
source "$(dirname "$0")/lib/disk-bench.sh"
bench_args "$@"
read -r -a paths <<<"${PATHS:-offline online}"
command -v fio >/dev/null || { echo "fio is not installed"; exit 1; }
bench_workdir reshard

fio_s() {  # $1 = write|read; prints seconds
  local rw=$1 field
  [[ $rw == write ]] && field=50 || field=9  # terse v3: the job's runtime in ms
  fio_seq "$rw" "$work/fio.tmp" "$size" | awk -F';' -v f="$field" '{printf "%.3f\n", $f / 1000}'
}

echo "dir $dir, size $size, $(nproc) CPUs, $(fio --version), load average $(cut -d' ' -f1-3 /proc/loadavg)"
ref=()
declare -A zps=()
for ((i = 0; i < rounds; i++)); do
  w=$(fio_s write)
  r=$(fio_s read)
  rm -f "$work/fio.tmp"
  ref+=("$(awk -v a="$w" -v b="$r" 'BEGIN {printf "%.3f", a + b}')")
  echo "round $i: fio write ${w} s + read ${r} s = ${ref[-1]} s"
  for p in "${paths[@]}"; do
    flag=()
    [[ $p == online ]] && flag=(--online)
    if ! line=$("$bench" reshard --dir "$work" --bytes "$size" --json "${flag[@]}" "${extra[@]}" \
                2>"$work/$p.log" | tail -1); then
      echo "zps-bench reshard ($p) failed:"; tail -5 "$work/$p.log"; exit 1
    fi
    t=$(sed -E 's/.*"seconds":([0-9.]+).*/\1/' <<<"$line")
    zps[$p]+="$t "
    echo "round $i: $p reshard $t s ($line)"
  done
done
mref=$(median "${ref[@]}")
for p in "${paths[@]}"; do
  # shellcheck disable=SC2086
  m=$(median ${zps[$p]})
  awk -v a="$mref" -v b="$m" -v p="$p" 'BEGIN {
    printf "median: fio read+write %.3f s, %s reshard %.3f s; ratio fio/reshard %.2fx (target >= 0.70x)\n", a, p, b, a / b }'
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
