#!/usr/bin/env bash
# Training quality per optimizer state dtype: the shards' Adam moments in fp32, bf16 or int8,
# the fp32 master the same in all three (docs/optimizer.md, "Compact optimizer state").
#   1. zps-train's default LM, STEPS updates per dtype, the three runs side by side, each one
#      single-threaded process: --mode reference, the same training in one process, whose state
#      is bit-identical to the distributed run's (tests/integration/train/bit_identity.sh, for
#      every state dtype) at a third of its processes;
#   2. through zps.torch (embedded cluster, zps.state_dtype in the config), the TransformerEncoder
#      LM of examples/train_lm.py and torchvision's mobilenet_v3_small, TORCH_STEPS updates per
#      dtype.
# Writes the CSV (model, dtype, step, train loss, held-out loss), the PNG, and prints the table
# of final held-out losses against fp32 state (bands: int8 1%, bf16 0.5%).
#
#   scripts/bench-quality.sh   # env: STEPS (2000), EVAL_EVERY (100), TORCH_STEPS (200),
#                              #      TORCH_EVAL_EVERY (25), TORCH_MODELS (lm,mobilenet_v3_small),
#                              #      DTYPES (fp32,bf16,int8), CSV (<work>/quality.csv),
#                              #      PNG (docs/img/state-dtype-quality.png), BUILD_DIR (build),
#                              #      DATA_SEEDS (1), TRAIN_ARGS (none)
# STEPS=0 or TORCH_STEPS=0 skips that part; WORK (default: a new temp dir) keeps the logs.
# DATA_SEEDS=1,2,3 repeats part 1 per --data-seed (the seeds one after another, the dtypes of a
# seed side by side), each seed its own panel and its own fp32 reference: one run's gap between
# dtypes means little beside the gap between two fp32 runs that differ only in the data order
# (docs/benchmarks.md, "Compact optimizer state: training quality"). TRAIN_ARGS adds zps-train
# flags to every run of part 1 (e.g. a smaller model: "--d-model 64 --n-layers 2 --n-heads 2
# --d-ff 256 --seq-len 64"; the panels are then named zps-train-small).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BUILD_DIR=${BUILD_DIR:-build}
STEPS=${STEPS:-2000}
EVAL_EVERY=${EVAL_EVERY:-100}
TORCH_STEPS=${TORCH_STEPS:-200}
TORCH_EVAL_EVERY=${TORCH_EVAL_EVERY:-25}
TORCH_MODELS=${TORCH_MODELS:-lm,mobilenet_v3_small}
DTYPES=${DTYPES:-fp32,bf16,int8}
DATA_SEEDS=${DATA_SEEDS:-1}
TRAIN_ARGS=${TRAIN_ARGS:-}
WORK=${WORK:-$(mktemp -d /tmp/zps-quality.XXXXXX)}
CSV=${CSV:-$WORK/quality.csv}
PNG=${PNG:-docs/img/state-dtype-quality.png}
py=/usr/bin/python3
tool=bench/state_dtype_quality.py
[[ -x $BUILD_DIR/bin/zps-train && -f $BUILD_DIR/lib/libzps_c.so ]] || {
  echo "build first: scripts/build.sh" >&2
  exit 1
}
mkdir -p "$WORK"
: >"$CSV"
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); logs in $WORK"

if ((STEPS > 0)); then
  base=zps-train-lm
  [[ -n $TRAIN_ARGS ]] && base=zps-train-small
  for seed in ${DATA_SEEDS//,/ }; do
    model=$base
    [[ $DATA_SEEDS != 1 ]] && model=$base-seed$seed
    pids=()
    for dt in ${DTYPES//,/ }; do
      # shellcheck disable=SC2206  # TRAIN_ARGS is a list of flags
      cmd=("$BUILD_DIR/bin/zps-train" --mode reference --steps "$STEPS" --log-every 1
        --eval-every "$EVAL_EVERY" --state-dtype "$dt" --data-seed "$seed" $TRAIN_ARGS)
      log=$WORK/$model-$dt.log
      echo "# ${cmd[*]} > $log"
      "${cmd[@]}" >"$log" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    for dt in ${DTYPES//,/ }; do
      log=$WORK/$model-$dt.log
      grep -E '^(reference|held-out loss [0-9])' "$log" | sed "s/^/# $model $dt: /"
      $py $tool parse --model "$model" --dtype "$dt" --csv "$CSV" "$log"
    done
  done
fi

if ((TORCH_STEPS > 0)); then
  echo "# $py $tool torch --models $TORCH_MODELS --state-dtypes $DTYPES --steps $TORCH_STEPS --eval-every $TORCH_EVAL_EVERY"
  $py $tool torch --models "$TORCH_MODELS" --state-dtypes "$DTYPES" --steps "$TORCH_STEPS" \
    --eval-every "$TORCH_EVAL_EVERY" --csv "$CSV" 2> >(grep -v '^[IW] ' >&2)
fi

$py $tool plot "$CSV" --png "$PNG"
echo "# csv: $CSV"
