# shellcheck shell=bash
# Helpers shared by the multi-process shell tests in tests/integration/ (recovery, worker_death,
# collectives, flood, netns, bit_identity). Sourced, never executed:
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
#       For each PID in turn: wait_exit up to TIMEOUT_S seconds (each PID its own timeout); one
#       still running then is SIGKILLed; then `wait` reaps it. Returns 1 if any PID timed out or
#       exited non-zero, else 0. Every PID is reaped either way.
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
  local timeout=$1 p rc=0
  shift
  for p in "$@"; do
    if ! wait_exit "$p" "$timeout"; then rc=1; kill -9 "$p" 2>/dev/null || true; fi
    wait "$p" 2>/dev/null || rc=1
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
