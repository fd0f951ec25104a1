#!/usr/bin/env bash
# zps-train on the slow-network testbed (tests/integration/netns/testbed.sh): 2 shards and 4
# workers, each a host in its own network namespace behind one bridge, every host's link limited
# with tc to RATE Mbit/s each way. For each mode in MODES (bf16 / fp32 serving, 16 / 32-bit
# gradients, server-sum / pre-reduced; int8 quantized weights and int8 / int4 quantized
# gradients where zps-train has --quantized-weights / --quantized-grads, else those modes are
# skipped) it prints the step time, the shards' bytes per step (their zps_fetch/push_bytes_total
# counters) and zps-plan's prediction of both, at each rate and with the links unlimited.
#
#   scripts/bench-network.sh        # defaults: RATES="100 1000 10000" STEPS=8 ROUNDS=1 MODES=all
#   RATES=0 MODES="bf16-bf16 int8-bf16 bf16-int4 int8-int4" scripts/bench-network.sh  # unlimited
#   RATES="200 1000" STEPS=6 scripts/bench-network.sh --d-model 256
#   MODES="bf16-bf16 int8-int4" ROUNDS=3 RATES="1000 10000" scripts/bench-network.sh \
#     --d-model 1024 --d-ff 4096
#
# MODES names the modes to run, in the order given (fetch-grads[-pre]): bf16-fp32, bf16-bf16,
# fp32-fp32, bf16-fp32-pre, bf16-bf16-pre, int8-bf16, bf16-int8, bf16-int4, int8-int8,
# int8-int4; "all" is every one zps-train has. ROUNDS repeats the whole set: round by round,
# rate by rate, the modes interleaved (bf16, quantized, bf16, quantized, ... on a shared machine
# each pair meets about the same load), every row with the load average before and after it.
# A rate of 0 runs the modes with the links unlimited only (no calibration pairs, no plan).
#
# Extra arguments go to every zps-train run (after the model below, so they override it: the
# model's size is --d-model / --d-ff / --n-layers / --seq-len / --batch). The link's own figure
# at each rate comes from ucx_perftest (tag_bw, 4 MiB messages, UCX tcp, the transport zps uses
# here) between a worker host and a shard host, in the same run.
#
# Calibration of the prediction (zps-plan --json with the model's --tensors, beside each row):
#   --compute-s      the same mode's step time with the links unlimited, measured right before
#                    the limited run (it holds the forward, backward, optimizer pass and every
#                    other per-step cost on this CPU), so --optimizer-rate is set out of the way;
#   --link-efficiency  ucx_perftest's figure at that rate over the rate (at most 1);
#   --collectives gloo --serial-collectives  zps-train's reduce-scatter: Gloo's, on its training
#                    thread.
# Each worker's link is counted too (its eth0 counters, headers included) beside the plan's.
# Needs root (ip netns, tc); exits 77 where namespaces cannot be made. Prints JSON lines, then a
# Markdown table and, per rate, each mode's step time over the first mode's in the same round.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BUILD_DIR=${BUILD_DIR:-build}
RATES=${RATES:-100 1000 10000}
STEPS=${STEPS:-8}
ROUNDS=${ROUNDS:-1}
MODES=${MODES:-all}
DELAY_MS=${DELAY_MS:-0.1}
WORLD=4
SHARDS=2
bin=$(cd "$BUILD_DIR/bin" && pwd)
for p in zps-train zps-server zps-plan; do
  [[ -x $bin/$p ]] || { echo "build first: scripts/build.sh" >&2; exit 1; }
done
# The main job's model (4 blocks, 4 heads) twice as wide, with few tokens a step. On a shared
# 2-core machine the CPU still sets the step at 1 Gbit/s (docs/benchmarks.md, "Slow network").
# No held-out evaluation: it would fetch the whole model twice outside the steps. A line per
# step (--log-every 1): besides the mean over every step (the summary), each row has the mean
# over the steps after the first, which holds the connections, the first touch of every buffer
# and the recording of the access trace.
model=(--d-model 256 --n-layers 4 --n-heads 4 --d-ff 1024 --seq-len 16 --batch 1
       --eval-windows 0 --steps "$STEPS" --world-size "$WORLD" --shards "$SHARDS"
       --log-every 1 --ucx-tls tcp --op-timeout 600 "$@")
# shellcheck source=tests/integration/lib.sh
source tests/integration/lib.sh
# shellcheck source=tests/integration/netns/testbed.sh
source tests/integration/netns/testbed.sh
work_init bench-network-token
testbed_init
hosts=(s0 s1)
for ((r = 0; r < WORLD; r++)); do hosts+=("w$r"); done
for h in "${hosts[@]}"; do testbed_host "$h"; done
testbed_wait_reachable w0 s0

help=$("$bin/zps-train" --help 2>&1 || true)
has() { grep -q -- "--$1" <<< "$help"; }
# key | name | zps-train options | zps-plan options | what zps-train must have
catalog=(
  "bf16-fp32|bf16 fetch, fp32 grads, server-sum|--serving-dtype bf16 --grad-dtype fp32 --reduction server-sum|--fetch bf16 --grad fp32|"
  "bf16-bf16|bf16 fetch, bf16 grads, server-sum|--serving-dtype bf16 --grad-dtype bf16 --reduction server-sum|--fetch bf16 --grad bf16|"
  "fp32-fp32|fp32 fetch, fp32 grads, server-sum|--serving-dtype fp32 --grad-dtype fp32 --reduction server-sum|--fetch fp32 --grad fp32|"
  "bf16-fp32-pre|bf16 fetch, fp32 grads, pre-reduced|--serving-dtype bf16 --grad-dtype fp32 --reduction pre-reduced|--fetch bf16 --grad fp32 --reduction pre-reduced|"
  "bf16-bf16-pre|bf16 fetch, bf16 grads, pre-reduced|--serving-dtype bf16 --grad-dtype bf16 --reduction pre-reduced|--fetch bf16 --grad bf16 --reduction pre-reduced|"
  "int8-bf16|int8 fetch, bf16 grads, server-sum|--quantized-weights int8 --grad-dtype bf16 --reduction server-sum|--fetch int8 --grad bf16|quantized-weights"
  "bf16-int8|bf16 fetch, int8 grads, server-sum|--serving-dtype bf16 --quantized-grads int8 --reduction server-sum|--fetch bf16 --grad int8|quantized-grads"
  "bf16-int4|bf16 fetch, int4 grads, server-sum|--serving-dtype bf16 --quantized-grads int4 --reduction server-sum|--fetch bf16 --grad int4|quantized-grads"
  "int8-int8|int8 fetch, int8 grads, server-sum|--quantized-weights int8 --quantized-grads int8 --reduction server-sum|--fetch int8 --grad int8|quantized-weights quantized-grads"
  "int8-int4|int8 fetch, int4 grads, server-sum|--quantized-weights int8 --quantized-grads int4 --reduction server-sum|--fetch int8 --grad int4|quantized-weights quantized-grads"
)
keys=()
for entry in "${catalog[@]}"; do keys+=("${entry%%|*}"); done
[[ $MODES == all ]] || read -r -a keys <<< "$MODES"
modes=()
for key in "${keys[@]}"; do
  entry=$(printf '%s\n' "${catalog[@]}" | grep "^$key|") || { echo "unknown mode '$key'" >&2; exit 2; }
  IFS='|' read -r _ name train_opts plan_opts needs <<< "$entry"
  missing=""
  for n in $needs; do has "$n" || missing+=" --$n"; done
  if [[ -n $missing ]]; then
    echo "# skipped: $name (zps-train has no$missing)"
    continue
  fi
  modes+=("$name|$train_opts|$plan_opts")
done
[[ ${#modes[@]} -gt 0 ]] || { echo "no mode to run" >&2; exit 2; }

metric() {  # shard metric
  testbed_exec "s$1" python3 -c '
import sys, urllib.request
text = urllib.request.urlopen(f"http://{sys.argv[1]}:{sys.argv[2]}/metrics", timeout=10).read()
for line in text.decode().splitlines():
    if line.startswith(sys.argv[3] + " "): print(int(float(line.split()[1])))
' "${tb_addr[s$1]}" "$mport" "$2"
}

# ucx_perftest between w0 and s0: prints the payload rate in Mbit/s.
link_figure() {
  local port=$((13300 + run))
  UCX_TLS=tcp ip netns exec "${tb_ns[s0]}" ucx_perftest -p "$port" > "$work/perf-server.log" 2>&1 &
  local sp=$!
  pids+=($!)
  sleep 1
  UCX_TLS=tcp testbed_exec w0 timeout 120 ucx_perftest "${tb_addr[s0]}" -p "$port" -t tag_bw \
    -s 4194304 -n 40 -w 4 > "$work/perf.log" 2>&1 || true
  kill "$sp" 2>/dev/null || true
  wait "$sp" 2>/dev/null || true
  # "Final: iters p50 avg overall bw_avg bw_overall ...": MB/s of 2^20 bytes.
  awk '$1 == "Final:" {printf "%.0f\n", $7 * 1048576 * 8 / 1e6}' "$work/perf.log"
}

# Bytes a host's link has carried (its eth0 counters: payload and every header) one way.
link_bytes() {  # host tx|rx
  testbed_exec "$1" cat "/sys/class/net/eth0/statistics/$2_bytes"
}

run=0
round=0
declare -A unlimited_s=()
# The last value the model's arguments give a zps-train option (later ones override; options
# are taken as two words, "--d-model 512").
model_arg() {
  local v="" i
  for ((i = 0; i < ${#model[@]} - 1; i++)); do
    [[ ${model[i]} == "--$1" ]] && v=${model[i + 1]}
  done
  echo "$v"
}
# Rank 0 evaluates at the start and the end unless --eval-windows is 0, each time one pass over
# the model per --batch rows of held-out windows (HeldOutSet, train/include/zps/train/held_out.h).
evals=0
ew=$(model_arg eval-windows)
if [[ $ew != 0 ]]; then
  [[ -n $ew ]] || ew=$(sed -nE '/--eval-windows=/{n;s/.*default: ([0-9]+)\).*/\1/p}' <<< "$help")
  eb=$(model_arg batch)
  [[ -n $eb ]] || eb=$(sed -nE '/--batch=/{n;s/.*default: ([0-9]+)\).*/\1/p}' <<< "$help")
  evals=$((2 * ((ew + eb - 1) / eb)))
fi
# The model's tensors, for zps-plan --tensors (its quantized bytes are then the layout's pieces',
# exact), as zps-train registers them (Specs, train/src/model.cc; vocab 256, byte-level).
# zps-plan refuses them unless their sum is the parameter count rank 0 prints, so a drift between
# this list and the model shows as a "# zps-plan:" line, and the plan falls back to --params.
chunk_elems=$(model_arg chunk-elems)
[[ -n $chunk_elems ]] ||
  chunk_elems=$(sed -nE '/--chunk-elems=/{n;s/.*default: ([0-9]+)\).*/\1/p}' <<< "$help")
python3 - "$(model_arg d-model)" "$(model_arg d-ff)" "$(model_arg n-layers)" \
  "$(model_arg seq-len)" > "$work/tensors.json" <<'PY'
import json, sys
D, F, L, T = (int(x) for x in sys.argv[1:5])
V = 256
t = [[V, D], [T, D]]
for _ in range(L):
    t += [[D], [D], [D, 3 * D], [3 * D], [D, D], [D], [D], [D], [D, F], [F], [F, D], [D]]
t += [[D], [D], [D, V]]
print(json.dumps(t))
PY
results=$work/results.jsonl
: > "$results"

one_run() {  # rate_mbit(0 = unlimited) link_mbit mode
  local rate=$1 link=$2 name train_opts plan_opts
  IFS='|' read -r name train_opts plan_opts <<< "$3"
  run=$((run + 1))
  # Ports of their own each run: a stopped shard's may not be free yet.
  local cport=$((7100 + run)) dir=$work/run$run
  mport=$((9100 + run))
  mkdir -p "$dir"
  local sp=() i r load0 links0=()
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  for ((r = 0; r < WORLD; r++)); do links0+=("$(link_bytes "w$r" tx) $(link_bytes "w$r" rx)"); done
  for ((i = 0; i < SHARDS; i++)); do
    local args=(--ordinal "$i" --shards "$SHARDS" --port "$cport" --bind "${tb_addr[s$i]}"
                --advertise-host "${tb_addr[s$i]}" --token-file "$work/token"
                --metrics-port "$mport" --ucx-tls tcp --log-level warning)
    [[ $i -ne 0 ]] && args+=(--coordinator "${tb_addr[s0]}:$cport")
    ip netns exec "${tb_ns[s$i]}" "$bin/zps-server" "${args[@]}" > "$dir/shard$i.log" 2>&1 &
    sp+=($!); pids+=($!)
  done
  local w=()
  for ((r = 0; r < WORLD; r++)); do
    # shellcheck disable=SC2086  # train_opts is a list of words
    ip netns exec "${tb_ns[w$r]}" "$bin/zps-train" --mode worker --endpoint "${tb_addr[s0]}:$cport" \
      --token-file "$work/token" --rank "$r" --gloo-hostname "${tb_addr[w$r]}" \
      $train_opts "${model[@]}" > "$dir/rank$r.out" 2> "$dir/rank$r.err" &
    w+=($!); pids+=($!)
  done
  if ! join_pids 1800 "${w[@]}"; then
    dump_logs 15 "$dir"/rank0.err "$dir"/rank1.err "$dir"/shard0.log "$dir"/shard1.log
    echo "# FAILED: $name at rate $rate" >&2
    kill -TERM "${sp[@]}" 2>/dev/null || true
    return 0
  fi
  # Each worker's link, both ways, over the whole run: "tx rx" per rank.
  local links="" tx0 rx0
  for ((r = 0; r < WORLD; r++)); do
    read -r tx0 rx0 <<< "${links0[r]}"
    links+="$(($(link_bytes "w$r" tx) - tx0)) $(($(link_bytes "w$r" rx) - rx0)),"
  done
  local push=0 fetch=0
  for ((i = 0; i < SHARDS; i++)); do
    push=$((push + $(metric "$i" zps_push_bytes_total)))
    fetch=$((fetch + $(metric "$i" zps_fetch_bytes_total)))
  done
  for p in "${sp[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  local params step_s warm_s
  params=$(awk '/^rank 0: [0-9]+ parameters/ {print $3}' "$dir/rank0.out")
  step_s=$(sed -nE 's/^summary: .* ([0-9.]+)s\/step.*/\1/p' "$dir/rank0.out")
  warm_s=$(sed -nE 's/^step +([1-9][0-9]*) .* step ([0-9.]+)s$/\2/p' "$dir/rank0.out" |
    awk '{s += $1; n++} END {if (n) printf "%.3f", s / n; else print 0}')
  local key="$name"
  [[ $rate -eq 0 ]] && unlimited_s[$key]=$step_s
  local compute=${unlimited_s[$key]:-0} plan="{}"
  if [[ $rate -ne 0 ]]; then
    local eff
    eff=$(python3 -c "import sys; print(min(1.0, max(0.01, float(sys.argv[1]) / float(sys.argv[2]))))" \
      "${link:-$rate}" "$rate")
    local plan_args=(--params "$params" --nodes "$WORLD" --gpus-per-node 1 --shards "$SHARDS"
      --separate-shard-hosts --collectives gloo --serial-collectives
      --link-gbps "$(python3 -c "print($rate / 1000)")" --link-efficiency "$eff"
      --compute-s "$compute" --optimizer-rate 1e15)
    # shellcheck disable=SC2086  # plan_opts is a list of words
    if ! plan=$("$bin/zps-plan" "${plan_args[@]}" --tensors "$work/tensors.json" \
                --chunk-elems "$chunk_elems" $plan_opts --json); then
      echo "# zps-plan: the tensors do not make the model; planning from --params alone" >&2
      # shellcheck disable=SC2086
      plan=$("$bin/zps-plan" "${plan_args[@]}" $plan_opts --json)
    fi
  fi
  python3 - "$name" "$rate" "${link:-0}" "$STEPS" "$params" "$push" "$fetch" "$step_s" \
    "$train_opts" "$plan" "$([[ $rate -ne 0 ]] && echo "$compute")" "$evals" "$round" \
    "$load0" "$(cut -d' ' -f1-3 /proc/loadavg)" "$warm_s" "$links" <<'PY' | tee -a "$results"
import json, sys
name, rate, link, steps, params, push, fetch, step_s, opts, plan = sys.argv[1:11]
steps, params, push, fetch = int(steps), int(params), int(push), int(fetch)
evals = int(sys.argv[12])
# Bytes an element of the serving copy: an int8 copy has one fp32 scale per 256 elements
# (kWeightQuantBlock); an evaluation fetches the whole model once in it.
serving = 4 if "--serving-dtype fp32" in opts else 1 + 4 / 256 if "--quantized-weights" in opts else 2
# Less rank 0's initial values (fp32) and its evaluations (direct fetches, serving copy).
ingress = (push - params * 4) / steps
egress = (fetch - evals * params * serving) / steps
plan = json.loads(plan)
row = {"mode": name, "round": int(sys.argv[13]), "rate_mbit": int(rate),
       "link_mbit_ucx_perftest": int(link),
       "calibration_s_per_step": float(sys.argv[11]) if sys.argv[11] else None,
       "params": params, "s_per_step": float(step_s),
       "s_per_step_after_first": float(sys.argv[16]),
       "shard_ingress_bytes_per_step": int(ingress), "shard_egress_bytes_per_step": int(egress),
       "load_before": sys.argv[14], "load_after": sys.argv[15]}
# Every worker's link per step, each way, headers included, from its eth0 counters; rank 0's
# also carries the initial values it pushes (fp32, once).
links = [[int(x) // steps for x in pair.split()] for pair in sys.argv[17].strip(",").split(",")]
row["worker_link_out_per_step"] = [tx for tx, _ in links]
row["worker_link_in_per_step"] = [rx for _, rx in links]
if plan:
    row.update({"plan_t_lower": plan["t_lower"], "plan_t_expected": plan["t_expected"],
                "plan_t_upper": plan["t_upper"], "plan_t_network": plan["t_network"],
                "plan_shard_ingress": int(plan["shard_in"] * 2),
                "plan_shard_egress": int(plan["shard_out"] * 2),
                "plan_worker_out": int(plan["worker_host_out"]),
                "plan_worker_in": int(plan["worker_host_in"])})
print(json.dumps(row))
PY
}

echo "# bench-network: $WORLD workers x $SHARDS shards as namespace hosts; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# zps-train ${model[*]}"
echo "# tc: tbf per host each way; delay ${DELAY_MS} ms where netem exists"
shape_all() { for h in "${hosts[@]}"; do testbed_shape "$h" "$1" "$DELAY_MS"; done; }
unshape_all() { for h in "${hosts[@]}"; do testbed_unshape "$h"; done; }
for ((round = 1; round <= ROUNDS; round++)); do
  for rate in $RATES; do
    if [[ $rate == 0 ]]; then  # the links unlimited alone: the modes' CPU cost side by side
      unshape_all
      echo "# round $round, links unlimited; load $(cut -d' ' -f1-3 /proc/loadavg)"
      for m in "${modes[@]}"; do one_run 0 "" "$m"; done
      continue
    fi
    shape_all "$rate"
    link=$(link_figure)
    echo "# round $round, rate $rate Mbit/s: ucx_perftest w0 -> s0 ${link:-?} Mbit/s; delay applied: $tb_delay_applied; load $(cut -d' ' -f1-3 /proc/loadavg)"
    for m in "${modes[@]}"; do
      # The calibration run (links unlimited) right before the limited one, so that both meet
      # the same load from the machine's other processes.
      unshape_all
      one_run 0 "" "$m"
      shape_all "$rate"
      one_run "$rate" "$link" "$m"
    done
  done
done
echo "# done; load $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print()
print("| round | link (ucx_perftest) | mode | load before / after | s/step unlimited | s/step "
      "| s/step after the first | plan lower .. upper | plan expected | measured / expected "
      "| shard in / step | plan | shard out / step | plan | worker out / step, ranks 1-3 | plan |")
print("|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    if r["rate_mbit"] == 0:
        continue  # the calibration runs: in the next row's "unlimited" column
    link = f'{r["rate_mbit"]} Mbit/s ({r["link_mbit_ucx_perftest"]})'
    lo, mid, hi, t = r["plan_t_lower"], r["plan_t_expected"], r["plan_t_upper"], r["s_per_step"]
    load = f'{r["load_before"].split()[0]} / {r["load_after"].split()[0]}'
    print(f'| {r["round"]} | {link} | {r["mode"]} | {load} | {r["calibration_s_per_step"]:.3f} '
          f'| {t:.3f} | {r["s_per_step_after_first"]:.3f} '
          f'| {lo:.3f} .. {hi:.3f} | {mid:.3f} | {t / mid:.2f} | '
          f'{r["shard_ingress_bytes_per_step"]:,} | {r["plan_shard_ingress"]:,} | '
          f'{r["shard_egress_bytes_per_step"]:,} | {r["plan_shard_egress"]:,} | '
          f'{min(r["worker_link_out_per_step"][1:]):,} .. {max(r["worker_link_out_per_step"][1:]):,} | '
          f'{r["plan_worker_out"]:,} |')
# Each mode against the first mode's run just before it at the same rate (the pair met about
# the same load from the machine's other processes).
print()
ref = {}
for r in rows:
    k = (r["round"], r["rate_mbit"])
    if r["mode"] == rows[0]["mode"]:
        ref[k] = r
    elif k in ref:
        f = ref[k]
        rate = "unlimited" if k[1] == 0 else f"{k[1]} Mbit/s"
        a, b = f["s_per_step_after_first"], r["s_per_step_after_first"]
        print(f'# round {k[0]}, {rate}: {f["mode"]} {f["s_per_step"]:.3f} s / {r["mode"]} '
              f'{r["s_per_step"]:.3f} s = {f["s_per_step"] / r["s_per_step"]:.2f}x; '
              f'after the first step {a:.3f} s / {b:.3f} s = {a / b if b else 0:.2f}x')
PY
