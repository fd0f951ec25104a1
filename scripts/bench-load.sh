#!/usr/bin/env bash
# Many workers under a flood (issue 12, item 4): WORLD zps-train workers (default 16) x SHARDS
# shards (default 4), a tiny model, STEPS steps (default 200), UCX over tcp loopback: the cluster
# alone ("quiet", the reference) and the same cluster while zps-flood sends malformed frames,
# connection floods and malformed active messages at every shard ("flood"), alternating twice
# (quiet1 flood1 quiet2 flood2, fresh shards each) so a noisy neighbour hits both alike. Prints
# p50/p99 of the fetch and push requests as the workers saw them and of the step time, per run
# and as a summary (each figure's median over the runs of its kind, flood/quiet ratio), with the
# machine and its load average; checks as tests/integration/load/flood.sh (every step committed,
# the final state equal to the in-process reference, the flood seen in /metrics).
#   scripts/bench-load.sh                      # WORLD=16 SHARDS=4 STEPS=200 BUILD_DIR=build
#   STEPS=50 FLOOD_ARGS="--interval-ms 20" scripts/bench-load.sh --d-model 32
# Extra arguments go to every zps-train run; FLOOD_ARGS to zps-flood.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
bin=$BUILD_DIR/bin
[[ -x $bin/zps-train && -x $bin/zps-flood ]] || { echo "build first: scripts/build.sh" >&2; exit 1; }
export WORLD=${WORLD:-16} SHARDS=${SHARDS:-4} STEPS=${STEPS:-200} RUNS=${RUNS:-quiet1 flood1 quiet2 flood2}
echo "# bench-load: WORLD=$WORLD SHARDS=$SHARDS STEPS=$STEPS RUNS='$RUNS' FLOOD_ARGS='${FLOOD_ARGS:-}' $0 $*"
echo "# machine: $(nproc) cores ($(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
tests/integration/load/flood.sh "$bin" "$@" | tee "$out"
python3 - "$out" <<'PY'
import statistics, sys
runs = {}  # (kind, what) -> [(p50, p99)]
for line in open(sys.argv[1]):
    f = line.split()
    if f[:1] == ["latency_summary"]:
        kind = f[1].rstrip("0123456789")
        runs.setdefault((kind, f[2]), []).append((float(f[3]), float(f[4])))
print("# summary (median over runs)        quiet p50    quiet p99    flood p50    flood p99   flood/quiet p50  p99")
for what, unit, scale in (("fetch", "ms", 1e3), ("push", "ms", 1e3), ("step", "s ", 1.0)):
    q, fl = runs.get(("quiet", what)), runs.get(("flood", what))
    if not q or not fl:
        continue
    qp50, qp99 = (statistics.median(x[i] for x in q) for i in (0, 1))
    fp50, fp99 = (statistics.median(x[i] for x in fl) for i in (0, 1))
    label = "step time" if what == "step" else what + " request"
    print(f"#   {label:14s} ({unit})       {qp50 * scale:10.3f}   {qp99 * scale:10.3f}   {fp50 * scale:10.3f}   {fp99 * scale:10.3f}"
          f"   {fp50 / qp50:10.2f}x  {fp99 / qp99:5.2f}x")
PY
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
