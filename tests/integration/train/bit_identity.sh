#!/usr/bin/env bash
# Bit-identity: a distributed run (2 zps-server shards + 2 zps-train workers, server-sum, real
# processes on loopback) must end with exactly the same state as the in-process reference run of
# the same model, data and optimizer. Compares the CRC32C of every chunk's master, m, v and
# serving copy. Usage: bit_identity.sh BIN_DIR [extra zps-train flags...]
# The distributed run uses UCX over tcp, or BIT_IDENTITY_TLS (e.g. shm: posix,cma,self, which
# fetches by RMA get from the shards' serving regions).
set -euo pipefail
bin=$1
shift
common=(--steps 24 --d-model 32 --n-layers 4 --n-heads 2 --d-ff 64 --seq-len 32 --batch 4
        --chunk-elems 8192 --world-size 2 --shards 2 --print-crcs --log-every 4 "$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== reference: ${common[*]}"
"$bin/zps-train" --mode reference "${common[@]}" | tee "$work/ref.out"
tls=${BIT_IDENTITY_TLS:-tcp}
echo "== distributed (2 shards x 2 workers, UCX $tls):"
"$bin/zps-train" --mode local --ucx-tls "$tls" "${common[@]}" | tee "$work/dist.out"

grep '^chunk_crc' "$work/ref.out" > "$work/ref.crc"
grep '^chunk_crc' "$work/dist.out" > "$work/dist.crc"
n=$(wc -l < "$work/ref.crc")
if [[ "$n" -lt 4 ]]; then
  echo "FAIL: expected CRCs of at least 4 chunks, got $n"
  exit 1
fi
if ! diff "$work/ref.crc" "$work/dist.crc"; then
  echo "FAIL: distributed state differs from the reference"
  exit 1
fi
if [[ " $* " == *" --inject-overflow-step "* ]]; then
  for f in ref dist; do
    grep -q 'skipped' "$work/$f.out" || { echo "FAIL: the forced overflow did not skip a step ($f)"; exit 1; }
  done
fi
echo "PASS: $n chunks bit-identical"
