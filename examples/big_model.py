#!/usr/bin/env python3
"""A model larger than the worker may hold: built inside zt.init (no parameter values in memory),
trained for a few steps through zps, with the worker's resident parameter bytes and peak RSS
printed at each step. The default is 64 residual blocks x + tanh(Linear(4096, 4096)(x)): 1.07 G
parameters, 4.0 GiB of fp32 weights. The embedded shards spill their state beyond --memory-budget
(and their serving copies beyond --serving-budget) to disk; each step also prints the bytes they
read and wrote on it, and the end the state bytes per parameter from their gauges.

    PYTHONPATH=python /usr/bin/python3 examples/big_model.py            # scripts/bench-memory.sh
"""

import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import zps.torch as zt  # noqa: E402


class Block(nn.Module):
    """A residual block: x + tanh(fc(x)), so the signal and the gradients reach every layer."""

    def __init__(self, hidden):
        super().__init__()
        self.fc = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def proc_io(pid="self"):
    """(read_bytes, write_bytes) that process `pid` made the block device do so far. The spill
    files are O_DIRECT, so for a shard this is its spill traffic itself, with no page cache in
    between (plus a few log lines)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            kv = dict(line.split(": ") for line in f.read().splitlines())
        return int(kv["read_bytes"]), int(kv["write_bytes"])
    except (OSError, KeyError, ValueError):
        return 0, 0


def shard_pids(engine):
    """The embedded shards' process ids (none when the cluster is an external one)."""
    return [p.pid for p in engine.cluster.procs] if engine.cluster is not None else []


def shard_peak_rss_bytes(pids):
    """The shards' peak RSS (VmHWM), summed."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += sum(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
        except OSError:
            pass
    return total


def io_now(pids):
    """Bytes read and written so far by the shards together, and by this process."""
    shards = [proc_io(p) for p in pids]
    return {"shard_read": sum(r for r, _ in shards), "shard_write": sum(w for _, w in shards),
            "worker_read": proc_io()[0], "worker_write": proc_io()[1]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--memory-budget", type=int, default=3 << 30, help="per shard, bytes")
    ap.add_argument("--serving-budget", type=int, default=0,
                    help="per shard, bytes of serving copies in RAM (0: all in RAM)")
    ap.add_argument("--serving-copies", default="stored", choices=["stored", "on-fetch"],
                    help="on-fetch: the shards keep no serving copies and convert the master for "
                    "each fetch, reading it back from NVMe if it spilled (zps.serving_copies; needs "
                    "--serving-budget 0)")
    ap.add_argument("--max-live-bytes", type=int, default=256 << 20)
    ap.add_argument("--prefetch-bytes", type=int, default=128 << 20)
    ap.add_argument("--data-dir", default="", help="shards' data dir (default: a temp dir)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--state-dtype", default="fp32", choices=["fp32", "bf16", "int8"],
                    help="how the shards store the optimizer's moments (zps.state_dtype)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-5}},
           "gradient_clipping": 1.0,
           "zps": {"shards": args.shards, "serving_dtype": "bf16",
                   "memory_budget": args.memory_budget, "serving_budget": args.serving_budget,
                   "serving_copies": args.serving_copies,
                   "max_live_bytes": args.max_live_bytes,
                   "prefetch_bytes": args.prefetch_bytes, "data_dir": args.data_dir,
                   "state_dtype": args.state_dtype, "op_timeout_s": 1800,
                   # A shard loads the job (zeroed gradient slots, preallocated spill files)
                   # before it answers; for a few GB on a busy machine that can take minutes.
                   "connect_timeout_s": 900}}
    t0 = time.monotonic()
    torch.manual_seed(0)
    with zt.init(cfg):
        model = nn.Sequential(*[Block(args.hidden) for _ in range(args.layers)])
    params = sum(p.numel() for p in model.parameters())
    print(f"built {params / 1e9:.2f} G parameters ({params * 4 / 2**30:.2f} GiB fp32) in "
          f"{time.monotonic() - t0:.1f} s; RSS {rss_bytes() / 2**20:.0f} MiB", flush=True)
    t1 = time.monotonic()
    engine = zt.initialize(model, cfg)
    print(f"initialized (uploaded) in {time.monotonic() - t1:.1f} s; RSS "
          f"{rss_bytes() / 2**20:.0f} MiB, peak {peak_rss_bytes() / 2**20:.0f} MiB", flush=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.hidden, generator=g)
    y = torch.randn(args.batch, args.hidden, generator=g)
    largest = max(p.numel() * 4 for p in model.parameters())
    peak = [0]

    def sample(*_):  # the resident parameter bytes, sampled after every block's forward
        peak[0] = max(peak[0], engine.resident_param_bytes())

    for m in model:
        m.register_forward_hook(sample)
    rows = []
    pids = shard_pids(engine)
    for step in range(args.steps):
        ts = time.monotonic()
        io0 = io_now(pids)
        peak[0] = 0
        loss = F.mse_loss(engine(x), y)
        engine.backward(loss)
        sample()
        info = engine.step()
        st = engine.stats()
        row = {"step": step, "loss": loss.item(), "grad_norm": info["grad_norm"],
               "seconds": time.monotonic() - ts,
               "resident_param_bytes": peak[0],
               "param_peak_live_bytes": st["param_peak_live_bytes"],
               "rss_bytes": rss_bytes(), "peak_rss_bytes": peak_rss_bytes()}
        # The disk traffic from this step's start to its commit: the fetches of its parameters
        # and, before them, the shards' optimizer pass of the previous step (step 0 has none).
        io1 = io_now(pids)
        row.update({k + "_bytes": io1[k] - io0[k] for k in io1})
        rows.append(row)
        print(f"step {step}: loss {row['loss']:.5f}, {row['seconds']:.1f} s, resident parameter "
              f"bytes {row['resident_param_bytes'] / 2**20:.0f} MiB (peak live "
              f"{row['param_peak_live_bytes'] / 2**20:.0f} MiB, cap max_live_bytes "
              f"{args.max_live_bytes / 2**20:.0f} + largest module {largest / 2**20:.0f} MiB), "
              f"RSS {row['rss_bytes'] / 2**20:.0f} MiB, peak RSS "
              f"{row['peak_rss_bytes'] / 2**20:.0f} MiB; shards read "
              f"{row['shard_read_bytes'] / 1e9:.2f} GB, wrote "
              f"{row['shard_write_bytes'] / 1e9:.2f} GB", flush=True)
    # The shards' zps_shard_state_bytes gauges, from their status documents, summed as
    # zps-train's last line sums them (docs/state-bytes.md).
    kinds = ("master", "m", "v", "scales", "serving", "grad")
    state = dict.fromkeys(kinds, 0)
    for i in range(args.shards):
        b = engine.client.shard_status(i).get("state_bytes", {})
        for k in kinds:
            state[k] += int(b.get(k, 0))
    per = {k: v / params for k, v in state.items()}
    print(f"state bytes per parameter: "
          f"{per['master'] + per['m'] + per['v'] + per['scales'] + per['serving']:.2f} "
          f"(master {per['master']:.2f}, moments {per['m'] + per['v']:.2f}, scales "
          f"{per['scales']:.2f}, serving {per['serving']:.2f}); gradient slots {per['grad']:.2f}",
          flush=True)
    shard_peak = shard_peak_rss_bytes(pids)
    engine.close()
    print(json.dumps({"result": "big_model", "params": params, "fp32_bytes": params * 4,
                      "state_dtype": args.state_dtype, "memory_budget": args.memory_budget,
                      "serving_budget": args.serving_budget, "shards": args.shards,
                      "serving_copies": args.serving_copies,
                      "peak_rss_bytes": peak_rss_bytes(), "shard_peak_rss_bytes": shard_peak,
                      "max_live_bytes": args.max_live_bytes, "state_bytes": state,
                      "largest_module_bytes": largest, "steps": rows}), flush=True)


if __name__ == "__main__":
    main()
