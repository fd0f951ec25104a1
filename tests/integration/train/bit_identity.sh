#!/usr/bin/env bash
# Bit-identity: a distributed run (2 zps-server shards + 2 zps-train workers, server-sum, real
# processes on loopback) must end with exactly the same state as the in-process reference run of
# the same model, data and optimizer. Compares the CRC32C of every chunk's master, m, v and
# serving copy, and the held-out losses printed along the way (--eval-every: in the distributed
# run rank 0 evaluates the version the shards serve right after each commit, which must be the
# reference's state at that step). Usage: bit_identity.sh BIN_DIR [extra zps-train flags...]
# The distributed run uses UCX over tcp, or BIT_IDENTITY_TLS (e.g. shm: posix,cma,self, which
# fetches by RMA get from the shards' serving regions).
# With --update speculative the reference is the synchronous computation, so a pass means the
# speculative run ended bit-identical to --update sync; the shards' logs must then show that the
# speculation ran: BIT_IDENTITY_EXPECT lists the outcomes that must each have happened at least
# once (published, redone = a clipped step, dropped = a skipped step, sync = a chunk updated at
# the commit, e.g. beyond the spares of a memory budget).
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
bin=$1
shift
common=(--steps 24 --d-model 32 --n-layers 4 --n-heads 2 --d-ff 64 --seq-len 32 --batch 4
        --chunk-elems 8192 --world-size 2 --shards 2 --print-crcs --log-every 4 --eval-every 8 "$@")
work_init

echo "== reference: ${common[*]}"
"$bin/zps-train" --mode reference "${common[@]}" | tee "$work/ref.out"
tls=${BIT_IDENTITY_TLS:-tcp}
echo "== distributed (2 shards x 2 workers, UCX $tls):"
spec=0
[[ " $* " == *" --update speculative "* ]] && spec=1
if [[ $spec -eq 1 ]]; then
  ZPS_KEEP_CLUSTER_LOGS=1 "$bin/zps-train" --mode local --ucx-tls "$tls" "${common[@]}" | tee "$work/dist.out"
else
  "$bin/zps-train" --mode local --ucx-tls "$tls" "${common[@]}" | tee "$work/dist.out"
fi

grep '^chunk_crc' "$work/ref.out" > "$work/ref.crc"
grep '^chunk_crc' "$work/dist.out" > "$work/dist.crc"
n=$(wc -l < "$work/ref.crc")
if [[ "$n" -lt 4 ]]; then fail "expected CRCs of at least 4 chunks, got $n"; fi
if ! diff "$work/ref.crc" "$work/dist.crc"; then fail "distributed state differs from the reference"; fi
grep '^held-out loss' "$work/ref.out" > "$work/ref.eval"
grep '^held-out loss' "$work/dist.out" > "$work/dist.eval"
[[ $(wc -l < "$work/ref.eval") -eq 3 ]] || fail "expected 3 held-out lines (steps 8 and 16, the end)"
if ! diff "$work/ref.eval" "$work/dist.eval"; then fail "held-out losses differ from the reference"; fi
if [[ " $* " == *" --shard-serving-copies on-fetch "* ]]; then
  grep 'state bytes per parameter' "$work/dist.out" | grep -q 'serving 0.00)' ||
    fail "the shards kept serving copies with --shard-serving-copies on-fetch"
fi
if [[ " $* " == *" --inject-overflow-step "* ]]; then
  for f in ref dist; do
    grep -q 'skipped' "$work/$f.out" || fail "the forced overflow did not skip a step ($f)"
  done
fi
if [[ $spec -eq 1 ]]; then
  logs=$(sed -n 's/.*(logs in \(.*\))$/\1/p' "$work/dist.out" | head -1)
  [[ -n $logs && -d $logs ]] || fail "no cluster log directory"
  totals=$(grep -h "speculation totals" "$logs"/shard-*.log || true)
  rm -rf "$logs"
  echo "$totals"
  [[ $(wc -l <<< "$totals") -eq 2 ]] || fail "expected the speculation totals of 2 shards"
  for outcome in published ${BIT_IDENTITY_EXPECT:-}; do
    sum=0
    case $outcome in
      published) re='([0-9]+) chunk updates published' ;;
      redone) re='([0-9]+) redone' ;;
      dropped) re='([0-9]+) dropped' ;;
      sync) re='([0-9]+) updated at the commit' ;;
      *) echo "unknown outcome $outcome"; exit 2 ;;
    esac
    while read -r line; do
      [[ $line =~ $re ]] && sum=$(( sum + BASH_REMATCH[1] ))
    done <<< "$totals"
    if [[ $sum -eq 0 ]]; then fail "no chunk update was $outcome (the run did not exercise that path)"; fi
    echo "speculation: $sum chunk updates $outcome"
  done
fi
echo "PASS: $n chunks bit-identical"
