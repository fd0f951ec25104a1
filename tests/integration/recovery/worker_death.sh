#!/usr/bin/env bash
# A worker (rank) that dies: 2 zps-server shards x 2 zps-train workers, real processes on
# loopback (UCX tcp; ZPS_WD_TLS=shm for shared memory, where pushes go by PushRma and the shards
# RMA-read the killed worker's staging region through its rkey). Rank 1 SIGKILLs itself at a named point (ZPS_TEST_CRASH_AT=<point>:<step>,
# train/src/main.cc), and the test checks its stderr for the kill line, so a scenario cannot
# pass with the victim dying elsewhere (or not at all).
#   push     rank 1 dies at step 12 with three gradient pushes landed (the step half pushed) and
#            is restarted: its new sessions make every shard drop what the old process pushed of
#            step 12 (ShardState::ForgetRank); it must re-join at step 12, rank 0 must not fail,
#            and the job must end bit-identical to the in-process reference.
#   commit   rank 1 dies at step 12 after every push of the step landed, before the decision:
#            restarted, it re-joins at step 12 (its pushes of the sealed step are dropped) or 13
#            (decided meanwhile); bit-identical end.
#   lost     rank 1 dies at step 12 and never comes back: shard 0 (the coordinator, --step-timeout
#            8) stops the job with an error naming rank 1, and rank 0 exits with that error, within
#            the step timeout plus a margin; never a hang.
# Pre-reduced mode (--reduction pre-reduced: the ranks reduce-scatter each gradient with Gloo and
# push only their slice), where a dead rank breaks the others' communicator, so every rank
# restarts the step (the coordinator's worker generation, docs/operations.md "Faults"); each
# must end bit-identical to the reference (at world size 2 Gloo's sums are the shard's):
#   pre-backward rank 1 dies in the backward pass of step 12, before the step's one reduce-scatter
#                (a bucket as large as the model): rank 0's reduce-scatter fails at once
#                (gloo, UNAVAILABLE), it re-joins at 12, and so does the restarted rank 1.
#   pre-bucket   --bucket-bytes 0 (a reduce-scatter per parameter): rank 1 dies between two
#                collectives with the slices of three parameters landed; rank 0's next
#                reduce-scatter fails at once; the shards drop the step's pushes at the re-joins.
#   pre-push     rank 1 dies after the reduce-scatter with two of its slices landed (rank 0 has
#                pushed everything and waits for the decision): the restarted rank 1 re-joins,
#                the coordinator starts a new worker generation and fails rank 0's wait
#                (UNAVAILABLE), rank 0 re-joins too, the shards drop the step's pushes, and both
#                redo step 12 with a new communicator.
#   pre-push-0   as pre-push, at step 0: rank 0 joins again at step 0 and pushes the job's
#                initial values again, which the shards drop (they have them already).
#   pre-commit   rank 1 dies after every slice of step 12 landed; it re-joins at 12 or 13.
#   pre-lost     as pre-push, never restarted: shard 0 stops the job within its --step-timeout
#                with an error naming rank 1 (no session left), and rank 0 exits with it.
# Usage: worker_death.sh BIN_DIR [scenario...]
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
bin=$1
shift
steps=24
model=(--steps "$steps" --d-model 32 --n-layers 4 --n-heads 2 --d-ff 64 --seq-len 32 --batch 4
       --chunk-elems 8192 --world-size 2 --shards 2 --max-grad-norm 0.05)
work_init worker-death-token
declare -A shard_pid
job_tls=${ZPS_WD_TLS:-tcp}
job_op_timeout=30
job_log_every=1

reference_crcs "${model[@]}"

dump() { dump_logs 10 "$1"/worker0.err "$1"/worker1.err "$1"/worker1b.err "$1"/shard0.log "$1"/shard1.log; }

scenario() {  # name crash-point restart(1|0) [extra zps-train args...]
  local name=$1 point=$2 restart=$3
  shift 3
  local extra=("$@")
  local pre=0
  [[ " ${extra[*]} " == *" pre-reduced "* ]] && pre=1
  local dir=$work/$name
  mkdir -p "$dir"
  port=("$(free_port)" "$(free_port)")
  local i
  for i in 0 1; do
    local timeout=60
    # The lost rank: the coordinator shard's step timeout decides (shard 1 waits longer).
    if [[ $restart -eq 0 ]]; then timeout=$(( i == 0 ? 8 : 60 )); fi
    start_loopback_shard "$dir" "$i" 2 "" --step-timeout "$timeout"
  done
  start_job_worker "$dir/worker0" 0 2 "$steps" "${extra[@]}"
  local w0=$worker_pid
  ZPS_TEST_CRASH_AT=$point start_job_worker "$dir/worker1" 1 2 "$steps" "${extra[@]}"
  local w1=$worker_pid
  if ! wait_exit "$w1" 60; then scenario_fail "$name" "rank 1 did not die at $point"; dump "$dir"; return; fi
  wait "$w1" 2>/dev/null || true
  if ! grep -q "ZPS_TEST_CRASH_AT=$point: killing this process" "$dir/worker1.err"; then
    scenario_fail "$name" "rank 1 exited, but not at $point"; dump "$dir"; return
  fi
  local t_kill
  t_kill=$(date +%s)
  if [[ $restart -eq 1 ]]; then
    start_job_worker "$dir/worker1b" 1 2 "$steps" "${extra[@]}"
    local ok=1
    join_pids 120 "$w0" "$worker_pid" || ok=0
    kill -TERM "${shard_pid[@]}" 2>/dev/null || true
    grep '^chunk_crc' "$dir/worker0.out" > "$dir/dist.crc" || true
    local joined
    joined=$(sed -nE 's/.*joined the job at step ([0-9]+).*/\1/p' "$dir/worker1b.err" | head -1)
    local at=${point##*:}
    local want="^$at$"
    [[ $point == worker-commit:* ]] && want="^($at|$((at + 1)))$"
    if [[ $ok -ne 1 ]]; then scenario_fail "$name" "a worker failed"; dump "$dir"; return; fi
    if ! [[ $joined =~ $want ]]; then
      scenario_fail "$name" "the restarted rank 1 joined at step '${joined}', expected $want"; dump "$dir"; return
    fi
    if [[ $pre -eq 0 ]] && grep -q "re-joining the job" "$dir/worker0.err"; then
      scenario_fail "$name" "rank 0 had to re-join (it should only have waited)"; dump "$dir"; return
    fi
    # Half pushed: some shard must have dropped what the old process pushed of step 12.
    if [[ $pre -eq 0 && $point == worker-push:* ]] &&
       ! grep -Eq "worker rank 1 connected again .*: [1-9][0-9]* elements it pushed" "$dir"/shard*.log; then
      scenario_fail "$name" "no shard dropped rank 1's pushes of step $at"; dump "$dir"; return
    fi
    if [[ $pre -eq 1 ]]; then
      # Every rank restarts the step: rank 0 re-joined at step 12 (or 13 after pre-commit), in
      # the new worker generation the coordinator started for the restarted rank 1.
      local rejoined
      rejoined=$(sed -nE 's/.*rank 0\): re-joined; resuming at step ([0-9]+).*/\1/p' "$dir/worker0.err" | tail -1)
      if ! [[ $rejoined =~ $want ]]; then
        scenario_fail "$name" "rank 0 did not re-join at the restarted step (re-joined at '${rejoined}')"; dump "$dir"; return
      fi
      if ! grep -Eq "rank [01] re-joined the job at step ($at|$((at + 1))): worker generation" "$dir/shard0.log"; then
        scenario_fail "$name" "the coordinator did not start a new worker generation"; dump "$dir"; return
      fi
      if [[ $name == pre-bucket || $name == pre-push* ]] &&
         ! grep -Eq "connected again .*: [1-9][0-9]* elements pushed of the step in progress dropped \(pre-reduced" "$dir"/shard*.log; then
        scenario_fail "$name" "no shard dropped the pushes of step $at"; dump "$dir"; return
      fi
      if [[ $name == pre-backward || $name == pre-bucket ]] &&
         ! grep -Eq "UNAVAILABLE: step 12: collective #[0-9]+ \(reduce-scatter of gradient bucket" "$dir/worker0.err"; then
        scenario_fail "$name" "rank 0's reduce-scatter did not fail (it should, at once, when rank 1 dies)"; dump "$dir"; return
      fi
      if [[ $name == pre-push* ]] &&
         ! grep -Eq "UNAVAILABLE: step $at: .*rank 1 re-joined the job at step $at: in a pre-reduced job every rank restarts the step" "$dir/worker0.err"; then
        scenario_fail "$name" "rank 0's wait for the decision was not failed by rank 1's re-join"; dump "$dir"; return
      fi
    fi
    if ! diff -q "$work/ref.crc" "$dir/dist.crc" > /dev/null; then
      scenario_fail "$name" "not bit-identical to the reference"; diff "$work/ref.crc" "$dir/dist.crc" | head -5
      dump "$dir"; return
    fi
    echo "PASS $name ($job_tls): rank 1 killed at $point, restarted, re-joined at step $joined; $(wc -l < "$dir/dist.crc") chunks bit-identical"
  else
    if ! wait_exit "$w0" 40; then scenario_fail "$name" "rank 0 still running 40 s after rank 1 died"; dump "$dir"; return; fi
    local rc=0
    wait "$w0" 2>/dev/null || rc=$?
    local took=$(( $(date +%s) - t_kill ))
    kill -TERM "${shard_pid[@]}" 2>/dev/null || true
    if [[ $rc -eq 0 ]]; then scenario_fail "$name" "rank 0 exited 0 without rank 1"; dump "$dir"; return; fi
    if ! grep -q "rank 1 never pushed the step" "$dir/shard0.log"; then
      scenario_fail "$name" "shard 0's error does not name rank 1"; dump "$dir"; return
    fi
    if ! grep -q "rank 1 never pushed the step" "$dir/worker0.err"; then
      scenario_fail "$name" "rank 0's error does not name rank 1"; dump "$dir"; return
    fi
    echo "PASS $name: rank 1 killed at $point, never restarted; rank 0 stopped ${took} s later with: $(grep -m1 'never pushed' "$dir/worker0.err" | cut -c1-220)"
  fi
}

all=(push commit lost pre-backward pre-bucket pre-push pre-push-0 pre-commit pre-lost)
sel=("$@")
[[ ${#sel[@]} -eq 0 ]] && sel=("${all[@]}")
for s in "${sel[@]}"; do
  case $s in
    push) scenario push worker-push:12 1 ;;
    commit) scenario commit worker-commit:12 1 ;;
    lost) scenario lost worker-push:12 0 ;;
    pre-backward) scenario pre-backward worker-push:12 1 --reduction pre-reduced ;;
    pre-bucket) scenario pre-bucket worker-push:12 1 --reduction pre-reduced --bucket-bytes 0 ;;
    pre-push) scenario pre-push worker-slice:12 1 --reduction pre-reduced ;;
    pre-push-0) scenario pre-push-0 worker-slice:0 1 --reduction pre-reduced ;;
    pre-commit) scenario pre-commit worker-commit:12 1 --reduction pre-reduced ;;
    pre-lost) scenario pre-lost worker-slice:12 0 --reduction pre-reduced ;;
    *) echo "unknown scenario $s"; exit 2 ;;
  esac
done
scenarios_done "every worker-death scenario"
