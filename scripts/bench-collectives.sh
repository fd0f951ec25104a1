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
BUILD_DIR=${BUILD_DIR:-build}
WORLD=${WORLD:-4}
if [[ ${PART:-} == moe ]]; then
  echo "# zps.torch divergent MoE: $WORLD ranks on $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  for combo in "server-sum direct" "pre-reduced direct" "server-sum bandwidth-centric" "pre-reduced bandwidth-centric"; do
    read -r red fs <<< "$combo"
    port=$(PYTHONPATH=python python3 -m zps.ports)
    PYTHONPATH=python ZPS_BUILD_DIR=$BUILD_DIR ZPS_LOG_LEVEL=warning /usr/bin/python3 \
      -m torch.distributed.run --nnodes=1 --rdzv_backend=c10d --rdzv_endpoint="127.0.0.1:$port" \
      --nproc_per_node="$WORLD" --redirects 2 --tee 2 bench/torch_divergent.py \
      --reduction "$red" --fetch-strategy "$fs" "$@" 2>/dev/null | grep -o '{"bench".*'
  done
  exit 0
fi
SHARDS=${SHARDS:-2}
STEPS=${STEPS:-20}
bin=$BUILD_DIR/bin
[[ -x $bin/zps-train && -x $bin/zps-bench ]] || { echo "build first: scripts/build.sh" >&2; exit 1; }
model=(--steps "$STEPS" --world-size "$WORLD" --shards "$SHARDS" --log-every 100000 --ucx-tls tcp "$@")
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
echo "bench-collectives-token" > "$work/token"
# A free port below the ephemeral range (python/zps/ports.py: why not port 0).
zps_python=$(cd "$(dirname "${BASH_SOURCE[0]}")/../python" && pwd)
free_port() { PYTHONPATH="$zps_python" python3 -m zps.ports; }
metric() { curl -sf "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n {printf "%.0f\n", $2}'; }

cport=() mport=() spids=()
start_shards() {
  spids=()
  for ((i = 0; i < SHARDS; i++)); do cport[$i]=$(free_port); mport[$i]=$(free_port); done
  for ((i = 0; i < SHARDS; i++)); do
    local args=(--ordinal "$i" --shards "$SHARDS" --port "${cport[$i]}" --bind 127.0.0.1
                --token-file "$work/token" --metrics-port "${mport[$i]}" --ucx-tls tcp
                --log-level warning)
    [[ $i -ne 0 ]] && args+=(--coordinator "127.0.0.1:${cport[0]}")
    "$bin/zps-server" "${args[@]}" > "$work/shard$i.log" 2>&1 &
    spids+=($!); pids+=($!)
  done
}
stop_shards() { for p in "${spids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }

echo "# zps-train collectives: $WORLD ranks x $SHARDS shards on $(nproc) cores ($(uname -m)), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# options: ${model[*]}"
params=""
for combo in "server-sum direct" "pre-reduced direct" "server-sum bandwidth-centric" "pre-reduced bandwidth-centric"; do
  read -r red fs <<< "$combo"
  start_shards
  w=()
  for ((r = 0; r < WORLD; r++)); do
    "$bin/zps-train" --mode worker --endpoint "127.0.0.1:${cport[0]}" --token-file "$work/token" \
      --rank "$r" --reduction "$red" --fetch-strategy "$fs" "${model[@]}" > "$work/rank$r.out" 2>&1 &
    w+=($!); pids+=($!)
  done
  for p in "${w[@]}"; do wait "$p" || { cat "$work"/rank*.out; exit 1; }; done
  push=0 fetch=0
  for ((i = 0; i < SHARDS; i++)); do
    push=$((push + $(metric "${mport[$i]}" zps_push_bytes_total)))
    fetch=$((fetch + $(metric "${mport[$i]}" zps_fetch_bytes_total)))
  done
  stop_shards
  params=$(awk '/^rank 0: [0-9]+ parameters/ {print $3}' "$work/rank0.out")
  step_s=$(sed -nE 's/^summary: .* ([0-9.]+)s\/step.*/\1/p' "$work/rank0.out")
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

start_shards
"$bin/zps-bench" collectives --endpoint "127.0.0.1:${cport[0]}" --token-file "$work/token" \
  --world "$WORLD" --bytes "$((params * 4))" --iters 10
stop_shards
