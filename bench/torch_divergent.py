#!/usr/bin/env python3
"""Ranks that agree against ranks that diverge, under torchrun: a mixture-of-experts model whose
routing is the same on every rank ("agree": the same two experts, a new pair every step) or
differs per rank ("diverge": each rank sends its tokens to a pair of its own: the same work),
trained through zps.torch in one mode, in the order agree, diverge, diverge, agree (each a job of
its own). Prints one JSON line (rank 0): per variant, the mean over its two jobs of the median step
time (rank 0) and of the shard bytes per step (every rank's pushes and fetches, summed over the
ranks), and diverge's step time over agree's.

    /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 4 \\
        bench/torch_divergent.py --reduction pre-reduced --fetch-strategy bandwidth-centric
(scripts/bench-collectives.sh runs it with PART=moe.)
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import zps.torch as zt  # noqa: E402


class MoE(nn.Module):
    def __init__(self, d, hidden, experts):
        super().__init__()
        self.embed = nn.Linear(d, d)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, d))
            for _ in range(experts))
        self.head = nn.Linear(d, d)

    def forward(self, x, route):
        h = torch.tanh(self.embed(x))
        out = torch.zeros_like(h)
        for e in sorted(set(route)):
            idx = [i for i, r in enumerate(route) if r == e]
            out[idx] = self.experts[e](h[idx])
        return self.head(h + out)


def run(args, rank, world, diverge):
    torch.manual_seed(0)
    model = MoE(args.d_model, args.hidden, args.experts)
    config = {"train_micro_batch_size_per_gpu": args.tokens,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "zps": {"shards": args.shards, "ucx_tls": "tcp", "reduction": args.reduction,
                      "fetch_strategy": args.fetch_strategy}}
    engine = zt.initialize(model, config)
    times = []
    g = torch.Generator().manual_seed(rank)
    bytes0 = None
    for step in range(args.steps):
        if step == args.warmup:
            s = engine.stats()
            bytes0 = s["fetched_bytes"] + s["pushed_bytes"]
        t0 = time.perf_counter()
        x = torch.randn(args.tokens, args.d_model, generator=g)
        # Top-2 of the experts per step: the same pair on every rank, or a pair per rank.
        base = step + (rank * 2 if diverge else 0)
        route = [(base + i % 2) % args.experts for i in range(args.tokens)]
        loss = engine(x, route).pow(2).mean()
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t0)
    s = engine.stats()
    moved = torch.tensor([float(s["fetched_bytes"] + s["pushed_bytes"] - bytes0)])
    dist.all_reduce(moved)
    engine.close()
    measured = args.steps - args.warmup
    return {"step_s": statistics.median(times[args.warmup:]),
            "shard_bytes_per_step": moved.item() / measured}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reduction", default="pre-reduced")
    ap.add_argument("--fetch-strategy", default="bandwidth-centric")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--shards", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    # agree, diverge, diverge, agree: a load that drifts during the run weighs on both alike.
    runs = {False: [], True: []}
    for diverge in (False, True, True, False):
        runs[diverge].append(run(args, rank, world, diverge))

    def mean(rs):
        return {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]}

    agree, diverge = mean(runs[False]), mean(runs[True])
    if rank == 0:
        print(json.dumps({"bench": "torch_divergent", "world": world,
                          "reduction": args.reduction, "fetch_strategy": args.fetch_strategy,
                          "agree": agree, "diverge": diverge,
                          "step_ratio": diverge["step_s"] / agree["step_s"]}), flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
