#!/usr/bin/env bash
# Training quality per optimizer state dtype: the shards' Adam moments in fp32, bf16 or int8,
# the fp32 master the same in all three (docs/optimizer.md, "Compact optimizer state").
#   1. zps-train's default LM, STEPS updates per dtype, the three runs side by side, each one
#      single-threaded process: --mode reference, the same training in one process, whose state
#      is bit-identical to the distributed run's (tests/integration/train/bit_identity.sh, for
#      every state dtype) at a third of its processes;
#   2. through zps.torch (embedded cluster, zps.state_dtype in the config), the TransformerEncoder
#      LM of examples/train_lm.py and torchvision's mobilenet_v3_small, TORCH_STEPS updates per
#      dtype, with DeepSpeed's WarmupDecayLR in the config (the lr rises linearly over the first
#      5% of the steps, then falls linearly to 0 at the last: part 1's RECIPE, scaled); and the
#      LM (when TORCH_MODELS has lm) in each of TORCH_QUANT_MODES (fp32 state, the names of
#      QUANT_MODES: zero_quantized_weights, zps.quantized_grads, zps.grad_error_feedback false),
#      as the model lm-quantized against the LM's fp32 run; one zps.torch job per dtype or mode,
#      PARALLEL of them side by side.
#   3. zps-train's default LM with quantized weights and gradients (fp32 state), QUANT_MODES
#      (w8 = --quantized-weights int8, g8 / g4 = --quantized-grads int8 / int4, -noef =
#      --grad-error-feedback=false; e.g. w8g4-noef), --mode reference, STEPS updates each,
#      PARALLEL runs side by side, against part 1's fp32 run (or one made here).
# Writes the CSV (model, dtype or mode, step, train loss, held-out loss), the PNGs, and prints
# the tables of final held-out losses against fp32 (bands: int8 state 1%, bf16 state 0.5%;
# int8 weights + int8 gradients 1%, + int4 gradients 2%). QUANT_PNG has the quantized runs of
# parts 3 and 2 (zps-train-lm-quantized, lm-quantized), PNG the rest.
#
#   scripts/bench-quality.sh   # env: STEPS (2000), EVAL_EVERY (100), TORCH_STEPS (500),
#                              #      TORCH_EVAL_EVERY (25), TORCH_MODELS (lm,mobilenet_v3_small),
#                              #      DTYPES (fp32,bf16,int8), CSV (<work>/quality.csv),
#                              #      PNG (docs/img/state-dtype-quality.png), BUILD_DIR (build),
#                              #      DATA_SEEDS (1), TRAIN_ARGS (none), RECIPE (below),
#                              #      QUANT_MODES (w8g8,w8g4,w8g4-noef; "" skips part 3),
#                              #      QUANT_PNG (docs/img/quantized-quality.png), PARALLEL (2),
#                              #      TORCH_QUANT_MODES (w8g8,w8g4,w8g4-noef; "" skips them)
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
TORCH_STEPS=${TORCH_STEPS:-500}
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
TORCH_QUANT_MODES=${TORCH_QUANT_MODES-w8g8,w8g4,w8g4-noef}
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

torch_quant=
if ((TORCH_STEPS > 0)); then
  # One job per (model, state dtype) and per quantized mode of the LM: "model dtypes modes".
  jobs=()
  for m in ${TORCH_MODELS//,/ }; do
    for dt in ${DTYPES//,/ }; do jobs+=("$m $dt -"); done
    if [[ $m == lm && -n $TORCH_QUANT_MODES ]]; then
      torch_quant=lm-quantized
      # the unquantized reference: the fp32-state run, or one made here
      [[ ,$DTYPES, == *,fp32,* ]] || jobs+=("lm - fp32")
      for q in ${TORCH_QUANT_MODES//,/ }; do jobs+=("lm - $q"); done
    fi
  done
  set -- "${jobs[@]}"
  while (($# > 0)); do
    pids=()
    for ((k = 0; k < PARALLEL && $# > 0; k++)); do
      read -r m dt q <<<"$1"
      shift
      [[ $dt == - ]] && dt=""
      [[ $q == - ]] && q=""
      out=$WORK/torch-$m-${dt:-$q}
      cmd=("$py" "$tool" torch --models "$m" --state-dtypes "$dt" --quant-modes "$q"
        --steps "$TORCH_STEPS" --eval-every "$TORCH_EVAL_EVERY" --csv "$out.csv")
      echo "# ${cmd[*]} > $out.log"
      rm -f "$out.csv"
      "${cmd[@]}" >"$out.log" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
  done
  for j in "${jobs[@]}"; do
    read -r m dt q <<<"$j"
    out=$WORK/torch-$m-$([[ $dt == - ]] && echo "$q" || echo "$dt")
    grep -v '^[IW] ' "$out.log" | sed 's/^/# /'
    [[ -s $CSV ]] || head -n 1 "$out.csv" >"$CSV"  # the header, when parts 1 and 3 wrote none
    tail -n +2 "$out.csv" >>"$CSV"
    # the LM's fp32-state run is lm-quantized's unquantized reference
    if [[ -n $torch_quant && $m == lm && $dt == fp32 ]]; then
      tail -n +2 "$out.csv" | sed 's/^lm,fp32,/lm-quantized,fp32,/' >>"$CSV"
    fi
  done
fi

$py $tool plot "$CSV" --png "$PNG" --exclude "$base-quantized,lm-quantized"
quant_models=$torch_quant
if ((STEPS > 0)) && [[ -n $QUANT_MODES ]]; then
  quant_models=$base-quantized${torch_quant:+,$torch_quant}
fi
if [[ -n $quant_models ]]; then
  $py $tool plot "$CSV" --png "$QUANT_PNG" --models "$quant_models" \
    --title "Quantized weights and gradients, fp32 master and state"
fi
echo "# csv: $CSV"
