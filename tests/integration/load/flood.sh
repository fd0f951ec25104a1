#!/usr/bin/env bash
# Many workers under a flood (issue 12, item 4): WORLD zps-train workers x SHARDS zps-server
# shards (real processes on loopback, UCX over tcp, server-sum, direct fetches) train a tiny model
# for STEPS steps while zps-flood sends malformed control-plane frames, connection floods and
# malformed data-plane active messages at every shard.
#
# Usage: [WORLD=16] [SHARDS=4] [STEPS=24] [RUNS=flood] flood.sh BIN_DIR [extra zps-train flags...]
#   RUNS: the runs to make, in order, each on fresh shards: "flood" (with zps-flood) and/or
#   "quiet" (the same cluster without it: the reference for the latency figures), a digit may
#   follow to tell repeats apart (scripts/bench-load.sh runs "quiet1 flood1 quiet2 flood2").
#
# Checks, for every run: every worker trains every step and exits 0, with no re-join (no step
# failed) and no error line; the final state (every chunk's CRC32C of master, m, v and the
# serving copy, as bit_identity.sh compares it) equals the in-process reference
# (zps-train --mode reference, the same model, data, world size and optimizer). For the flood run
# also: zps-flood exits 0 (every case answered as docs/protocol.md says, every shard still
# serving at the end), and on every shard each zps_protocol_errors_total{kind} the flood aims at
# rose by at least the number of answers zps-flood saw for that kind (so the flood did arrive).
# Prints p50/p99 of fetch and push request latency as the workers saw them and of the step time
# (from the workers' zps_request_duration_seconds / zps_step_duration_seconds buckets).
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
bin=$1
shift
world=${WORLD:-16}
shards=${SHARDS:-4}
steps=${STEPS:-24}
runs=${RUNS:-flood}
# A tiny model: the flood and 16 workers share 2 cores with the shards.
model=(--steps "$steps" --d-model 64 --n-layers 2 --n-heads 4 --d-ff 128 --seq-len 32 --batch 4
       --chunk-elems 8192 --world-size "$world" --shards "$shards" --max-grad-norm 0.05
       --max-recoveries 0 "$@")
work_init load-test-token
declare -A shard_pid
job_world=$world
job_log_every=1000000
job_op_timeout=120
job_join_timeout=0  # the job's length is the run's (scripts/bench-load.sh: 200 steps)
scrape() {  # port file: the shard's protocol error counters, "kind value" per line
  curl -sf "http://127.0.0.1:$1/metrics" |
    sed -n 's/^zps_protocol_errors_total{kind="\([a-z_]*\)"} \([0-9.e+]*\)$/\1 \2/p' > "$2"
}
kinds=(bad_magic bad_version oversize truncated bad_crc unknown_type unauthenticated
       invalid_argument timeout)

echo "== reference (in-process): ${model[*]}"
"$bin/zps-train" --mode reference "${model[@]}" --print-crcs > "$work/ref.out"
grep '^chunk_crc' "$work/ref.out" > "$work/ref.crc"
[[ $(wc -l < "$work/ref.crc") -ge $((2 * shards)) ]] || fail "the reference printed too few chunk CRCs"
grep '^reference:' "$work/ref.out"

run() {  # name: flood or quiet, then maybe a digit
  local name=$1 dir="$work/$1" kind=${1//[0-9]/}
  local targets=""
  start_metered_shards "$dir" "$shards"
  for ((i = 0; i < shards; i++)); do targets+="${targets:+,}127.0.0.1:${port[$i]}"; done
  for ((i = 0; i < shards; i++)); do  # metrics up: the counters before anything happened
    for ((t = 0; t < 300; t++)); do
      scrape "${mport[$i]}" "$dir/before$i" 2>/dev/null && [[ -s $dir/before$i ]] && break
      sleep 0.1
    done
    [[ -s $dir/before$i ]] || fail "shard $i's /metrics did not come up"
  done
  local t0=$SECONDS fpid=""
  start_job_workers "$dir" "$shards" "$steps" --print-latency  # rank 0 prints the CRCs
  if [[ $kind == flood ]]; then
    "$bin/zps-flood" --targets "$targets" --token-file "$work/token" ${FLOOD_ARGS:-} \
      > "$dir/flood.out" 2> "$dir/flood.err" &
    fpid=$!; pids+=($!)
  fi
  local failed=0
  join_job_workers || failed=1
  local train_s=$((SECONDS - t0))
  # The counters as the last worker finished: what arrived while the job trained.
  for ((i = 0; i < shards; i++)); do scrape "${mport[$i]}" "$dir/during$i" || true; done
  if [[ -n $fpid ]]; then
    # The shards close silent connections at their 5 s hello timeout: flood that long at least.
    while (( SECONDS - t0 < 8 )); do sleep 0.5; done
    kill -TERM "$fpid"
    local frc=0
    wait "$fpid" || frc=$?
  fi
  for ((i = 0; i < shards; i++)); do
    kill -0 "${shard_pid[$i]}" 2>/dev/null || { tail -20 "$dir/shard$i.log"; fail "shard $i died during run $name"; }
    scrape "${mport[$i]}" "$dir/after$i" || fail "shard $i's /metrics stopped answering"
  done
  for p in "${shard_pid[@]}"; do kill "$p" 2>/dev/null || true; done
  local src=0
  for p in "${shard_pid[@]}"; do wait "$p" || src=1; done
  if [[ $failed -ne 0 ]]; then
    dump_logs 5 "$dir"/worker*.err "$dir"/shard*.log
    fail "run $name: a worker failed"
  fi
  [[ $src -eq 0 ]] || fail "run $name: a shard did not exit cleanly on SIGTERM"
  echo "== $name: $world workers x $shards shards, $steps steps in ${train_s}s"
  # Every step committed on every rank: no rank re-joined (a failed step), none logged an error.
  if grep -l 're-joining\|error\|FAIL' "$dir"/worker*.err; then fail "run $name: a worker reported an error"; fi
  if grep '^E ' "$dir"/shard*.log; then fail "run $name: a shard logged an error"; fi
  for ((r = 0; r < world; r++)); do
    [[ $(grep -c '^latency ' "$dir/worker$r.$steps.out") -eq 3 ]] || fail "rank $r printed no latency"
    c=$(awk '$1 == "latency" && $3 == "step" {print $4}' "$dir/worker$r.$steps.out")
    [[ $c -eq $steps ]] || fail "rank $r committed $c of $steps steps"
  done
  grep '^summary' "$dir/worker0.$steps.out" | sed 's/^/   /'
  grep '^chunk_crc' "$dir/worker0.$steps.out" > "$dir/crc"
  diff "$work/ref.crc" "$dir/crc" > /dev/null ||
    fail "run $name: the final state differs from the in-process reference"
  echo "   final state: $(wc -l < "$dir/crc") chunks bit-identical to the in-process reference"
  cat "$dir"/worker*.out | python3 "$(dirname "$0")/latency.py" "$name"
  # file-before file-after kind: sets delta_v. Not called in $(...), so that a missing series
  # fails the test (fail exits) instead of a subshell.
  delta() {
    local b a
    b=$(awk -v k="$3" '$1 == k {printf "%.0f", $2}' "$1")
    a=$(awk -v k="$3" '$1 == k {printf "%.0f", $2}' "$2")
    [[ -n $a && -n $b ]] || fail "no zps_protocol_errors_total{kind=\"$3\"} in $2"
    delta_v=$((a - b))
  }
  if [[ $kind == quiet ]]; then  # a job alone makes no protocol error: the flood's are the flood's
    for ((i = 0; i < shards; i++)); do
      for k in "${kinds[@]}"; do
        delta "$dir/before$i" "$dir/after$i" "$k"
        [[ $delta_v -eq 0 ]] ||
          fail "run quiet: shard $i counted protocol errors of kind $k without a flood"
      done
    done
    echo "   no protocol error counted on any shard"
  fi
  if [[ $kind == flood ]]; then
    grep -v '^flood ' "$dir/flood.out" | sed 's/^/   /'
    [[ $frc -eq 0 ]] || fail "zps-flood reported a shard answering otherwise or no longer serving (exit $frc)"
    for ((i = 0; i < shards; i++)); do
      for k in "${kinds[@]}"; do
        local d during seen
        delta "$dir/before$i" "$dir/after$i" "$k"
        d=$delta_v
        delta "$dir/before$i" "$dir/during$i" "$k"
        during=$delta_v
        seen=$(awk -v s="$i" -v k="$k" '$1 == "flood" && $2 == s && $6 == k {n += $5} END {print n + 0}' "$dir/flood.out")
        (( seen > 0 )) || fail "zps-flood saw no answer of kind $k from shard $i"
        (( d >= seen )) ||
          fail "shard $i: zps_protocol_errors_total{kind=\"$k\"} rose by $d, zps-flood saw $seen"
        # While the workers trained (the hello timeout, 5 s, may outlast a short run).
        [[ $k == timeout ]] || (( during > 0 )) ||
          fail "shard $i: no protocol error of kind $k arrived while the job trained"
        printf '   shard %d %-18s +%-6d (%d while the job trained; zps-flood saw %d answers)\n' \
          "$i" "$k" "$d" "$during" "$seen"
      done
    done
    local lines held
    lines=$(cat "$dir"/shard*.log | grep -c 'rpc: closing connection' || true)
    held=$(sed -n 's/.*(\([0-9]*\) more connections closed for protocol errors not logged.*/\1/p' \
             "$dir"/shard*.log | awk '{n += $1} END {print n + 0}')
    echo "   shard logs: $lines 'rpc: closing connection' lines, $held more held back by the log limit"
    lines=$(cat "$dir"/shard*.log | grep -c 'dropping malformed' || true)
    held=$(sed -n 's/.*(\([0-9]*\) more malformed messages not logged.*/\1/p' \
             "$dir"/shard*.log | awk '{n += $1} END {print n + 0}')
    echo "   shard logs: $lines 'dropping malformed' (data-plane) lines, $held more held back"
  fi
}

for r in $runs; do run "$r"; done
echo "PASS"
