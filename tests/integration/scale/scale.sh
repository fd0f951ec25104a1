#!/usr/bin/env bash
# Changing the shard count of a running release the way a StatefulSet does it
# (docs/operations-kubernetes.md, docs/checkpoints.md "Online"): each shard ordinal's data dir
# stands for its PersistentVolumeClaim and is kept from one phase to the next. The job runs on 4
# shards to step 20; the shards are stopped by SIGTERM (each writes its shutdown checkpoint); 8
# shards start with --shards 8 (ordinals 0-3 on their old volumes, 4-7 on empty ones) and move
# the checkpoint to the 8-shard layout by themselves (--reshard-peers), and the workers run to
# step 30; then 2 shards start with --shards 2, with a donor (--reshard-donor) serving each
# leaving ordinal's volume (2-7), and the job runs to step 40. The export and every chunk's
# master, m, v and serving CRCs must equal 40 uninterrupted steps on 2 shards.
# Real zps-server and zps-train processes on loopback (2 workers), an lr schedule, dynamic loss
# scaling with a skipped step, clipping.
# Usage: scale.sh BIN_DIR [scenario...]
#   4to8to2     the sequence above
#   crash       2 -> 3 with shard 1 killed after committing its new store (before its report)
#               and shard 0 killed right after the commit point; both restarted, the job still
#               resumes on 3 shards at step 20 and ends bit-identical at 40
#   bad-input   a donor that never comes (the new shards time out, their old stores unchanged
#               and the side stores removed), a store of another job among the volumes, and a
#               full disk under the side store (a 128 KiB tmpfs in a private mount namespace;
#               skipped where it cannot be mounted)
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
bin=$1
shift
model=(--d-model 32 --n-layers 4 --n-heads 2 --d-ff 64 --seq-len 32 --batch 4 --chunk-elems 2048
       --world-size 2 --max-grad-norm 0.05 --lr-schedule WarmupCosineLR --warmup-num-steps 12
       --warmup-type linear --total-num-steps 40 --loss-scaling --initial-loss-scale 1024
       --inject-overflow-step 5)
work_init scale-test-token
lib_poll_s=0.02

declare -A shard_pid
port=()
rport=()
peers=""
# Ports for ordinals 0..COUNT-1: the control plane and the reshard endpoint.
ports() {  # count
  local i
  port=()
  rport=()
  peers=""
  for ((i = 0; i < $1; i++)); do
    port[i]=$(free_port)
    rport[i]=$(free_port)
    peers+="${peers:+,}127.0.0.1:${rport[i]}"
  done
}

start_shard() {  # dir ordinal shards [extra flags...]; CRASH=point:step kills it there
  local dir=$1 i=$2 n=$3
  shift 3
  start_job_shard "$dir" "$i" "$n" "${CRASH:-}" --reshard-peers "$peers" --reshard-port "${rport[$i]}" "$@"
}

# Donors for the leaving ordinals FROM..TO-1 of DIR, for a job moving to SHARDS shards.
declare -A donor_pid
start_donors() {  # dir from to shards [extra flags...]
  local dir=$1 from=$2 to=$3 n=$4 k
  shift 4
  for ((k = from; k < to; k++)); do
    start_shard "$dir" "$k" "$n" --reshard-donor "$@"
    donor_pid[$k]=${shard_pid[$k]}
    unset "shard_pid[$k]"
  done
}

volumes_sum() {  # dir shards -> the checksums of the volumes s0..s<shards-1>
  local i
  for ((i = 0; i < $2; i++)); do tree_sum "$1/s$i"; done
}

# The uninterrupted run: 40 steps on 2 shards.
baseline() {
  [[ -f $work/base.safetensors ]] && return 0
  local d=$work/base i
  mkdir -p "$d"
  ports 2
  for i in 0 1; do start_shard "$d" "$i" 2; done
  run_job "$d" 2 40 || fail "the 40-step run on 2 shards failed"
  export_model "$d" 2 "$work/base.safetensors"
  [[ $(wc -l < "$d/final.crc") -ge 8 ]] || fail "too few chunk CRCs in the 40-step run"
  echo "baseline: 40 steps on 2 shards, $(wc -l < "$d/final.crc") chunks"
}

donors_done() {  # dir from to -> 0 when every donor exited 0 after the switch
  local dir=$1 k rc
  for ((k = $2; k < $3; k++)); do
    rc=0
    wait_exit "${donor_pid[$k]}" 30 || return 1
    wait "${donor_pid[$k]}" || rc=$?
    [[ $rc -eq 0 ]] || { echo "(donor $k exited $rc)"; return 1; }
    grep -q "donor of old shard $k exits" "$dir/shard$k.log" || return 1
  done
}

scale_4to8to2() {
  local name=4to8to2 d=$work/pvc i
  baseline
  mkdir -p "$d"
  ports 4
  for i in 0 1 2 3; do start_shard "$d" "$i" 4; done
  run_job "$d" 4 20 || { scenario_fail "$name" "the first 20 steps on 4 shards"; return; }
  # Scale up: ordinals 0-3 keep their volumes, 4-7 get empty ones.
  ports 8
  for i in 0 1 2 3 4 5 6 7; do start_shard "$d" "$i" 8; done
  run_job "$d" 8 30 || { scenario_fail "$name" "steps 20-30 on 8 shards"; return; }
  grep -q "joined the job at step 20" "$d/worker0.30.err" ||
    { scenario_fail "$name" "the workers did not resume at step 20 on 8 shards"; return; }
  grep -q "reshard: shard 0 resumes the job on 8 shards at checkpoint 20" "$d/shard0.log" ||
    { scenario_fail "$name" "shard 0 did not reshard to 8"; return; }
  for i in 1 2 3 4 5 6 7; do
    [[ ! -e $d/s$i/checkpoints.reshard ]] || { scenario_fail "$name" "s$i's side store was left"; return; }
  done
  # Scale down: ordinals 2-7 leave; a donor serves each of their volumes until the switch.
  ports 8
  for i in 0 1; do start_shard "$d" "$i" 2; done
  start_donors "$d" 2 8 2
  run_job "$d" 2 40 || { scenario_fail "$name" "steps 30-40 on 2 shards"; return; }
  donors_done "$d" 2 8 || { scenario_fail "$name" "a donor did not exit 0 after the switch"; return; }
  grep -q "joined the job at step 30" "$d/worker0.40.err" ||
    { scenario_fail "$name" "the workers did not resume at step 30 on 2 shards"; return; }
  matches_baseline "$name" "$d" 2 "after 4 -> 8 -> 2 shards" || return 0
  echo "PASS $name: 20 steps on 4 shards, 10 on 8, 10 on 2 (resharded by the shards, donors for 2-7): export and $(wc -l < "$d/final.crc") chunk CRCs equal 40 steps on 2"
}

scale_crash() {
  local name=crash d=$work/crash i
  baseline
  mkdir -p "$d"
  ports 2
  for i in 0 1; do start_shard "$d" "$i" 2; done
  run_job "$d" 2 20 || { scenario_fail "$name" "the first 20 steps on 2 shards"; return; }
  ports 3
  CRASH=reshard-switched:20 start_shard "$d" 0 3
  CRASH=reshard-committed:20 start_shard "$d" 1 3
  start_shard "$d" 2 3
  for i in 1 0; do
    wait_exit "${shard_pid[$i]}" 60 && grep -q "ZPS_TEST_CRASH_AT=.*: killing this process" "$d/shard$i.log" ||
      { scenario_fail "$name" "shard $i did not die at its crash point"; dump_logs 8 "$d"/shard*.log; return; }
    wait "${shard_pid[$i]}" 2>/dev/null || true
    start_shard "$d" "$i" 3
  done
  run_job "$d" 3 40 || { scenario_fail "$name" "steps 20-40 on 3 shards after the crashes"; return; }
  grep -q "joined the job at step 20" "$d/worker0.40.err" ||
    { scenario_fail "$name" "the workers did not resume at step 20 on 3 shards"; return; }
  matches_baseline "$name" "$d" 3 "of the job killed during its reshard" || return 0
  echo "PASS $name: 2 -> 3 with shard 1 killed after its commit and shard 0 after the switch: export and $(wc -l < "$d/final.crc") chunk CRCs equal 40 steps on 2"
}

# A reshard that must fail: every shard exits 1 with MESSAGE in its log, the old stores are
# unchanged and no side store is left.
expect_failed_reshard() {  # name dir shards message-ere log... (the message in any of them)
  local name=$1 d=$2 n=$3 re=$4 i rc
  local logs=("${@:5}")
  for ((i = 0; i < n; i++)); do
    rc=0
    wait_exit "${shard_pid[$i]}" 60 || { scenario_fail "$name" "shard $i did not give up"; return 1; }
    wait "${shard_pid[$i]}" || rc=$?
    [[ $rc -eq 1 ]] || { scenario_fail "$name" "shard $i exited $rc, expected 1"; return 1; }
    [[ ! -e $d/s$i/checkpoints.reshard ]] || { scenario_fail "$name" "s$i's side store was left"; return 1; }
  done
  grep -Eq "$re" "${logs[@]}" ||
    { scenario_fail "$name" "no error in ${logs[*]} matches /$re/: $(tail -n 2 "${logs[@]}")"; return 1; }
}

bad_input() {
  local d=$work/bad i before after
  mkdir -p "$d/a"
  ports 2
  for i in 0 1; do start_shard "$d/a" "$i" 2; done
  run_job "$d/a" 2 10 || { scenario_fail bad-input "the 10-step run"; return; }
  # A donor that never comes: 2 -> 1 without a donor for ordinal 1. Shard 0 waits, logs which
  # store it waits for, and gives up after --reshard-timeout.
  before=$(volumes_sum "$d/a" 2)
  ports 2
  start_shard "$d/a" 0 1 --reshard-timeout 3
  if expect_failed_reshard missing-donor "$d/a" 1 \
      "DEADLINE_EXCEEDED: .*ordinal 1's endpoint .* did not answer within 3 s" "$d/a/shard0.log"; then
    grep -q "reshard: waiting for ordinal 1's endpoint" "$d/a/shard0.log" ||
      scenario_fail missing-donor "no line saying which store shard 0 waits for"
    after=$(volumes_sum "$d/a" 2)
    if [[ $before == "$after" ]]; then
      echo "PASS bad-input/missing-donor: $(grep -m1 'DEADLINE_EXCEEDED' "$d/a/shard0.log")"
    else
      scenario_fail missing-donor "an old store changed"
    fi
  fi
  # Stores of two jobs: shard 1's volume holds another job's store (another lr). Shard 1 refuses
  # to start; the others give up after --reshard-timeout (or see the two jobs themselves).
  local saved=("${model[@]}")
  model+=(--lr 0.002)
  mkdir -p "$d/other"
  ports 2
  for i in 0 1; do start_shard "$d/other" "$i" 2; done
  run_job "$d/other" 2 10 || { scenario_fail bad-input "the other job's run"; model=("${saved[@]}"); return; }
  model=("${saved[@]}")
  mkdir -p "$d/mixed"
  cp -a "$d/a/s0" "$d/mixed/s0"
  cp -a "$d/other/s1" "$d/mixed/s1"
  before=$(volumes_sum "$d/mixed" 2)
  ports 3
  # Whichever shard compares the two stores first names them, and the others may then find it
  # gone (a peer that never answers): the message is looked for in every shard's log. The
  # timeout leaves a slow start on a loaded machine room to answer.
  for i in 0 1 2; do start_shard "$d/mixed" "$i" 3 --reshard-timeout 30; done
  # The logs by name, not by a glob: one a shard has not opened yet would be left out.
  if expect_failed_reshard two-jobs "$d/mixed" 3 "INVALID_ARGUMENT: .*stores of two different jobs" \
      "$d/mixed"/shard{0,1,2}.log; then
    after=$(volumes_sum "$d/mixed" 2)
    if [[ $before == "$after" ]]; then
      echo "PASS bad-input/two-jobs: $(grep -h -m1 'INVALID_ARGUMENT' "$d/mixed"/shard[0-2].log | head -n 1)"
    else
      scenario_fail two-jobs "an old store changed"
    fi
  fi
}

# A full disk while shard 0 writes its new store: its side store (<data-dir>/checkpoints.reshard)
# is a 128 KiB tmpfs, mounted in a private mount namespace that only this zps-server sees.
disk_full() {  # dir (a job of 2 shards, stopped)
  local d=$1 rc=0 before after
  mkdir -p "$d/s0/checkpoints.reshard"
  if ! private_tmpfs 128k "$d/s0/checkpoints.reshard"; then
    rmdir "$d/s0/checkpoints.reshard"
    echo "SKIP bad-input/disk-full: cannot mount a tmpfs in a private mount namespace here"
    return
  fi
  before=$(volumes_sum "$d" 2)
  ports 2
  start_donors "$d" 1 2 1 --reshard-timeout 10
  "${mount_ns[@]}" sh -c "mount -t tmpfs -o size=128k tmpfs '$d/s0/checkpoints.reshard' && exec '$bin/zps-server' \
      --ordinal 0 --shards 1 --port ${port[0]} --bind 127.0.0.1 --token-file '$work/token' \
      --data-dir '$d/s0' --metrics-port 0 --ucx-tls tcp --threads 1 --reshard-peers '$peers' \
      --reshard-port ${rport[0]} --reshard-timeout 10" >> "$d/shard0.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  wait_exit "$pid" 60 || { scenario_fail disk-full "shard 0 did not give up"; return; }
  wait "$pid" || rc=$?
  after=$(volumes_sum "$d" 2)
  local msg
  msg=$(grep -m1 "^zps-server: RESOURCE_EXHAUSTED" "$d/shard0.log" || true)
  if [[ $rc -eq 1 && -n $msg && $msg == *"old store is unchanged"* && $before == "$after" ]]; then
    echo "PASS bad-input/disk-full: $msg"
  else
    scenario_fail disk-full "expected RESOURCE_EXHAUSTED, the old stores unchanged (exit $rc): $(tail -n 3 "$d/shard0.log")"
  fi
  rmdir "$d/s0/checkpoints.reshard" 2>/dev/null || true
  wait_exit "${donor_pid[1]}" 30 || true
}

all=(4to8to2 bad-input)
sel=("$@")
[[ ${#sel[@]} -eq 0 ]] && sel=("${all[@]}")
for s in "${sel[@]}"; do
  case $s in
    4to8to2) scale_4to8to2 ;;
    crash) scale_crash ;;
    bad-input) bad_input; disk_full "$work/bad/a" ;;
    *) echo "unknown scenario $s"; exit 2 ;;
  esac
done
scenarios_done "the shard count changed under the job, bit-identical; bad input changed nothing"
