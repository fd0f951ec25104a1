#!/usr/bin/env bash
# The tables of docs/scaling.md: zps-plan's predictions for 7B, 70B, 405B and 1T parameters on
# 8-GPU nodes with 100 and 400 Gbit/s links, in three modes. Prints Markdown; every row's
# zps-plan command is the printed options plus COMMON below.
#   scripts/plan-scaling.sh            # BUILD_DIR=build
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
plan=$BUILD_DIR/bin/zps-plan
[[ -x $plan ]] || { echo "build first: scripts/build.sh" >&2; exit 1; }
# The cluster's constants (docs/scaling.md says where each comes from).
COMMON=(--gpus-per-node 8 --link-efficiency 0.9 --nvme-gbytes-s 12 --shard-ram 1.5TB
        --optimizer-rate 5e9 --tokens-per-gpu 16384 --gpu-tflops 200)
echo "Common options: ${COMMON[*]}"
echo
python3 - "$plan" "${COMMON[@]}" <<'PY'
import json, subprocess, sys
plan, common = sys.argv[1], sys.argv[2:]
models = [("7B", "--params 7e9 --nodes 1"), ("7B", "--params 7e9 --nodes 4"),
          ("70B", "--params 70e9 --nodes 8"), ("405B", "--params 405e9 --nodes 32"),
          ("1T", "--params 1e12 --nodes 32"), ("1T", "--params 1e12 --nodes 1")]
modes = [("A", "--fetch bf16 --grad fp32"),
         ("B", "--fetch bf16 --grad bf16 --reduction pre-reduced --fetch-strategy bandwidth-centric"),
         ("C", "--fetch int8 --grad int4 --reduction pre-reduced --fetch-strategy bandwidth-centric")]

def size(x):
    return "0" if x == 0 else (f"{x / 1e12:.2f} TB" if x >= 1e12 else f"{x / 1e9:.0f} GB")

print("| model | options | Gbit/s | mode | shard RAM | shard NVMe | node link / step "
      "| network s | compute s | optimizer / NVMe s | step s: lower / expected / upper |")
print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for name, m in models:
    for link in ("100", "400"):
        if "--nodes 1 " in m + " " and link == "400":
            continue  # one node: nothing crosses its link
        for mode, opts in modes:
            args = [plan] + m.split() + common + ["--link-gbps", link] + opts.split() + ["--json"]
            out = subprocess.run(args, capture_output=True, text=True, check=True)
            d = json.loads(out.stdout)
            busiest = max(d["worker_host_out"], d["worker_host_in"])
            print(f"| {name} | `{m}` | {link} | {mode} | {size(d['shard_ram_bytes'])} | "
                  f"{size(d['shard_nvme_bytes'])} | {size(busiest)} | {d['t_network']:.1f} | "
                  f"{d['t_compute']:.1f} | {max(d['t_optimizer'], d['t_nvme']):.1f} | "
                  f"{d['t_lower']:.1f} / {d['t_expected']:.1f} / {d['t_upper']:.1f} |")
print()
for mode, opts in modes:
    print(f"Mode {mode}: `{opts}`")
PY
