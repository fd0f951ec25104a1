#!/usr/bin/env bash
# Multi-host runs and network partitions in network namespaces: shard 0 (the coordinator),
# shard 1 and the workers each run as their own host (`ip netns`, a veth each, joined by a
# bridge in a fourth "switch" namespace, 10.<n>.0.0/24; the host's own network is not touched;
# testbed.sh, shared with the slow-network testbed, makes them).
# Every shard gets --bind and --advertise-host with its namespace address, as
# docs/operations.md describes for hosts. The test creates and removes the namespaces itself
# and exits 77 (skipped) where they cannot be made (no root / no CAP_SYS_ADMIN). Data plane tcp.
#   hosts        the job trains and ends bit-identical to the in-process reference (before the
#                --bind fix shard 0 dialled its own coordinator at 127.0.0.1, was refused, never
#                registered, and the workers failed after 60 s: "shard 0 has not registered yet").
#   cut-5s       shard 1's link is cut for 5 s at step 8, then restored: the waits are bounded,
#                the connections carry on (or the workers re-join), and the end is bit-identical.
#   cut-forever  shard 1's link is cut for good at step 8: every worker exits with an error naming
#                shard 1 within --op-timeout (plus a margin), never a hang.
#   cut-worker   the workers' link is cut for 5 s at step 8, then restored: bit-identical end.
# Usage: netns.sh BIN_DIR [scenario...]
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
# shellcheck source=SCRIPTDIR/testbed.sh
source "$(dirname "${BASH_SOURCE[0]}")/testbed.sh"
bin=$(cd "$1" && pwd)
shift
model=(--steps 20 --d-model 32 --n-layers 2 --n-heads 2 --d-ff 64 --seq-len 32 --batch 4
       --chunk-elems 8192 --world-size 2 --shards 2 --max-grad-norm 0.05)
work_init netns-test-token

setup_net() {
  testbed_init
  local h
  for h in s0 s1 w; do testbed_host "$h"; done
  testbed_wait_reachable w s0
}

reference_crcs "${model[@]}"
setup_net
echo "namespaces: shard 0 ${tb_addr[s0]}, shard 1 ${tb_addr[s1]}, workers ${tb_addr[w]} (bridge in $tb_sw)"

dump() { dump_logs 12 "$1"/worker0.err "$1"/worker1.err "$1"/shard0.log "$1"/shard1.log; }

scenario() {  # name what(none|cut:<host>:<seconds>|cut:<host>:forever)
  local name=$1 what=$2
  local dir=$work/$name
  mkdir -p "$dir"
  local sp=() i
  for i in 0 1; do
    local h=s$i
    local args=(--ordinal "$i" --shards 2 --port 7070 --bind "${tb_addr[$h]}"
                --advertise-host "${tb_addr[$h]}" --token-file "$work/token" --metrics-port 0
                --ucx-tls tcp --step-timeout 60 --threads 1)
    [[ $i -ne 0 ]] && args+=(--coordinator "${tb_addr[s0]}:7070")
    ip netns exec "${tb_ns[$h]}" "$bin/zps-server" "${args[@]}" > "$dir/shard$i.log" 2>&1 &
    sp+=($!); pids+=($!)
  done
  local op_timeout=20
  # A link cut for good must land while the job still runs: a 20-step job on a quiet machine can
  # finish between step 8 and the cut, so that scenario trains for far longer than it can reach.
  local steps=()
  [[ $what == *:forever ]] && steps=(--steps 100000)
  local w=() r
  for r in 0 1; do
    ip netns exec "${tb_ns[w]}" "$bin/zps-train" --mode worker --endpoint "${tb_addr[s0]}:7070" \
      --token-file "$work/token" --rank "$r" "${model[@]}" "${steps[@]}" --ucx-tls tcp \
      --op-timeout "$op_timeout" --max-recoveries 3 --log-every 1 --print-crcs \
      > "$dir/worker$r.out" 2> "$dir/worker$r.err" &
    w+=($!); pids+=($!)
  done
  local t_cut=0 host="" secs=""
  if [[ $what == cut:* ]]; then
    IFS=: read -r _ host secs <<< "$what"
    if ! wait_grep "$dir/worker0.out" "^step +8 " 90 0.02; then
      scenario_fail "$name" "step 8 never reached"; dump "$dir"; return
    fi
    testbed_cut "$host"
    t_cut=$(date +%s)
    echo "  $name: cut $host's link at step 8"
    if [[ $secs != forever ]]; then
      sleep "$secs"
      testbed_restore "$host"
      echo "  $name: restored $host's link after $secs s"
    fi
  fi
  if [[ $secs == forever ]]; then
    # Every worker must fail its step with an error naming shard 1 within op_timeout, then stop
    # (its re-join gives up on the unreachable shard within the 60 s connect timeout).
    local limit=$(( op_timeout + 60 + 30 )) p rc
    for r in 0 1; do
      p=${w[$r]}
      if ! wait_exit "$p" "$limit"; then
        scenario_fail "$name" "rank $r still running $limit s after the cut"; dump "$dir"; return
      fi
      rc=0; wait "$p" 2>/dev/null || rc=$?
      if [[ $rc -eq 0 ]]; then scenario_fail "$name" "rank $r exited 0"; dump "$dir"; return; fi
      if ! grep -m1 "re-joining the job" "$dir/worker$r.err" | grep -Eq "(by|of) shard 1"; then
        scenario_fail "$name" "rank $r's first error does not name shard 1"; dump "$dir"; return
      fi
      if ! tail -n 3 "$dir/worker$r.err" | grep -Eq "shard 1"; then
        scenario_fail "$name" "rank $r's last error does not name shard 1"; dump "$dir"; return
      fi
    done
    testbed_restore "$host"
    kill -9 "${sp[@]}" 2>/dev/null || true
    echo "PASS $name: both workers stopped $(( $(date +%s) - t_cut )) s after the cut; rank 0: $(tail -n 1 "$dir/worker0.err" | cut -c1-200)"
    return
  fi
  local ok=1
  join_pids 180 "${w[@]}" || ok=0
  kill -TERM "${sp[@]}" 2>/dev/null || true
  grep '^chunk_crc' "$dir/worker0.out" > "$dir/dist.crc" || true
  if [[ $ok -ne 1 ]]; then scenario_fail "$name" "a worker failed"; dump "$dir"; return; fi
  if ! diff -q "$work/ref.crc" "$dir/dist.crc" > /dev/null; then
    scenario_fail "$name" "not bit-identical to the reference"; diff "$work/ref.crc" "$dir/dist.crc" | head -5
    dump "$dir"; return
  fi
  if ! grep -q "connected from ${tb_addr[w]}" "$dir/shard1.log"; then
    scenario_fail "$name" "shard 1 did not see the workers at their namespace address"; dump "$dir"; return
  fi
  local rejoins
  rejoins=$(cat "$dir/worker0.err" "$dir/worker1.err" | grep -c "re-joining the job" || true)
  echo "PASS $name: $(wc -l < "$dir/dist.crc") chunks bit-identical; worker re-joins: $rejoins"
}

all=(hosts cut-5s cut-worker cut-forever)
sel=("$@")
[[ ${#sel[@]} -eq 0 ]] && sel=("${all[@]}")
for s in "${sel[@]}"; do
  case $s in
    hosts) scenario hosts none ;;
    cut-5s) scenario cut-5s cut:s1:5 ;;
    cut-worker) scenario cut-worker cut:w:5 ;;
    cut-forever) scenario cut-forever cut:s1:forever ;;
    *) echo "unknown scenario $s"; exit 2 ;;
  esac
done
scenarios_done "every network-namespace scenario"
