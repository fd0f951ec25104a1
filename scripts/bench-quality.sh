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
#   3. zps-train's default LM with quantized weights and gradients (fp32 state), QUANT_MODES
#      (w8 = --quantized-weights int8, g8 / g4 = --quantized-grads int8 / int4, -noef =
#      --grad-error-feedback=false; e.g. w8g4-noef), --mode reference, STEPS updates each,
#      PARALLEL runs side by side, against part 1's fp32 run (or one made here).
# Writes the CSV (model, dtype or mode, step, train loss, held-out loss), the PNGs, and prints
# the tables of final held-out losses against fp32 (bands: int8 state 1%, bf16 state 0.5%;
# int8 weights + int8 gradients 1%, + int4 gradients 2%).
#
#   scripts/bench-quality.sh   # env: STEPS (2000), EVAL_EVERY (100), TORCH_STEPS (200),
#                              #      TORCH_EVAL_EVERY (25), TORCH_MODELS (lm,mobilenet_v3_small),
#                              #      DTYPES (fp32,bf16,int8), CSV (<work>/quality.csv),
#                              #      PNG (docs/img/state-dtype-quality.png), BUILD_DIR (build),
#                              #      DATA_SEEDS (1), TRAIN_ARGS (none), RECIPE (below),
#                              #      QUANT_MODES (w8g8,w8g4,w8g4-noef; "" skips part 3),
#                              #      QUANT_PNG (docs/img/quantized-quality.png), PARALLEL (2)
# RECIPE is the learning-rate recipe of parts 1 and 3 (default: --lr-schedule WarmupDecayLR
# --warmup-num-steps 100 --warmup-type linear, lr 3e-3 decaying linearly to 0 at STEPS): with
# zps-train's constant lr the held-out loss of one run moves 2-5% between evaluations, more
# than the bands; with the decay the curve is smooth and an fp32 run perturbed by --eps
# 1.01e-8 ends 0.08% from the unperturbed one (docs/benchmarks.md, "Training quality: the
# measurement"). RECIPE="" is zps-train's own constant lr.
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
RECIPE=${RECIPE-"--lr-schedule WarmupDecayLR --warmup-num-steps 100 --warmup-type linear"}
WORK=${WORK:-$(mktemp -d /tmp/zps-quality.XXXXXX)}
CSV=${CSV:-$WORK/quality.csv}
PNG=${PNG:-docs/img/state-dtype-quality.png}
QUANT_MODES=${QUANT_MODES-w8g8,w8g4,w8g4-noef}
QUANT_PNG=${QUANT_PNG:-docs/img/quantized-quality.png}
PARALLEL=${PARALLEL:-2}
py=/usr/bin/python3
tool=bench/state_dtype_quality.py
[[ -x $BUILD_DIR/bin/zps-train && -f $BUILD_DIR/lib/libzps_c.so ]] || {
  echo "build first: scripts/build.sh" >&2
  exit 1
}
mkdir -p "$WORK"
: >"$CSV"
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); logs in $WORK"

base=zps-train-lm
[[ -n $TRAIN_ARGS ]] && base=zps-train-small
if ((STEPS > 0)); then
  for seed in ${DATA_SEEDS//,/ }; do
    model=$base
    [[ $DATA_SEEDS != 1 ]] && model=$base-seed$seed
    pids=()
    for dt in ${DTYPES//,/ }; do
      # shellcheck disable=SC2206  # TRAIN_ARGS is a list of flags
      cmd=("$BUILD_DIR/bin/zps-train" --mode reference --steps "$STEPS" --log-every 1
        --eval-every "$EVAL_EVERY" --state-dtype "$dt" --data-seed "$seed" $RECIPE $TRAIN_ARGS)
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

# zps-train's flags for a quantized mode's name (QUANT_MODES).
mode_flags() {
  local m=$1 f=()
  [[ $m == *w8* ]] && f+=(--quantized-weights int8)
  [[ $m == *g8* ]] && f+=(--quantized-grads int8)
  [[ $m == *g4* ]] && f+=(--quantized-grads int4)
  [[ $m == *-noef ]] && f+=(--grad-error-feedback=false)
  echo "${f[*]}"
}

if ((STEPS > 0)) && [[ -n $QUANT_MODES ]]; then
  qmodel=$base-quantized
  ref=$WORK/$base-fp32.log  # part 1's fp32 run (data seed 1), if it made one
  modes=$QUANT_MODES
  [[ -s $ref && $DATA_SEEDS == 1 ]] || modes=fp32,$QUANT_MODES
  # shellcheck disable=SC2086  # the modes' names, one word each
  set -- ${modes//,/ }
  while (($# > 0)); do
    pids=()
    for ((k = 0; k < PARALLEL && $# > 0; k++)); do
      m=$1
      shift
      # shellcheck disable=SC2206,SC2207  # flag lists
      cmd=("$BUILD_DIR/bin/zps-train" --mode reference --steps "$STEPS" --log-every 1
        --eval-every "$EVAL_EVERY" $(mode_flags "$m") $RECIPE $TRAIN_ARGS)
      log=$WORK/$qmodel-$m.log
      [[ $m == fp32 ]] && log=$ref
      echo "# ${cmd[*]} > $log"
      "${cmd[@]}" >"$log" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
  done
  for m in fp32 ${QUANT_MODES//,/ }; do
    log=$WORK/$qmodel-$m.log
    [[ $m == fp32 ]] && log=$ref
    grep -E '^(reference|held-out loss [0-9])' "$log" | sed "s/^/# $qmodel $m: /"
    $py $tool parse --model "$qmodel" --dtype "$m" --csv "$CSV" "$log"
  done
fi

if ((TORCH_STEPS > 0)); then
  echo "# $py $tool torch --models $TORCH_MODELS --state-dtypes $DTYPES --steps $TORCH_STEPS --eval-every $TORCH_EVAL_EVERY"
  $py $tool torch --models "$TORCH_MODELS" --state-dtypes "$DTYPES" --steps "$TORCH_STEPS" \
    --eval-every "$TORCH_EVAL_EVERY" --csv "$CSV" 2> >(grep -v '^[IW] ' >&2)
fi

$py $tool plot "$CSV" --png "$PNG" --exclude "$base-quantized"
if ((STEPS > 0)) && [[ -n $QUANT_MODES ]]; then
  $py $tool plot "$CSV" --png "$QUANT_PNG" --models "$base-quantized" \
    --title "Quantized weights and gradients, fp32 master and state"
fi
echo "# csv: $CSV"
