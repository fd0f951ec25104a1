#!/usr/bin/env bash
# Crash recovery: 2 zps-server shards (with --data-dir, --checkpoint-every 5) x 2 zps-train
# workers, real processes on loopback. In each scenario one shard is SIGKILLed at a named point
# (ZPS_TEST_CRASH_AT=<point>:<step> makes the process raise SIGKILL there) or by timing, then
# restarted with the same --data-dir; the job must finish with every chunk's CRC (master, m, v,
# serving copy) equal to an uninterrupted run's. Prints the recovery time of each scenario (kill
# -> first resumed step done on rank 0). Usage: recovery.sh BIN_DIR [scenario...]
# ZPS_RECOVERY_SHARD_ARGS: extra zps-server flags (e.g. "--memory-budget 168KiB": the same
# scenarios with master, m and v mostly spilled to <data-dir>/spill; every shard log must then
# show spilled chunks). ZPS_RECOVERY_MODEL_ARGS: extra model flags (e.g. "--chunk-elems 2048").
#
# Scenarios run only when named (not in the default set):
#   corrupt-restarted  shard 1 dies at step 17; its newest checkpoint (15) is corrupted on disk
#                      before the restart: it must offer 10, and the job rolls back to 10.
#   corrupt-survivor   shard 1 dies at step 17; shard 0's checkpoint 15 (the coordinator's target,
#                      complete on every shard) is corrupted while it runs: its restore meets
#                      DATA_LOSS, it reports 15 unusable, and the job rolls back to 10.
#   speculate          (with --update speculative) shard 1 dies inside the speculation of step
#                      12, or of the first step after it that speculates a chunk (a step whose
#                      chunks were all dequeued before its commit order was armed, or found no
#                      spare free, speculates none): chunks updated into spares, the step not
#                      yet decided.
#   checkpoint-background  shard 1 dies in the middle of its background write of checkpoint 10,
#                      after it has applied step 10 (copy-on-write exercised); its newest
#                      complete checkpoint is then 5.
#   disk-full          shard 1's --data-dir is a small tmpfs that holds one checkpoint: from
#                      checkpoint 10 on its checkpoints fail (disk full, logged with the directory),
#                      none is counted complete, training goes on; then the coordinator shard dies
#                      at step 17 and the job rolls back to 5, the last complete one. Exits 77
#                      (skipped) where a tmpfs cannot be mounted.
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
bin=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
steps=30
model=(--steps "$steps" --d-model 32 --n-layers 4 --n-heads 2 --d-ff 64 --seq-len 32 --batch 4
       --chunk-elems 8192 --world-size 2 --shards 2 --max-grad-norm 0.05)
# shellcheck disable=SC2206  # word splitting of the extra flags is intended
[[ -n ${ZPS_RECOVERY_MODEL_ARGS:-} ]] && model+=(${ZPS_RECOVERY_MODEL_ARGS})
mounts=()
unmount_all() {
  for m in "${mounts[@]}"; do umount -l "$m" 2>/dev/null || true; done
}
work_init recovery-test-token
on_cleanup unmount_all
lib_poll_s=0.02  # wait_exit
job_op_timeout=20
job_log_every=1
job_join_timeout=120

reference_crcs "${model[@]}"

declare -A shard_pid
start_shard() {  # dir ordinal crash-spec
  local dir=$1 i=$2 crash=$3
  # shellcheck disable=SC2086  # word splitting of the extra flags is intended
  start_loopback_shard "$dir" "$i" 2 "$crash" --data-dir "$dir/shard$i" --checkpoint-every 5 \
    --step-timeout 60 ${ZPS_RECOVERY_SHARD_ARGS:-}
}

# The whole job's recovery, in order, for a failed scenario: the coordinator's (shard 0's)
# registrations, losses, rollbacks and joins, and each shard's kill line and restore.
recovery_timeline() {  # the scenario's dir
  echo "--- recovery timeline (shard 0: the coordinator)"
  grep -hE "registered at|lost its control|job recovery|rolling back|job recovered|joined from|ZPS_TEST_CRASH_AT|restor|stops:" \
    "$1"/shard0.log "$1"/shard1.log 2>/dev/null | sort -k2,2 | tail -n 40 || true
}

# ---- hooks of the named scenarios (arguments: the scenario's dir) ----
newest_checkpoint() {  # shard dir -> the newest step zps-ckpt inspect lists
  "$bin/zps-ckpt" inspect --data-dir "$1/checkpoints" | awk '$1 ~ /^[0-9]+$/ {s=$1} END {print s}'
}
corrupt_newest() {  # shard dir: flips a byte of a tensor of its newest checkpoint, on disk
  local step
  step=$(newest_checkpoint "$1")
  [[ $step == 15 ]] || { echo "(newest checkpoint of $1 is '$step', expected 15)"; return 1; }
  python3 "$here/corrupt_checkpoint.py" "$1/checkpoints" "$step"
}
corrupt_restarted() { corrupt_newest "$1/shard1"; }
corrupt_survivor() { corrupt_newest "$1/shard0"; }
expect_log() {  # file extended-regex what
  grep -Eq "$2" "$1" || { echo "(missing in $(basename "$1"): $3)"; return 1; }
}
check_corrupt_restarted() {
  expect_log "$1/shard1.log" "checkpoint of step 15 in .* is corrupt \(DATA_LOSS: .*CRC32C" \
    "shard 1 names checkpoint 15 and the DATA_LOSS" &&
  expect_log "$1/shard0.log" "rolling back to step 10" "the job rolls back to 10"
}
check_corrupt_survivor() {
  expect_log "$1/shard0.log" "cannot load checkpoint 15, the coordinator's recovery target \(DATA_LOSS" \
    "shard 0 names checkpoint 15 and the DATA_LOSS" &&
  expect_log "$1/shard0.log" "cannot load checkpoint 15; choosing an older one" \
    "the coordinator picks again" &&
  expect_log "$1/shard0.log" "rolling back to step 10" "the job rolls back to 10" &&
  if [[ $(grep -c "checkpoint of step 15 complete on all" "$1/shard0.log") -lt 2 ]]; then
    echo "(checkpoint 15, taken again after the rollback, was not counted complete)"; return 1
  fi
}
mount_small_tmpfs() {  # shard 1's --data-dir on a tmpfs with room for one checkpoint
  mkdir -p "$1/shard1"
  local err
  if ! err=$(mount -t tmpfs -o "size=${ZPS_RECOVERY_TMPFS_SIZE:-640k}" tmpfs "$1/shard1" 2>&1); then
    echo "SKIP disk-full: cannot mount a tmpfs here (${err:-not permitted}); run as root to test it"
    exit 77
  fi
  mounts+=("$1/shard1")
}
check_disk_full() {
  expect_log "$1/shard1.log" "checkpoint of step 10 failed: RESOURCE_EXHAUSTED: checkpoint store $1/shard1/checkpoints: .*disk full.*training continues" \
    "shard 1's checkpoint 10 fails with disk full, naming the directory" &&
  expect_log "$1/shard0.log" "checkpoint of step 5 complete on all 2 shards" "checkpoint 5 completes" &&
  expect_log "$1/shard0.log" "rolling back to step 5" "the job rolls back to 5, the last complete checkpoint" &&
  if grep -Eq "checkpoint of step ([1-9][0-9]+) complete" "$1/shard0.log"; then
    echo "(a checkpoint shard 1 failed was counted complete)"; return 1
  fi
}

# The step each scenario must resume from (a regex): the newest checkpoint complete on every
# shard before the kill (checkpoints every 5 steps). Without this a scenario would pass even if
# every recovery restarted from step 0. With checkpoints written in the background (the
# default, unless ZPS_RECOVERY_SHARD_ARGS has --checkpoint-mode sync), the newest one may not
# have committed by the kill, so the checkpoint before it (5 steps older) is accepted too.
declare -A expect_resume=(
  [push]='10' [update]='5' [checkpoint]='5' [coordinator]='15' [after-checkpoint]='15'
  [timing]='15|20' [start-over]='0' [sigterm]='1[2-9]|2[0-9]'
  [corrupt-restarted]='10' [corrupt-survivor]='10' [disk-full]='5'
  [speculate]='10' [checkpoint-background]='5')

scenario() {  # name victim point:step|timing:step [setup [before-restart [check]]]
  local name=$1 victim=$2 spec=$3 setup=${4:-} before_restart=${5:-} check=${6:-}
  local dir=$work/$name
  mkdir -p "$dir"
  [[ -z $setup ]] || $setup "$dir"
  port=([0]=$(free_port) [1]=$(free_port))
  local crash=""
  [[ $spec != timing:* ]] && crash=$spec
  for i in 0 1; do
    if [[ $i -eq $victim ]]; then start_shard "$dir" "$i" "$crash"; else start_shard "$dir" "$i" ""; fi
  done
  start_job_workers "$dir" 2 "$steps"
  local out=$dir/worker0.$steps.out  # rank 0's steps, recovery line and CRCs
  if [[ $spec == sigterm:* ]]; then
    # On-demand checkpoint (zps-ckpt save), then a clean stop of both shards (SIGTERM: each
    # writes a shutdown checkpoint), then both restart from their --data-dir.
    local at=${spec#sigterm:}
    wait_grep "$out" "^step +$at " 60 0.01 || { scenario_fail "$name" "step $at never reached"; return; }
    if ! "$bin/zps-ckpt" save --endpoint "127.0.0.1:${port[0]}" --token-file "$work/token" \
         --timeout 30 > "$dir/save.out" 2>&1; then
      scenario_fail "$name" "zps-ckpt save: $(cat "$dir/save.out")"; return
    fi
    echo "  $name: zps-ckpt save: $(cat "$dir/save.out")"
    kill -TERM "${shard_pid[0]}" "${shard_pid[1]}"
    wait_exit "${shard_pid[0]}" 20 && wait_exit "${shard_pid[1]}" 20 || {
      scenario_fail "$name" "shards did not stop on SIGTERM"; return; }
    grep -h "shutdown checkpoint" "$dir"/shard*.log | sed "s/^/  $name: /" || true
    start_shard "$dir" 0 ""
    victim=1
  elif [[ $spec == timing:* ]]; then
    local at=${spec#timing:}
    wait_grep "$out" "^step +$at " 60 0.01 || { scenario_fail "$name" "step $at never reached"; return; }
    kill -9 "${shard_pid[$victim]}"
    # The workers may have run past step $at before the kill landed (a loaded machine), so the
    # newest checkpoint may be later than the one before $at: accept every multiple of 5 from
    # 15 up to the step worker 0 had printed by then (plus one period, for a print that lags
    # its step's commit).
    local last
    last=$(grep -Eo '^step +[0-9]+ ' "$out" | tail -n 1 | grep -Eo '[0-9]+')
    local accept=15 s
    for ((s = 20; s <= ${last:-$at} + 5; s += 5)); do accept+="|$s"; done
    expect_resume[$name]=$accept
  fi
  if ! wait_exit "${shard_pid[$victim]}" 60; then
    scenario_fail "$name" "shard $victim did not die at $spec"
    dump_logs 12 "$out" "$dir"/worker*.err "$dir"/shard0.log "$dir"/shard1.log
    recovery_timeline "$dir"
    return
  fi
  # A named kill point: the victim must have died there (its own log line), not elsewhere.
  if [[ -n $crash && $spec != sigterm:* ]] && ! grep -q "ZPS_TEST_CRASH_AT=$crash: killing this process" "$dir/shard$victim.log"; then
    scenario_fail "$name" "shard $victim exited, but not at $crash"
    tail -n 12 "$dir/shard$victim.log"
    return
  fi
  # <point>:<step>+ (the first time the point is reached at that step or later): the newest
  # checkpoint before the step it died in, a multiple of 5, is the one to resume from.
  if [[ $crash == *+ ]]; then
    local died
    died=$(grep -Eo "killing this process at ${crash%%:*}:[0-9]+" "$dir/shard$victim.log" | grep -Eo '[0-9]+$')
    expect_resume[$name]=$(( (died - 1) / 5 * 5 ))
    echo "  $name: shard $victim died at ${crash%%:*}:$died"
  fi
  local t_kill
  t_kill=$(now_ms)
  wait "${shard_pid[$victim]}" 2>/dev/null || true
  if [[ -n $before_restart ]] && ! $before_restart "$dir"; then
    scenario_fail "$name" "$before_restart"
    return
  fi
  start_shard "$dir" "$victim" ""
  local ok=1
  join_job_workers || ok=0
  kill -TERM "${shard_pid[0]}" "${shard_pid[1]}" 2>/dev/null || true
  wait_exit "${shard_pid[0]}" 20 || true
  wait_exit "${shard_pid[1]}" 20 || true
  grep '^chunk_crc' "$out" > "$dir/dist.crc" || true
  local resumed
  resumed=$(grep -m1 '^recovery:' "$out" || true)
  local rec_ms="?"
  if [[ $resumed =~ unix_ms\ ([0-9]+) ]]; then rec_ms=$(( BASH_REMATCH[1] - t_kill )); fi
  if [[ ${ZPS_RECOVERY_SHARD_ARGS:-} == *memory-budget* ]]; then  # the state must really spill
    for i in 0 1; do
      grep -Eq 'chunk states in RAM, [1-9][0-9]* spilled' "$dir/shard$i.log" || {
        echo "(shard $i did not spill: $(grep -m1 'memory budget' "$dir/shard$i.log" || echo 'no store'))"
        ok=0; }
    done
  fi
  if [[ ${ZPS_RECOVERY_SHARD_ARGS:-} == *"--serving-copies on-fetch"* ]]; then  # none kept
    for i in 0 1; do
      grep -q 'no serving copies kept; fetches convert the masters' "$dir/shard$i.log" || {
        echo "(shard $i kept its serving copies)"; ok=0; }
    done
  fi
  if [[ ${ZPS_RECOVERY_SHARD_ARGS:-} == *checkpoint-pace* ]]; then  # the writes must be paced
    grep -Eq 'checkpoint of step [0-9]+: written in the background over [0-9.e-]+ s' "$dir"/shard*.log || {
      echo "(no shard paced a background checkpoint)"; ok=0; }
  fi
  if [[ -n $check ]] && ! $check "$dir"; then ok=0; fi
  local resumed_at=""
  [[ $resumed =~ resumed\ at\ step\ ([0-9]+) ]] && resumed_at=${BASH_REMATCH[1]}
  local older=""
  [[ $resumed_at =~ ^[0-9]+$ && ${ZPS_RECOVERY_SHARD_ARGS:-} != *"--checkpoint-mode sync"* ]] &&
    older=$((resumed_at + 5))
  if ! [[ $resumed_at =~ ^(${expect_resume[$name]})$ ]] &&
     ! [[ -n $older && $older =~ ^(${expect_resume[$name]})$ ]]; then
    echo "(resumed at step '${resumed_at}', expected ${expect_resume[$name]})"
    ok=0
  fi
  if [[ $ok -eq 1 ]] && [[ -n $resumed ]] && diff -q "$work/ref.crc" "$dir/dist.crc" > /dev/null; then
    echo "PASS $name: shard $victim killed at $spec; ${resumed#recovery: }; recovery time (kill -> first resumed step) ${rec_ms} ms; $(wc -l < "$dir/dist.crc") chunks bit-identical"
  else
    scenario_fail "$name" "shard $victim killed at $spec (workers ok=$ok, resumed='${resumed}')"
    dump_logs 12 "$dir"/worker*.err "$dir"/shard0.log "$dir"/shard1.log
    recovery_timeline "$dir"
    diff "$work/ref.crc" "$dir/dist.crc" | head -5 || true
  fi
}

all=(push update checkpoint coordinator after-checkpoint timing start-over sigterm)
sel=("$@")
[[ ${#sel[@]} -eq 0 ]] && sel=("${all[@]}")
for s in "${sel[@]}"; do
  case $s in
    push) scenario push 1 push:12 ;;                         # during a push of step 12
    update) scenario update 1 update:8 ;;                    # decided, update not applied
    checkpoint) scenario checkpoint 1 checkpoint:10 ;;       # half-written checkpoint 10
    coordinator) scenario coordinator 0 decide:17 ;;         # the coordinator shard, deciding
    after-checkpoint) scenario after-checkpoint 0 after-checkpoint:15 ;;  # committed, unreported
    timing) scenario timing 1 timing:22 ;;                   # plain kill -9 while training
    start-over) scenario start-over 1 push:3 ;;              # before any checkpoint: from step 0
    sigterm) scenario sigterm 1 sigterm:12 ;;                # save on demand, clean stop, restart
    corrupt-restarted) scenario corrupt-restarted 1 push:17 "" corrupt_restarted check_corrupt_restarted ;;
    corrupt-survivor) scenario corrupt-survivor 1 push:17 "" corrupt_survivor check_corrupt_survivor ;;
    disk-full) scenario disk-full 0 push:17 mount_small_tmpfs "" check_disk_full ;;
    speculate) scenario speculate 1 speculate:12+ ;;  # a step may pass with no chunk speculated
    checkpoint-background) scenario checkpoint-background 1 checkpoint-background:10 ;;
    *) echo "unknown scenario $s"; exit 2 ;;
  esac
done
scenarios_done "every scenario ended bit-identical to the uninterrupted run"
