# shellcheck shell=bash
# Sourced by scripts/bench-checkpoint.sh, bench-reshard.sh and bench-spill.sh: the disk
# reference they all measure against, the median they all report, their arguments and their
# scratch directory.
#   fio_seq RW FILE SIZE
#       fio's sequential RW (write or read) of SIZE on FILE: O_DIRECT, io_uring, 1 MiB blocks,
#       16 in flight. Prints fio's terse (v3) line: field 7 is the read bandwidth and 48 the
#       write bandwidth (KiB/s), 9 the read runtime and 50 the write runtime (ms).
#   median VALUE...
#       Prints the median of the numbers (the mean of the middle two for an even count).
#   bench_args [DIR] [SIZE] [EXTRA...]
#       Reads the command line of bench-checkpoint.sh and bench-reshard.sh into dir (default
#       $TMPDIR or /tmp), size (default 2G) and extra (the array of the arguments after SIZE, for
#       zps-bench), and their environment into bench ($ZPS_BENCH, default build/bin/zps-bench)
#       and rounds ($ROUNDS, default 2).
#   bench_workdir NAME
#       Sets work to a new directory zps-bench-NAME.XXXXXX in $dir, removed at exit.
fio_seq() {  # rw file size
  fio --name="$1" --filename="$2" --size="$3" --bs=1M --rw="$1" --direct=1 --ioengine=io_uring \
      --iodepth=16 --output-format=terse 2>/dev/null
}

median() {  # value...
  printf '%s\n' "$@" | sort -g |
    awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'
}

bench_args() {  # [dir] [size] [extra...]
  dir=${1:-${TMPDIR:-/tmp}}
  size=${2:-2G}
  extra=("${@:3}")
  bench=${ZPS_BENCH:-build/bin/zps-bench}
  rounds=${ROUNDS:-2}
}

bench_workdir() {  # name
  work=$(mktemp -d "$dir/zps-bench-$1.XXXXXX")
  trap 'rm -rf "$work"' EXIT
}
