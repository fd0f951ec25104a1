# shellcheck shell=bash
# Helpers shared by the multi-process shell tests in tests/integration/ (recovery, worker_death,
# collectives, quantized_grads, quantized_weights, flood, netns, bit_identity, reshard, scale).
# Sourced, never executed:
#
#   set -euo pipefail
#   # shellcheck source=SCRIPTDIR/../lib.sh
#   source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
#
# The caller keeps `set -euo pipefail`; nothing here changes shell options. Sourcing defines the
# functions below and sets `failures=0` and `zps_python`; it starts nothing and makes no file.
#
# Variables the caller reads or sets:
#   work       the test's temporary directory (set by work_init).
#   pids       every process the test starts; the caller appends each one (`pids+=($!)`), and
#              cleanup SIGKILLs them all at exit (set to () by work_init).
#   failures   the count of failed scenarios (0 at source time; scenario_fail adds one,
#              scenarios_done reads it).
#   bin        the directory of the zps programs (the caller's first argument); reference_crcs
#              runs "$bin/zps-train".
#   lib_poll_s how often wait_exit and join_pids look at a pid, in seconds (default 0.05;
#              recovery.sh sets 0.02).
#   KEEP_WORK  (environment) when non-empty, cleanup keeps $work and prints its path.
#
# Functions:
#   work_init [TOKEN]
#       Makes $work (mktemp -d), sets pids=(), and installs cleanup as the EXIT trap. With TOKEN,
#       writes it to $work/token (the auth token the shards and workers are given).
#   on_cleanup FUNC
#       Adds FUNC (a function or command name, no arguments) to what cleanup runs after the kills
#       and before $work is removed, in the order added (recovery.sh unmounts its tmpfs, netns.sh
#       deletes its namespaces). A failing FUNC does not stop the rest.
#   cleanup
#       The EXIT trap: `kill -9` (SIGKILL, not SIGTERM: a test that has to stop a process cleanly
#       does so itself, before it exits) every pid in $pids, without waiting for them; then the
#       on_cleanup functions; then `rm -rf $work`, unless KEEP_WORK is set ("work dir kept: ...").
#       Never calls exit, so the script's own exit status (77 for a skip) stands.
#   free_port
#       Prints a free loopback TCP port below the ephemeral range (`python3 -m zps.ports` with
#       PYTHONPATH=$zps_python; python/zps/ports.py says why not port 0).
#   now_ms
#       Prints the wall-clock time in milliseconds since the epoch.
#   wait_exit PID TIMEOUT_S
#       Returns 0 once PID is gone (kill -0 fails), 1 if it is still running after TIMEOUT_S
#       seconds. Does not reap it (the caller's `wait` does) and does not kill it.
#   join_pids TIMEOUT_S PID...
#       For each PID in turn: wait_exit up to TIMEOUT_S seconds (each PID its own timeout; 0: no
#       limit); one still running then is SIGKILLed; then `wait` reaps it. Sets `joined_rcs` to
#       each PID's exit status, in order ("timeout" for one that was SIGKILLed). Returns 1 if any
#       PID timed out or exited non-zero, else 0. Every PID is reaped either way.
#   wait_grep FILE ERE TIMEOUT_S [POLL_S]
#       Returns 0 as soon as `grep -qE ERE FILE` matches, 1 if it has not after TIMEOUT_S seconds;
#       looks every POLL_S seconds (default $lib_poll_s).
#   reference_crcs ZPS_TRAIN_ARGS...
#       Runs `$bin/zps-train --mode reference ARGS... --print-crcs` (output in $work/ref.out),
#       writes its chunk_crc lines to $work/ref.crc and prints "reference: N chunks". A failing
#       run fails the script (set -e).
#   dump_logs N FILE...
#       For each FILE that exists: "--- FILE", then its last N lines. Files that do not exist are
#       passed over. Always returns 0.
#   fail MESSAGE...
#       Prints "FAIL: MESSAGE" and exits 1 (the whole test fails now).
#   scenario_fail NAME MESSAGE
#       Prints "FAIL NAME: MESSAGE" and adds one to $failures; returns 0, so the caller goes on
#       (it usually dumps logs and returns from the scenario). The script ends with
#       scenarios_done.
#   scenarios_done MESSAGE
#       If $failures is not 0, prints "FAIL: <failures> scenario(s)" and exits 1; otherwise
#       prints "PASS: MESSAGE".
#
# Jobs of zps-train workers on N zps-server shards (reshard.sh, scale.sh, through run_metered_job
# collectives.sh and quantized_*.sh; the workers of recovery.sh, mismatch.sh, worker_death.sh and
# flood.sh). The caller sets `model` (the job's zps-train flags, an array, with --world-size),
# `port` (each ordinal's control port; port[0] is the coordinator's) and `declare -A shard_pid`;
# each shard I keeps its data in DIR/sI and logs to DIR/shardI.log, and each worker's output goes
# to DIR/worker<rank>.<steps>.{out,err}. The caller
# may set `job_world` (the number of workers, default 2), `job_log_every` (their --log-every,
# default 10), `job_op_timeout` (their --op-timeout in seconds, default 60), `job_join_timeout`
# (how long join_job_workers waits for each, in seconds, default 180; 0: no limit) and `job_tls`
# (the shards' and workers' --ucx-tls, default tcp).
#   start_loopback_shard DIR ORDINAL SHARDS CRASH [FLAGS...]
#       Starts shard ORDINAL of SHARDS on 127.0.0.1:port[ORDINAL] (start_server, logging to
#       DIR/shardORDINAL.log, with the token in $work/token, UCX over $job_tls, one optimizer
#       thread, no /metrics, and the coordinator at port[0] for ordinals other than 0), with
#       FLAGS after those (a later flag wins); CRASH as in start_server ("" for none). Its pid
#       goes to shard_pid[ORDINAL] (and $server_pid). The shard every script here starts
#       (recovery.sh, mismatch.sh, worker_death.sh and flood.sh too, with flags of their own).
#   start_job_shard DIR ORDINAL SHARDS CRASH [FLAGS...]
#       start_loopback_shard with its data in DIR/sORDINAL, a checkpoint every 10 steps and a
#       60 s step timeout, then FLAGS.
#   start_job_worker OUT RANK SHARDS STEPS [FLAGS...]
#       Starts rank RANK (zps-train --mode worker against the coordinator at port[0], `model`,
#       --print-crcs) up to STEPS, with FLAGS after those, its output in OUT.out and OUT.err. Its
#       pid goes to $worker_pid, $worker_pids and $pids. The caller's environment reaches it:
#       `ZPS_TEST_CRASH_AT=worker-push:12 start_job_worker ...` starts the rank with a kill point.
#   start_job_workers DIR SHARDS STEPS [FLAGS...]
#       Empties $worker_pids and starts ranks 0..job_world-1 (start_job_worker, output in
#       DIR/worker<rank>.<steps>).
#   join_job_workers
#       Waits up to $job_join_timeout s for each worker in $worker_pids and reaps it (join_pids,
#       which leaves their exit statuses in $joined_rcs), then empties $worker_pids. Returns 1 if
#       one failed or was still running.
#   stop_job_shards SHARDS
#       SIGTERMs shards 0..SHARDS-1 (one with durable state writes its shutdown checkpoint) and
#       reaps them (30 s each). Returns 1 if one did not exit.
#   finish_job DIR SHARDS STEPS
#       join_job_workers, then stop_job_shards. Returns 1, after the logs' tails, if a worker
#       failed or a shard did not exit; else writes worker 0's chunk_crc lines to DIR/final.crc.
#   run_job DIR SHARDS STEPS
#       start_job_workers, then finish_job (the shards already started).
#   metric PORT NAME
#       Prints the value of the metric NAME on http://127.0.0.1:PORT/metrics, as an integer.
#   start_metered_shards DIR SHARDS
#       New ports (`port`) and SHARDS shards without durable state (start_loopback_shard), each
#       with /metrics on a port of its own (`mport`), and the flags in the caller's
#       `job_shard_flags` array (none unless set) after those.
#   run_metered_job DIR SHARDS STEPS [FLAGS...]
#       A job of its own: start_metered_shards, the workers (start_job_workers with FLAGS);
#       once the workers are done, writes the shards' summed zps_push_bytes_total (their
#       ingress) to DIR/push and zps_fetch_bytes_total (their egress) to DIR/fetch; then
#       finish_job. Returns 1, after the logs' tails, if a worker failed or a shard did not exit.
#
# Scripts that compare run_metered_job runs of one job, each on fresh shards (collectives.sh,
# quantized_grads.sh, quantized_weights.sh):
#   metered_init TOKEN WORLD SHARDS STEPS [ZPS_TRAIN_FLAGS...]
#       work_init TOKEN; sets `world`, `shards` and `steps`, `model` to --world-size WORLD and
#       the flags, `job_world` to WORLD and `job_log_every` to 1 (every step's loss logged);
#       declares `shard_pid`.
#   metered_run NAME [FLAGS...]
#       run_metered_job of $work/NAME ($shards shards, $steps steps, FLAGS to the workers); a
#       failed one fails the test (fail). Prints "== NAME (FLAGS): shard ingress P B, egress
#       F B" ("== NAME: ..." without FLAGS) and worker 0's step, held-out, summary and prefetch
#       lines, indented.
#   stores DIR SHARDS
#       Prints the checkpoint stores DIR/s0/checkpoints,...,DIR/s<SHARDS-1>/checkpoints.
#   export_model DIR SHARDS OUT
#       `zps-ckpt export` of those stores to OUT (a safetensors file).
#   matches_baseline NAME DIR SHARDS WHAT
#       Exports DIR's SHARDS stores to $work/NAME.safetensors and compares it, byte for byte,
#       with $work/base.safetensors, and DIR/final.crc with $work/base/final.crc (the caller's
#       uninterrupted run). Returns 0 when both are equal; else scenario_fail NAME ("WHAT
#       differs ...") and returns 1.
#   tree_sum DIR
#       Prints one checksum over the names and bytes of every file below DIR.
#   private_tmpfs SIZE DIR
#       Tries to mount a tmpfs of SIZE on DIR in a private mount namespace (`unshare -m`, or
#       `unshare -rm` where that needs root), which nothing outside sees and which is gone when
#       the probe exits. Returns 1 where neither can; else sets `mount_ns` to the unshare
#       command that worked, for the caller's own `"${mount_ns[@]}" sh -c "mount ... && ..."`.

failures=0
lib_cleanup_funcs=()
zps_python=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/python

# shellcheck disable=SC2120  # the token is optional (bit_identity.sh has none)
work_init() {  # [token]
  work=$(mktemp -d)
  pids=()
  trap cleanup EXIT
  if [[ -n ${1:-} ]]; then echo "$1" > "$work/token"; fi
}

on_cleanup() {  # func
  lib_cleanup_funcs+=("$1")
}

cleanup() {
  local p f
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for f in "${lib_cleanup_funcs[@]}"; do "$f" || true; done
  if [[ -n ${KEEP_WORK:-} ]]; then
    echo "work dir kept: $work"
  else
    rm -rf "$work"
  fi
}

free_port() { PYTHONPATH="$zps_python" python3 -m zps.ports; }

now_ms() { date +%s%3N; }

# Starts zps-server in the background with its output appended to LOG and, where CRASH is not
# empty, a named kill point (ZPS_TEST_CRASH_AT=CRASH). Its pid goes to $server_pid and to the
# processes cleanup kills.
start_server() {  # log crash-spec server-args...
  local log=$1 crash=$2
  shift 2
  if [[ -n $crash ]]; then
    ZPS_TEST_CRASH_AT=$crash "$bin/zps-server" "$@" >> "$log" 2>&1 &
  else
    "$bin/zps-server" "$@" >> "$log" 2>&1 &
  fi
  server_pid=$!
  pids+=("$server_pid")
}

wait_exit() {  # pid timeout_s
  local end=$(( $(date +%s) + $2 ))
  while kill -0 "$1" 2>/dev/null; do
    if (( $(date +%s) > end )); then return 1; fi
    sleep "${lib_poll_s:-0.05}"
  done
}

join_pids() {  # timeout_s pid...
  local timeout=$1 p s rc=0
  shift
  joined_rcs=()
  for p in "$@"; do
    if [[ $timeout -ne 0 ]] && ! wait_exit "$p" "$timeout"; then
      kill -9 "$p" 2>/dev/null || true
      wait "$p" 2>/dev/null || true
      joined_rcs+=(timeout)
      rc=1
      continue
    fi
    s=0
    wait "$p" 2>/dev/null || s=$?
    joined_rcs+=("$s")
    [[ $s -eq 0 ]] || rc=1
  done
  return "$rc"
}

wait_grep() {  # file ere timeout_s [poll_s]
  local end=$(( $(date +%s) + $3 ))
  until grep -qE "$2" "$1"; do
    if (( $(date +%s) > end )); then return 1; fi
    sleep "${4:-${lib_poll_s:-0.05}}"
  done
}

reference_crcs() {  # zps-train args...
  # shellcheck disable=SC2154  # bin is the caller's
  "$bin/zps-train" --mode reference "$@" --print-crcs > "$work/ref.out"
  grep '^chunk_crc' "$work/ref.out" > "$work/ref.crc"
  echo "reference: $(wc -l < "$work/ref.crc") chunks"
}

dump_logs() {  # lines file...
  local n=$1 f
  shift
  for f in "$@"; do
    if [[ -f $f ]]; then echo "--- $f"; tail -n "$n" "$f"; fi
  done
}

fail() { echo "FAIL: $*"; exit 1; }

scenario_fail() {  # name message
  echo "FAIL $1: $2"
  failures=$((failures + 1))
}

scenarios_done() {  # pass message
  if [[ $failures -ne 0 ]]; then echo "FAIL: $failures scenario(s)"; exit 1; fi
  echo "PASS: $1"
}

start_loopback_shard() {  # dir ordinal shards crash-spec [flags...]
  local dir=$1 i=$2 n=$3 crash=$4
  shift 4
  local args=(--ordinal "$i" --shards "$n" --port "${port[$i]}" --bind 127.0.0.1
              --token-file "$work/token" --metrics-port 0 --ucx-tls "${job_tls:-tcp}" --threads 1)
  [[ $i -ne 0 ]] && args+=(--coordinator "127.0.0.1:${port[0]}")
  start_server "$dir/shard$i.log" "$crash" "${args[@]}" "$@"
  # shellcheck disable=SC2004  # shard_pid is the caller's associative array
  shard_pid[$i]=$server_pid
}

start_job_shard() {  # dir ordinal shards crash-spec [flags...]
  local dir=$1 i=$2 n=$3 crash=$4
  shift 4
  start_loopback_shard "$dir" "$i" "$n" "$crash" --data-dir "$dir/s$i" --checkpoint-every 10 \
    --step-timeout 60 "$@"
}

start_job_worker() {  # out rank shards steps [flags...]
  local out=$1 r=$2 n=$3 steps=$4
  shift 4
  # shellcheck disable=SC2154  # model is the caller's
  "$bin/zps-train" --mode worker --endpoint "127.0.0.1:${port[0]}" --token-file "$work/token" \
    --rank "$r" --shards "$n" --steps "$steps" "${model[@]}" --ucx-tls "${job_tls:-tcp}" \
    --op-timeout "${job_op_timeout:-60}" --log-every "${job_log_every:-10}" --print-crcs "$@" \
    > "$out.out" 2> "$out.err" &
  worker_pid=$!
  worker_pids+=("$worker_pid")
  pids+=("$worker_pid")
}

start_job_workers() {  # dir shards steps [flags...]
  local dir=$1 n=$2 steps=$3 r
  shift 3
  worker_pids=()
  for ((r = 0; r < ${job_world:-2}; r++)); do
    start_job_worker "$dir/worker$r.$steps" "$r" "$n" "$steps" "$@"
  done
}

join_job_workers() {
  local rc=0
  join_pids "${job_join_timeout:-180}" "${worker_pids[@]}" || rc=1
  worker_pids=()
  return "$rc"
}

stop_job_shards() {  # shards
  local n=$1 i rc=0
  for ((i = 0; i < n; i++)); do kill -TERM "${shard_pid[$i]}" 2>/dev/null || true; done
  for ((i = 0; i < n; i++)); do
    wait_exit "${shard_pid[$i]}" 30 || rc=1
    wait "${shard_pid[$i]}" 2>/dev/null || true
  done
  return "$rc"
}

# Says that the job of DIR failed, with the tails of its workers' errors and its shards' logs.
job_failed() {  # dir shards steps
  echo "(the job of $2 shards to step $3 failed)"
  dump_logs 12 "$1"/worker*."$3".err "$1"/shard*.log
}

finish_job() {  # dir shards steps
  local dir=$1 n=$2 steps=$3 ok=0
  join_job_workers || ok=1
  stop_job_shards "$n" || ok=1
  if [[ $ok -ne 0 ]]; then
    job_failed "$@"
    return 1
  fi
  grep '^chunk_crc' "$dir/worker0.$steps.out" > "$dir/final.crc" || true
}

run_job() {  # dir shards steps
  start_job_workers "$@"
  finish_job "$@"
}

metric() {  # port name
  curl -sf "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n {printf "%.0f\n", $2}'
}

start_metered_shards() {  # dir shards
  local dir=$1 n=$2 i
  mkdir -p "$dir"
  port=()
  mport=()
  for ((i = 0; i < n; i++)); do port[i]=$(free_port); mport[i]=$(free_port); done
  for ((i = 0; i < n; i++)); do
    # shellcheck disable=SC2154  # job_shard_flags is the caller's (unset: none)
    start_loopback_shard "$dir" "$i" "$n" "" --metrics-port "${mport[$i]}" "${job_shard_flags[@]}"
  done
}

run_metered_job() {  # dir shards steps [flags...]
  local dir=$1 n=$2 steps=$3 i push=0 fetch=0
  shift 3
  start_metered_shards "$dir" "$n"
  start_job_workers "$dir" "$n" "$steps" "$@"
  if ! join_job_workers; then
    stop_job_shards "$n" || true
    job_failed "$dir" "$n" "$steps"
    return 1
  fi
  for ((i = 0; i < n; i++)); do
    push=$((push + $(metric "${mport[$i]}" zps_push_bytes_total)))
    fetch=$((fetch + $(metric "${mport[$i]}" zps_fetch_bytes_total)))
  done
  echo "$push" > "$dir/push"
  echo "$fetch" > "$dir/fetch"
  finish_job "$dir" "$n" "$steps"
}

metered_init() {  # token world shards steps [zps-train flags...]
  work_init "$1"
  world=$2 shards=$3 steps=$4
  shift 4
  model=(--world-size "$world" "$@")
  declare -gA shard_pid=()
  job_world=$world
  job_log_every=1
}

metered_run() {  # name [flags...]
  local name=$1 dir="$work/$1"
  shift
  run_metered_job "$dir" "$shards" "$steps" "$@" || fail "run $name ($*) failed"
  echo "== $name${*:+ ($*)}: shard ingress $(cat "$dir/push") B, egress $(cat "$dir/fetch") B"
  grep -E '^(step|held-out|summary|prefetch)' "$dir/worker0.$steps.out" | sed 's/^/   /'
}

stores() {  # dir shards
  local out="" i
  for ((i = 0; i < $2; i++)); do out+="${out:+,}$1/s$i/checkpoints"; done
  echo "$out"
}

export_model() {  # dir shards out
  "$bin/zps-ckpt" export --data-dir "$(stores "$1" "$2")" --out "$3" > /dev/null
}

matches_baseline() {  # name dir shards what
  local name=$1 dir=$2
  export_model "$dir" "$3" "$work/$name.safetensors"
  if ! cmp -s "$work/base.safetensors" "$work/$name.safetensors"; then
    scenario_fail "$name" "the export $4 differs from the uninterrupted run's"
    return 1
  fi
  if ! diff -q "$work/base/final.crc" "$dir/final.crc" > /dev/null; then
    scenario_fail "$name" "master/m/v/serving CRCs $4 differ from the uninterrupted run's"
    diff "$work/base/final.crc" "$dir/final.crc" | head -5
    return 1
  fi
}

tree_sum() {  # dir
  (cd "$1" && find . -type f -print0 | sort -z | xargs -0 md5sum | md5sum | cut -d' ' -f1)
}

private_tmpfs() {  # size dir
  mount_ns=(unshare -m)
  if ! "${mount_ns[@]}" true 2>/dev/null; then mount_ns=(unshare -rm); fi
  "${mount_ns[@]}" sh -c "mount -t tmpfs -o size=$1 tmpfs '$2'" 2>/dev/null
}
