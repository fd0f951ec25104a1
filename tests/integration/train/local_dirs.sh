#!/usr/bin/env bash
# zps-train's local mode puts its cluster directory (logs, token, the shards' spill files) where
# the user says, and says why a shard stopped. Usage: local_dirs.sh BIN_DIR SCENARIO
#   dirs       the cluster directory follows TMPDIR, then ZPS_WORK_DIR, then --work-dir (each
#              over the one before); spill files land in it; a clean run removes it; a missing
#              --work-dir is an error naming it; a --shard-memory-budget too small for the spill
#              pipeline is refused before any process starts, with the shards' own advice.
#   disk-full  --work-dir is a 20 MB tmpfs (mounted in a private mount namespace, unshare -m)
#              that cannot hold the spill file: the run fails with the shard's own
#              RESOURCE_EXHAUSTED "disk full" and its log path, and keeps the directory. Exits 77
#              (skipped) where a tmpfs cannot be mounted.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
bin=$1
scenario=$2
tiny=(--d-model 32 --n-layers 4 --n-heads 2 --d-ff 64 --seq-len 32 --batch 4 --steps 2
      --world-size 1 --shards 2 --ucx-tls tcp --log-every 1)
# 2048-element chunks: 24 KiB AdamW state records, so the spill pipeline needs 5 x 24 KiB.
spill=(--chunk-elems 2048 --shard-memory-budget 168KiB)
work_init

# Runs the tiny job in local mode with its state spilled, and ARGS, its output in OUT; sets `dir`
# to the cluster directory the run printed. The caller's environment reaches zps-train.
spill_run() {  # out [zps-train args...]
  local out=$1
  shift
  "$bin/zps-train" --mode local "${tiny[@]}" "${spill[@]}" "$@" > "$out"
  dir=$(sed -n 's/.*(logs in \(.*\))$/\1/p' "$out" | head -1)
}

# The shards remove their spill files as they stop; their logs say where they were.
spilled_into_dir() {  # shard
  grep -q "spill files [0-9]* + 0 bytes in $dir/shard-$1-data/spill " "$dir/shard-$1.log" \
    || fail "shard $1 did not spill into $dir"
}

case $scenario in
  dirs)
    mkdir -p "$work/tmp" "$work/env" "$work/flag"
    echo "== TMPDIR"
    TMPDIR=$work/tmp ZPS_KEEP_CLUSTER_LOGS=1 spill_run "$work/a.out"
    [[ $dir == "$work/tmp/zps-local-"* && -d $dir ]] || fail "TMPDIR not followed: '$dir'"
    spilled_into_dir 0
    echo "ok: $dir"

    echo "== ZPS_WORK_DIR over TMPDIR"
    TMPDIR=$work/tmp ZPS_WORK_DIR=$work/env spill_run "$work/b.out"
    [[ $dir == "$work/env/zps-local-"* ]] || fail "ZPS_WORK_DIR not followed: '$dir'"
    [[ ! -e $dir ]] || fail "a clean run left $dir behind"
    echo "ok: $dir (removed after the clean run)"

    echo "== --work-dir over ZPS_WORK_DIR"
    TMPDIR=$work/tmp ZPS_WORK_DIR=$work/env ZPS_KEEP_CLUSTER_LOGS=1 spill_run "$work/c.out" \
      --work-dir "$work/flag"
    [[ $dir == "$work/flag/zps-local-"* && -d $dir ]] || fail "--work-dir not followed: '$dir'"
    spilled_into_dir 1
    echo "ok: $dir"

    echo "== a missing --work-dir"
    if "$bin/zps-train" --mode local "${tiny[@]}" --work-dir "$work/nope" 2> "$work/d.err"; then
      fail "a missing --work-dir was accepted"
    fi
    grep -q "NOT_FOUND: the work directory $work/nope does not exist" "$work/d.err" \
      || fail "unexpected error: $(cat "$work/d.err")"
    echo "ok: $(cat "$work/d.err")"

    echo "== a budget too small for the spill pipeline"
    mkdir "$work/budget"
    if "$bin/zps-train" --mode local "${tiny[@]}" --chunk-elems 2048 \
        --shard-memory-budget 100KiB --work-dir "$work/budget" > "$work/e.out" 2> "$work/e.err"; then
      fail "a budget below the pipeline was accepted"
    fi
    advice="RESOURCE_EXHAUSTED: --shard-memory-budget: shard 0: memory_budget 102400 bytes cannot"
    advice+=" hold the spill pipeline's 5 buffers of 24576 bytes (one per chunk in flight); raise"
    advice+=" the budget to at least 122880 bytes, or lower the chunk size"
    grep -qF "$advice" "$work/e.err" || fail "unexpected error: $(cat "$work/e.err")"
    [[ -z $(ls -A "$work/budget") ]] || fail "processes were started: $(ls "$work/budget")"
    echo "ok: $(cat "$work/e.err")"
    ;;
  disk-full)
    mnt=$work/small
    mkdir "$mnt"
    if ! err=$(unshare -m sh -c "mount -t tmpfs -o size=1m tmpfs '$mnt'" 2>&1); then
      echo "SKIP disk-full: cannot mount a tmpfs in a private mount namespace (${err:-not permitted})"
      exit 77
    fi
    # 1 shard with 3.3 M parameters: a 40 MB spill file that a 20 MB tmpfs cannot hold.
    big=(--d-model 256 --n-layers 4 --n-heads 4 --d-ff 1024 --seq-len 32 --batch 2 --steps 2
         --world-size 1 --shards 1 --ucx-tls tcp --chunk-elems 65536 --shard-memory-budget 4MiB)
    rc=0
    unshare -m sh -c "mount -t tmpfs -o size=20m tmpfs '$mnt' && \
      '$bin/zps-train' --mode local ${big[*]} --work-dir '$mnt' > '$work/f.out' \
      2> '$work/f.err'; rc=\$?; ls '$mnt'/zps-local-*/shard-0.log >> '$work/f.err'; exit \$rc" \
      || rc=$?
    cat "$work/f.out" "$work/f.err"
    grep -qE "shard-0 stopped early \(exit code 1\): RESOURCE_EXHAUSTED: spill file: fallocate [0-9]+ bytes for $mnt/zps-local-[^ ]*/shard-0-data/spill/shard-0-state.zps: disk full" \
      "$work/f.err" || fail "the shard's own reason is not in the error"
    grep -qE "its log: $mnt/zps-local-[^ ]*/shard-0.log" "$work/f.err" || fail "no log path"
    grep -qE "the cluster directory $mnt/zps-local-[^ ]* is kept" "$work/f.err" \
      || fail "the cluster directory is not said to be kept"
    grep -qE "^$mnt/zps-local-[^ ]*/shard-0.log$" "$work/f.err" || fail "the directory is gone"
    [[ $rc -eq 1 ]] || fail "zps-train exited with $rc, not 1"
    ;;
  *) echo "unknown scenario $scenario"; exit 2 ;;
esac
echo "PASS: $scenario"
