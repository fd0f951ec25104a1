#!/usr/bin/env bash
# Many workers under a flood (issue 12, item 4): WORLD zps-train workers (default 16) x SHARDS
# shards (default 4), a tiny model, STEPS steps (default 200), UCX over tcp loopback; first the
# cluster alone (the reference, "quiet"), then the same cluster while zps-flood sends malformed
# frames, connection floods and malformed active messages at every shard ("flood"). Prints p50/p99
# of the fetch and push requests as the workers saw them and of the step time, for both runs,
# with the machine and its load average; checks as tests/integration/load/flood.sh (every step
# committed, the final state equal to the in-process reference, the flood seen in /metrics).
#   scripts/bench-load.sh                      # WORLD=16 SHARDS=4 STEPS=200 BUILD_DIR=build
#   STEPS=50 FLOOD_ARGS="--interval-ms 20" scripts/bench-load.sh --d-model 32
# Extra arguments go to every zps-train run; FLOOD_ARGS to zps-flood.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
bin=$BUILD_DIR/bin
[[ -x $bin/zps-train && -x $bin/zps-flood ]] || { echo "build first: scripts/build.sh" >&2; exit 1; }
export WORLD=${WORLD:-16} SHARDS=${SHARDS:-4} STEPS=${STEPS:-200} RUNS=${RUNS:-quiet flood}
echo "# bench-load: WORLD=$WORLD SHARDS=$SHARDS STEPS=$STEPS RUNS='$RUNS' FLOOD_ARGS='${FLOOD_ARGS:-}' $0 $*"
echo "# machine: $(nproc) cores ($(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
tests/integration/load/flood.sh "$bin" "$@"
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
