#!/usr/bin/env bash
# Ranks that issue different collectives (docs/operations.md "Faults"): 2 zps-server shards x 2
# zps-train workers in pre-reduced mode (--bucket-bytes 0: one reduce-scatter per parameter),
# real processes on loopback. Rank 1 skips one gradient bucket's reduce-scatter on purpose
# (ZPS_TEST_SKIP_BUCKET, train/src/main.cc), so the ranks' descriptor exchange disagrees
# (zps/worker/checked_collectives.h).
#   once     rank 1 skips bucket 1 of step 8, in the first attempt only: both ranks get
#            FAILED_PRECONDITION naming the collective, re-join as for a dead rank (a new worker
#            generation, a new communicator), redo step 8 from the servers' state, and the job
#            ends bit-identical to the in-process reference (at world size 2 Gloo's sums are
#            the shard's).
#   always   rank 1 skips bucket 1 of every step (the ranks diverge in the program itself):
#            both ranks mismatch at step 0, re-join once, mismatch again in the redone step and
#            exit with FAILED_PRECONDITION ("not retried"); no abort, no hang, one re-join each.
#   fewer    rank 1 skips the step's last bucket (28 of 29 in this model) in step 8, once: it
#            issues fewer collectives, which is no mismatch but a wait; rank 0's exchange times
#            out (DEADLINE_EXCEEDED, --op-timeout 5 here; or fails UNAVAILABLE when rank 1's
#            wait for the decision timed out first and it re-joined), both ranks re-join, redo
#            step 8 and end bit-identical.
# Usage: mismatch.sh BIN_DIR [scenario...]
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
bin=$1
shift
steps=12
model=(--steps "$steps" --d-model 32 --n-layers 2 --n-heads 2 --d-ff 64 --seq-len 32 --batch 4
       --chunk-elems 8192 --world-size 2 --shards 2 --max-grad-norm 0.05
       --reduction pre-reduced)
work_init mismatch-token
declare -A shard_pid
job_log_every=1
job_join_timeout=60  # a mismatch is found at once; a worker still running then hangs

reference_crcs "${model[@]}"

dump() { dump_logs 12 "$1"/worker0.err "$1"/worker1.err "$1"/shard0.log "$1"/shard1.log; }

scenario() {  # name skip-spec op-timeout-s
  local name=$1 skip=$2 op_timeout=$3
  local dir=$work/$name
  mkdir -p "$dir"
  port=("$(free_port)" "$(free_port)")
  local i
  for i in 0 1; do start_loopback_shard "$dir" "$i" 2 "" --step-timeout 60; done
  # --op-timeout 30: a mismatch is found at once by the descriptor exchange; waiting this long
  # anywhere would be a hang, and the job_join_timeout (60 s) would catch it.
  job_op_timeout=$op_timeout
  worker_pids=()
  start_job_worker "$dir/worker0" 0 2 "$steps" --bucket-bytes 0
  ZPS_TEST_SKIP_BUCKET=$skip start_job_worker "$dir/worker1" 1 2 "$steps" --bucket-bytes 0
  join_job_workers || true
  local rc=("${joined_rcs[@]}")
  if [[ " ${rc[*]} " == *" timeout "* ]]; then
    scenario_fail "$name" "a worker still runs 60 s after it started (a hang)"; dump "$dir"; return
  fi
  kill -TERM "${shard_pid[@]}" 2>/dev/null || true
  local bucket=${skip%@*}
  if ! grep -q "ZPS_TEST_SKIP_BUCKET: skipping the reduce-scatter of bucket $bucket" "$dir/worker1.err"; then
    scenario_fail "$name" "rank 1 did not skip bucket $bucket"; dump "$dir"; return
  fi
  if grep -qE "terminate called|Aborted|SIGABRT" "$dir"/worker*.err; then
    scenario_fail "$name" "a worker aborted"; dump "$dir"; return
  fi
  local at=0
  [[ $name != always ]] && at=8
  for i in 0 1; do
    # Each rank names its own collective and the other rank's, from the same exchange; with
    # fewer collectives, rank 0 names the one it waited in.
    local want="rank $i\): FAILED_PRECONDITION: step $at: collective #[0-9]+ \(reduce-scatter of gradient bucket [12] of step $at, [0-9]+ elements\) on rank $i of 2: rank $((1 - i)) issued collective .* the ranks issued different collectives; re-joining the job"
    if [[ $name == fewer ]]; then
      want="rank $i\): [A-Z_]+: step $at: .*; re-joining the job"
      # DEADLINE_EXCEEDED, or UNAVAILABLE where rank 1's wait for the decision timed out first
      # and its re-join closed the communicator.
      [[ $i -eq 0 ]] && want="rank 0\): (DEADLINE_EXCEEDED|UNAVAILABLE): step $at: collective #[0-9]+ \(reduce-scatter of gradient bucket $bucket of step $at, [0-9]+ elements\) on rank 0 of 2: .*; re-joining the job"
    fi
    if ! grep -Eq "$want" "$dir/worker$i.err"; then
      scenario_fail "$name" "rank $i did not re-join on the failed collective at step $at"; dump "$dir"; return
    fi
    if ! grep -q "rank $i): re-joined; resuming at step $at" "$dir/worker$i.err"; then
      scenario_fail "$name" "rank $i did not resume at step $at"; dump "$dir"; return
    fi
    if [[ $(grep -c "re-joining the job" "$dir/worker$i.err") -ne 1 ]]; then
      scenario_fail "$name" "rank $i re-joined more than once"; dump "$dir"; return
    fi
  done
  if ! grep -Eq "re-joined the job at step $at: worker generation" "$dir/shard0.log"; then
    scenario_fail "$name" "the coordinator did not start a new worker generation"; dump "$dir"; return
  fi
  if [[ $name != always ]]; then
    if [[ ${rc[0]} -ne 0 || ${rc[1]} -ne 0 ]]; then
      scenario_fail "$name" "a worker failed (exit ${rc[*]})"; dump "$dir"; return
    fi
    grep '^chunk_crc' "$dir/worker0.out" > "$dir/dist.crc" || true
    if ! diff -q "$work/ref.crc" "$dir/dist.crc" > /dev/null; then
      scenario_fail "$name" "not bit-identical to the reference"
      diff "$work/ref.crc" "$dir/dist.crc" | head -5; dump "$dir"; return
    fi
    echo "PASS $name: both ranks re-joined at step $at, redid it, and the job ended with $(wc -l < "$dir/dist.crc") chunks bit-identical"
  else
    for i in 0 1; do
      if [[ ${rc[$i]} -ne 1 ]]; then
        scenario_fail "$name" "rank $i exited ${rc[$i]}, expected 1 (an error)"; dump "$dir"; return
      fi
      if ! grep -Eq "^zps-train \(rank $i\): FAILED_PRECONDITION: step 0: .*the ranks issued different collectives \(again in the step redone after re-joining: the ranks diverge deterministically; not retried\)" "$dir/worker$i.err"; then
        scenario_fail "$name" "rank $i did not end with the repeated mismatch"; dump "$dir"; return
      fi
    done
    echo "PASS $name: both ranks re-joined once and ended with: $(grep -m1 '^zps-train (rank 0): FAILED' "$dir/worker0.err" | cut -c1-200)"
  fi
}

all=(once always fewer)
sel=("$@")
[[ ${#sel[@]} -eq 0 ]] && sel=("${all[@]}")
for s in "${sel[@]}"; do
  case $s in
    once) scenario once 1@8 30 ;;
    always) scenario always 1 30 ;;
    fewer) scenario fewer 28@8 5 ;;
    *) echo "unknown scenario $s"; exit 2 ;;
  esac
done
scenarios_done "every mismatch scenario"
