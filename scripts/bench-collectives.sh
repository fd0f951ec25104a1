#!/usr/bin/env bash
# The worker collectives in zps-train: step time and shard bytes per step for server-sum vs
# pre-reduced and direct vs bandwidth-centric, WORLD ranks (default 4) x 2 shards, UCX and Gloo
# over tcp loopback, with a Gloo all-reduce / reduce-scatter / all-gather of the same bytes (the
# model's fp32 gradient) in the same run as the reference.
#   scripts/bench-collectives.sh             # defaults: WORLD=4 SHARDS=2 STEPS=20 BUILD_DIR=build
#   WORLD=8 SHARDS=4 scripts/bench-collectives.sh --d-model 64   # the 8-rank x 4-shard job
# Extra arguments go to every zps-train run (e.g. --d-model 256). Prints JSON lines.
#
#   PART=moe scripts/bench-collectives.sh    # ranks that agree vs ranks that diverge (zps.torch)
# runs bench/torch_divergent.py under torchrun instead, WORLD ranks, in each of the four modes: a
# mixture of experts routed alike on every rank, then per rank (the same work): median step time and shard bytes per step for both, and their
# ratio (extra arguments go to the script).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tests/integration/lib.sh
source tests/integration/lib.sh
BUILD_DIR=${BUILD_DIR:-build}
WORLD=${WORLD:-4}
combos=("server-sum direct" "pre-reduced direct" "server-sum bandwidth-centric" "pre-reduced bandwidth-centric")
if [[ ${PART:-} == moe ]]; then
  echo "# zps.torch divergent MoE: $WORLD ranks on $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  for combo in "${combos[@]}"; do
    read -r red fs <<< "$combo"
    rdzv_port=$(free_port)
    PYTHONPATH=python ZPS_BUILD_DIR=$BUILD_DIR ZPS_LOG_LEVEL=warning /usr/bin/python3 \
      -m torch.distributed.run --nnodes=1 --rdzv_backend=c10d --rdzv_endpoint="127.0.0.1:$rdzv_port" \
      --nproc_per_node="$WORLD" --redirects 2 --tee 2 bench/torch_divergent.py \
      --reduction "$red" --fetch-strategy "$fs" "$@" 2>/dev/null | grep -o '{"bench".*'
  done
  exit 0
fi
SHARDS=${SHARDS:-2}
STEPS=${STEPS:-20}
bin=$BUILD_DIR/bin
[[ -x $bin/zps-train && -x $bin/zps-bench ]] || { echo "build first: scripts/build.sh" >&2; exit 1; }
work_init bench-collectives-token
declare -A shard_pid
job_world=$WORLD
job_log_every=100000
job_op_timeout=300        # zps-train's default
job_join_timeout=0        # a run takes as long as it takes
job_shard_flags=(--threads 0 --log-level warning)  # zps-server's optimizer threads: one per CPU
model=(--steps "$STEPS" --world-size "$WORLD" --shards "$SHARDS" --log-every "$job_log_every"
       --ucx-tls tcp "$@")

echo "# zps-train collectives: $WORLD ranks x $SHARDS shards on $(nproc) cores ($(uname -m)), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# options: ${model[*]}"
params=""
for combo in "${combos[@]}"; do
  read -r red fs <<< "$combo"
  dir=$work/$red.$fs
  run_metered_job "$dir" "$SHARDS" "$STEPS" --reduction "$red" --fetch-strategy "$fs" || exit 1
  push=$(cat "$dir/push") fetch=$(cat "$dir/fetch")
  params=$(awk '/^rank 0: [0-9]+ parameters/ {print $3}' "$dir/worker0.$STEPS.out")
  step_s=$(sed -nE 's/^summary: .* ([0-9.]+)s\/step.*/\1/p' "$dir/worker0.$STEPS.out")
  python3 - "$red" "$fs" "$WORLD" "$STEPS" "$params" "$push" "$fetch" "$step_s" <<'PY'
import json, sys
red, fs, world, steps, params, push, fetch, step_s = sys.argv[1:]
world, steps, params, push, fetch = map(int, (world, steps, params, push, fetch))
model = params * 4
print(json.dumps({"reduction": red, "fetch_strategy": fs, "world": world, "s_per_step": float(step_s),
                  "model_fp32_bytes": model,
                  "shard_ingress_bytes_per_step": (push - model) // steps,   # less rank 0's initial values
                  "ingress_x_model": round((push - model) / steps / model, 3),
                  # less rank 0's two direct bf16 evaluations
                  "shard_egress_bytes_per_step": (fetch - 2 * params * 2) // steps,
                  "egress_x_model_bf16": round((fetch - 2 * params * 2) / steps / (params * 2), 3)}))
PY
done

start_metered_shards "$work/bench" "$SHARDS"
"$bin/zps-bench" collectives --endpoint "127.0.0.1:${port[0]}" --token-file "$work/token" \
  --world "$WORLD" --bytes "$((params * 4))" --iters 10
stop_job_shards "$SHARDS" || true
