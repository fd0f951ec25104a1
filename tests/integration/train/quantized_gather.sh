#!/usr/bin/env bash
# Bandwidth-centric fetches of quantized weights end to end: 2 zps-server shards x 2 zps-train
# workers, real processes on loopback (UCX and Gloo over tcp), two runs of the same job with
# --quantized-weights int8 (fresh shards each):
#   Q   direct              each rank fetches whole parameters (dequantized as each piece lands)
#   QB  bandwidth-centric   each rank fetches a slice as int8 block records, the ranks
#                           all-gather the records and dequantize after the gather
# and checks that they end bit-identical (every chunk's master/m/v/serving CRC), and that every
# loss they log is the same: the gathered weights are a direct fetch's bits.
# Usage: quantized_gather.sh BIN_DIR [extra zps-train flags...]
set -euo pipefail
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
bin=$1
shift
# Small chunks: parameters span chunks and shards, slices start inside 256-element blocks.
metered_init quantized-gather-test-token 2 2 "${STEPS:-4}" --d-model 32 --n-layers 2 --n-heads 2 \
  --d-ff 64 --seq-len 32 --batch 4 --chunk-elems 8192 --quantized-weights int8 "$@"

metered_run Q --fetch-strategy direct
metered_run QB --fetch-strategy bandwidth-centric
[[ $(wc -l < "$work/Q/final.crc") -ge 4 ]] || fail "expected CRCs of at least 4 chunks"
diff "$work/Q/final.crc" "$work/QB/final.crc" > /dev/null ||
  fail "bandwidth-centric (QB) and direct (Q) quantized fetches end with different state"
grep -q ' [1-9][0-9]* gathered' "$work/QB/worker0.$steps.out" ||
  fail "the bandwidth-centric run gathered nothing"
diff <(grep '^step' "$work/Q/worker0.$steps.out" | awk '{print $1, $2, $3, $4, $5, $6}') \
     <(grep '^step' "$work/QB/worker0.$steps.out" | awk '{print $1, $2, $3, $4, $5, $6}') > /dev/null ||
  fail "the logged losses differ"
echo "Q = QB: every chunk's CRC and every logged loss"
echo "PASS"
