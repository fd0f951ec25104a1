#!/usr/bin/env bash
# Resharding (zps-ckpt reshard): a job that runs 20 steps on N shards, is resharded offline to M
# shards and runs 20 more must end with exactly the bytes of `zps-ckpt export` after 40 steps on
# 2 shards, and with every chunk's master, m, v and serving CRC equal to that run's. Real
# zps-server and zps-train processes on loopback (2 workers), an lr schedule, dynamic loss scaling
# with an overflow skipped at step 5 (so the optimizer step differs from the step), clipping.
# Each phase ends with the workers done and the shards stopped by SIGTERM (their checkpoint of
# the phase's last step on disk).
# Usage: reshard.sh BIN_DIR [scenario...]
#   2to3 3to1 1to4   20 steps on N shards, reshard, 20 on M
#   kill             2to3, with shard 1 of the 3 SIGKILLed during a push of step 20 (the first
#                    after the resume) and restarted: the job rolls back to the resharded
#                    checkpoint 20 and still ends bit-identical
#   convert          20 steps with fp32 state, the moments converted to int8 (--state-dtype), 20
#                    more on 2 and on 3 shards: the two end bit-identical
#   baseline         only the 40-step run on 2 shards (the reference of the others)
#   bad-input        bad inputs leave every store as it was, with a clear error: a store
#                    missing, stores of two jobs, a store of another step, a corrupt value, and
#                    a full disk (a 256 KiB tmpfs in a private mount namespace; skipped where it
#                    cannot be mounted)
# RESHARD_MODEL_ARGS: extra zps-train flags (e.g. "--reduction pre-reduced"); RESHARD_SHARD_ARGS:
# extra zps-server flags (e.g. "--memory-budget 168KiB": state spilled to <data-dir>/spill).
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
bin=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
model=(--d-model 32 --n-layers 4 --n-heads 2 --d-ff 64 --seq-len 32 --batch 4 --chunk-elems 8192
       --world-size 2 --max-grad-norm 0.05 --lr-schedule WarmupCosineLR --warmup-num-steps 12
       --warmup-type linear --total-num-steps 40 --loss-scaling --initial-loss-scale 1024
       --inject-overflow-step 5)
# shellcheck disable=SC2206  # word splitting of the extra flags is intended
[[ -n ${RESHARD_MODEL_ARGS:-} ]] && model+=(${RESHARD_MODEL_ARGS})
work_init reshard-test-token
lib_poll_s=0.02
job_op_timeout=20  # the kill scenario's workers see the dead shard after this
mounts=()
unmount_all() {
  for m in "${mounts[@]}"; do umount -l "$m" 2>/dev/null || true; done
}
on_cleanup unmount_all

declare -A shard_pid
port=()
start_shard() {  # dir ordinal shards [crash-spec]
  # shellcheck disable=SC2086  # word splitting of the extra flags is intended
  start_job_shard "$1" "$2" "$3" "${4:-}" ${RESHARD_SHARD_ARGS:-}
}

# One phase of the job: N shards on DIR/s0..s<N-1>, 2 workers up to STEPS, then the shards
# stopped. Optionally shard 1 is started with ZPS_TEST_CRASH_AT=CRASH and restarted after it dies.
phase() {  # dir shards steps [crash-spec]
  local dir=$1 n=$2 steps=$3 crash=${4:-}
  mkdir -p "$dir"
  port=()
  local i
  for ((i = 0; i < n; i++)); do port[i]=$(free_port); done
  for ((i = 0; i < n; i++)); do
    if [[ $i -eq 1 ]]; then start_shard "$dir" "$i" "$n" "$crash"; else start_shard "$dir" "$i" "$n"; fi
  done
  start_job_workers "$dir" "$n" "$steps"
  if [[ -n $crash ]]; then
    if ! wait_exit "${shard_pid[1]}" 60; then
      echo "(shard 1 did not die at $crash)"; return 1
    fi
    grep -q "ZPS_TEST_CRASH_AT=$crash: killing this process" "$dir/shard1.log" || {
      echo "(shard 1 exited, but not at $crash)"; return 1; }
    wait "${shard_pid[1]}" 2>/dev/null || true
    start_shard "$dir" 1 "$n"
  fi
  finish_job "$dir" "$n" "$steps"
}

reshard() {  # from-dir from-shards to-dir to-shards
  "$bin/zps-ckpt" reshard --data-dir "$(stores "$1" "$2")" --out "$(stores "$3" "$4")" \
    > "$3.reshard.out" 2>&1 || { cat "$3.reshard.out"; return 1; }
  cat "$3.reshard.out"
}

# The uninterrupted run: 40 steps on 2 shards.
baseline() {
  [[ -f $work/base.safetensors ]] && return 0
  phase "$work/base" 2 40 || fail "the 40-step run on 2 shards failed"
  export_model "$work/base" 2 "$work/base.safetensors"
  [[ $(wc -l < "$work/base/final.crc") -ge 4 ]] || fail "too few chunk CRCs in the 40-step run"
  echo "baseline: 40 steps on 2 shards, $(wc -l < "$work/base/final.crc") chunks"
}

# The job went back to step 20 after the kill: worker 0 saw the failure and resumed there, or
# (a worker 0 that joined only after the kill, which the other rank's pushes set off) the
# coordinator rolled the job back to step 20 after the kill's own log line.
recovered_to_20() {  # dir crash-spec
  grep -q "^recovery: resumed at step 20" "$1/worker0.40.out" && return 0
  local killed last
  killed=$(grep -h "ZPS_TEST_CRASH_AT=$2: killing this process" "$1/shard1.log" | awk '{print $2}')
  last=$(grep -h "rolling back to step" "$1/shard0.log" | tail -n 1)
  [[ -n $killed && $last == *"rolling back to step 20" && $(awk '{print $2}' <<< "$last") > $killed ]]
}

scenario() {  # name from to [crash-spec]
  local name=$1 from=$2 to=$3 crash=${4:-}
  local d=$work/$name
  baseline
  phase "$d/a" "$from" 20 || { scenario_fail "$name" "the first 20 steps on $from shards"; return; }
  reshard "$d/a" "$from" "$d/b" "$to" | sed "s/^/  $name: /" ||
    { scenario_fail "$name" "zps-ckpt reshard failed"; return; }
  phase "$d/b" "$to" 40 "$crash" || { scenario_fail "$name" "the last 20 steps on $to shards"; return; }
  grep -q "joined the job at step 20" "$d/b/worker0.40.err" ||
    { scenario_fail "$name" "the workers did not resume at step 20: $(grep -m1 'joined' "$d/b/worker0.40.err")"; return; }
  if [[ -n $crash ]] && ! recovered_to_20 "$d/b" "$crash"; then
    scenario_fail "$name" "no recovery to step 20 after the kill: $(grep -m1 '^recovery' "$d/b/worker0.40.out" || echo none)"
    return
  fi
  if [[ ${RESHARD_SHARD_ARGS:-} == *memory-budget* ]]; then
    grep -Eq 'chunk states in RAM, [1-9][0-9]* spilled' "$d/b/shard0.log" ||
      { scenario_fail "$name" "shard 0 of the resumed job did not spill"; return; }
  fi
  matches_baseline "$name" "$d/b" "$to" "after 20 steps on $from + 20 on $to shards" || return 0
  echo "PASS $name: 20 steps on $from shards, reshard, 20 on $to${crash:+ (shard 1 killed at $crash)}: export and $(wc -l < "$d/b/final.crc") chunk CRCs equal 40 steps on 2"
}

# ---- a change of state dtype ----
last_loss() {  # worker output: the loss of its last step line
  awk '$1 == "step" {l = $4} END {print l}' "$1"
}

# 20 steps with fp32 state on 2 shards, then the moments converted to int8 by zps-ckpt reshard
# --state-dtype int8, onto 2 shards and onto 3, and 20 more steps with int8 state on each. The two
# resumed jobs must end bit-identical (the conversion does not depend on the shard count), their
# checkpoints must hold int8 moments, and their last loss must be within 5% of the fp32 run's.
convert() {
  local d=$work/convert to out
  baseline
  phase "$d/a" 2 20 || { scenario_fail convert "the first 20 steps"; return; }
  for to in 2 3; do
    out=$("$bin/zps-ckpt" reshard --data-dir "$(stores "$d/a" 2)" --out "$(stores "$d/b$to" "$to")" \
      --state-dtype int8 2> "$d/reshard$to.err") ||
      { scenario_fail convert "zps-ckpt reshard --state-dtype int8: $(cat "$d/reshard$to.err")"; return; }
    echo "  convert: $out"
    [[ $out == *"moments converted from fp32 to int8"* ]] ||
      { scenario_fail convert "the reshard did not report the conversion"; return; }
  done
  local saved=("${model[@]}")
  model+=(--state-dtype int8)
  phase "$d/b2" 2 40 || { model=("${saved[@]}"); scenario_fail convert "20 int8 steps on 2 shards"; return; }
  phase "$d/b3" 3 40 || { model=("${saved[@]}"); scenario_fail convert "20 int8 steps on 3 shards"; return; }
  model=("${saved[@]}")
  for to in 2 3; do
    grep -q "joined the job at step 20" "$d/b$to/worker0.40.err" ||
      { scenario_fail convert "the int8 job on $to shards did not resume at step 20"; return; }
    "$bin/zps-ckpt" inspect --data-dir "$d/b$to/s0/checkpoints" > "$d/b$to.inspect" 2> /dev/null
    grep -Eq '^ *40 .*int8' "$d/b$to.inspect" ||
      { scenario_fail convert "checkpoint 40 on $to shards does not hold int8 moments: $(cat "$d/b$to.inspect")"; return; }
    export_model "$d/b$to" "$to" "$d/b$to.safetensors"
  done
  cmp -s "$d/b2.safetensors" "$d/b3.safetensors" && diff -q "$d/b2/final.crc" "$d/b3/final.crc" > /dev/null ||
    { scenario_fail convert "the int8 jobs on 2 and 3 shards differ"; return; }
  local base int8
  base=$(last_loss "$work/base/worker0.40.out")
  int8=$(last_loss "$d/b2/worker0.40.out")
  awk -v a="$base" -v b="$int8" 'BEGIN {d = (b - a) / a; exit !(d < 0.05 && d > -0.05)}' ||
    { scenario_fail convert "the int8 job's last loss $int8 is not within 5% of the fp32 run's $base"; return; }
  echo "PASS convert: fp32 moments converted to int8 at step 20; 20 more steps on 2 and on 3 shards end bit-identical ($(wc -l < "$d/b2/final.crc") chunk CRCs), last loss $int8 against fp32 state's $base"
}

# ---- bad input ----
expect_refused() {  # name expected-regex inputs outputs
  local name=$1 re=$2 in=$3 out=$4 before after rc=0 o fresh=()
  before=$(for d in ${in//,/ }; do tree_sum "$d"; done)
  for o in ${out//,/ }; do [[ -e $o ]] || fresh+=("$o"); done
  "$bin/zps-ckpt" reshard --data-dir "$in" --out "$out" > "$work/refused.out" 2>&1 || rc=$?
  after=$(for d in ${in//,/ }; do tree_sum "$d"; done)
  local msg
  msg=$(cat "$work/refused.out")
  if [[ $rc -ne 1 ]]; then scenario_fail "bad-input/$name" "exit status $rc, expected 1: $msg"; return; fi
  if ! grep -Eq "$re" "$work/refused.out"; then
    scenario_fail "bad-input/$name" "the error does not match /$re/: $msg"; return
  fi
  if [[ $before != "$after" ]]; then scenario_fail "bad-input/$name" "an input store changed"; return; fi
  for o in "${fresh[@]}"; do
    if [[ -e $o ]] && [[ -n $(ls -A "$o") ]]; then
      scenario_fail "bad-input/$name" "output $o was left behind"; return
    fi
  done
  if [[ ${fresh[0]:-} == "${out%%,*}" && -e $(dirname "${out%%,*}")/coordinator ]]; then
    scenario_fail "bad-input/$name" "a coordinator catalog was left behind"; return
  fi
  echo "PASS bad-input/$name: $msg"
}

bad_input() {
  local d=$work/bad
  phase "$d/a" 2 10 || { scenario_fail bad-input "the 10-step run"; return; }
  # Another job of the same model (the same layout): another lr.
  local saved=("${model[@]}")
  model+=(--lr 0.002)
  phase "$d/other" 2 10 || { scenario_fail bad-input "the other job's run"; model=("${saved[@]}"); return; }
  model=("${saved[@]}")
  cp -a "$d/a/s1" "$d/stale-s1"  # shard 1's store at step 10
  phase "$d/a" 2 20 || { scenario_fail bad-input "steps 10..20"; return; }
  cp -a "$d/a/s1" "$d/corrupt-s1"
  python3 "$here/../recovery/corrupt_checkpoint.py" "$d/corrupt-s1/checkpoints" 20 > /dev/null ||
    { scenario_fail bad-input "could not corrupt a value"; return; }
  local out="$d/new/s0/checkpoints,$d/new/s1/checkpoints,$d/new/s2/checkpoints"
  expect_refused missing-store "INVALID_ARGUMENT: .*store of shard 1 is missing" \
    "$d/a/s0/checkpoints" "$out"
  expect_refused two-jobs "INVALID_ARGUMENT: .*stores of two different jobs" \
    "$d/a/s0/checkpoints,$d/other/s1/checkpoints" "$out"
  expect_refused wrong-step "INVALID_ARGUMENT: .*newest checkpoints are of different steps .*stale-s1/checkpoints 10" \
    "$d/a/s0/checkpoints,$d/stale-s1/checkpoints" "$out"
  expect_refused corrupt-value "DATA_LOSS: .*outputs were removed.*CRC32C mismatch" \
    "$d/a/s0/checkpoints,$d/corrupt-s1/checkpoints" "$out"
  expect_refused output-not-empty "FAILED_PRECONDITION: .*exists and is not empty" \
    "$d/a/s0/checkpoints,$d/a/s1/checkpoints" "$d/other/s0/checkpoints,$d/new/s1/checkpoints"
  # A full disk: the outputs on a 256 KiB tmpfs (the state is ~1 MiB), in a private mount
  # namespace so that nothing outside sees it.
  mkdir -p "$d/full"
  if ! private_tmpfs 256k "$d/full"; then
    echo "SKIP bad-input/disk-full: cannot mount a tmpfs in a private mount namespace here"
    return
  fi
  local before after rc=0
  before=$(tree_sum "$d/a")
  "${mount_ns[@]}" sh -c "mount -t tmpfs -o size=256k tmpfs '$d/full' &&
    { '$bin/zps-ckpt' reshard --data-dir '$(stores "$d/a" 2)' \
        --out '$d/full/s0/checkpoints,$d/full/s1/checkpoints,$d/full/s2/checkpoints'; echo \"rc=\$?\";
      echo \"left=\$(ls -A '$d/full')\"; }" > "$work/full.out" 2>&1 || rc=$?
  after=$(tree_sum "$d/a")
  if grep -q "rc=1" "$work/full.out" && grep -Eq "RESOURCE_EXHAUSTED: .*outputs were removed.*disk full" "$work/full.out" &&
     grep -qx "left=" "$work/full.out" && [[ $before == "$after" ]]; then
    echo "PASS bad-input/disk-full: $(grep -m1 'zps-ckpt reshard:' "$work/full.out")"
  else
    scenario_fail "bad-input/disk-full" "expected RESOURCE_EXHAUSTED, the outputs removed, the inputs unchanged: $(tail -n 5 "$work/full.out")"
  fi
}

all=(2to3 3to1 1to4)
sel=("$@")
[[ ${#sel[@]} -eq 0 ]] && sel=("${all[@]}")
for s in "${sel[@]}"; do
  case $s in
    2to3) scenario 2to3 2 3 ;;
    3to1) scenario 3to1 3 1 ;;
    1to4) scenario 1to4 1 4 ;;
    kill) scenario kill 2 3 push:20 ;;
    bad-input) bad_input ;;
    convert) convert ;;
    baseline) baseline ;;
    *) echo "unknown scenario $s"; exit 2 ;;
  esac
done
scenarios_done "resharded jobs ended bit-identical; bad input changed nothing"
