"""A torchrun script whose ranks do different things (tests/torch/test_divergent.py): for each
scenario and each mode (reduction x fetch strategy) it trains a tiny model on an embedded cluster
of its own and keeps the final weights; rank 0 prints one JSON line with, per scenario and mode,
the largest difference from server-sum + direct.

Scenarios (rank r of world w, step s):
- moe: a top-1 mixture of experts whose routing differs per rank; no rank uses the last expert on
  even steps.
- one_rank_expert: expert 3 is used by rank 0 only.
- eval: rank 0 alone runs a torch.no_grad() evaluation forward every other step.
- skip: the last rank skips a branch on odd steps.
- shared: a mixture of experts with a shared expert every token goes through.
- forwards: rank r runs r + 1 forward calls per step (one backward of their summed loss).
- all: every one of the above at once (expert 3 is rank 0's only, expert 2 idle on even steps).

--mismatch RANK:BUCKET makes rank RANK skip its reduce-scatter of bucket BUCKET (the test hooks
ZPS_TEST_SKIP_BUCKET, and ZPS_TEST_BUCKET_BYTES for buckets of 512 bytes) in pre-reduced +
direct mode; each rank then prints the error it got (a JSON line) and exits with status 3.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import torchrun_job
from zps._errors import ZpsError

D = 8
EXPERTS = 4
TOKENS = 8
MODES = [("server-sum", "direct"), ("server-sum", "bandwidth-centric"),
         ("pre-reduced", "direct"), ("pre-reduced", "bandwidth-centric")]


class Expert(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.up = nn.Linear(D, hidden)
        self.down = nn.Linear(hidden, D)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class MoE(nn.Module):
    def __init__(self, shared=False):
        super().__init__()
        self.embed = nn.Linear(D, D)
        # Experts of different sizes: a mismatched collective shows in the sizes too.
        self.experts = nn.ModuleList(Expert(4 * (e + 1)) for e in range(EXPERTS))
        self.shared = nn.Linear(D, D) if shared else None
        self.branch = nn.Linear(D, D)
        self.head = nn.Linear(D, 1)

    def forward(self, x, route, use_branch=True):
        h = torch.tanh(self.embed(x))
        out = torch.zeros_like(h)
        # Top-1 routing fixed by the caller (per rank and step), so that which experts run is
        # exactly what the scenario says; experts in a rank-dependent order too.
        for e in sorted(set(route), reverse=bool(int(os.environ.get("RANK", "0")) % 2)):
            idx = [i for i, r in enumerate(route) if r == e]
            out[idx] = self.experts[e](h[idx])
        if self.shared is not None:
            out = out + self.shared(h)
        h = h + out
        if use_branch:
            h = h + torch.relu(self.branch(h))
        return self.head(h).squeeze(-1)


def route_of(scenario, rank, world, step):
    if scenario == "moe":
        n = EXPERTS - 1 if step % 2 == 0 else EXPERTS  # the last expert idle on even steps
        return [(rank + step + i) % n for i in range(TOKENS)]
    if scenario == "one_rank_expert":
        return [3 if rank == 0 and i % 2 == 0 else (rank + i) % 3 for i in range(TOKENS)]
    if scenario == "shared":
        return [(rank * 3 + step) % EXPERTS] * TOKENS
    if scenario == "all":
        n = 2 if step % 2 == 0 else 3
        return [3 if rank == 0 and i == 0 else (rank + step + i) % n for i in range(TOKENS)]
    return [(rank + i) % EXPERTS for i in range(TOKENS)]


def batch(rank, step, k=0):
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + k)
    return torch.randn(TOKENS, D, generator=g), torch.randn(TOKENS, generator=g)


def train(scenario, reduction, fetch, rank, world, steps, mismatch):
    torch.manual_seed(0)
    model = MoE(shared=scenario in ("shared", "all"))
    config = {
        "train_micro_batch_size_per_gpu": TOKENS,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "zps": {"shards": 1, "ucx_tls": "tcp", "reduction": reduction, "fetch_strategy": fetch,
                "serving_dtype": "fp32", "op_timeout_s": 30.0 if mismatch else 120.0},
    }
    with torchrun_job.embedded_engine(model, config) as engine:
        for step in range(steps):
            if scenario in ("eval", "all") and rank == 0 and step % 2 == 1:
                with torch.no_grad():
                    x, _ = batch(rank, step, 99)
                    engine(x, route_of("moe", rank, world, step))
            calls = {"forwards": rank + 1, "all": rank % 2 + 1}.get(scenario, 1)
            loss = 0.0
            for k in range(calls):
                x, y = batch(rank, step, k)
                use_branch = not (scenario in ("skip", "all") and rank == world - 1
                                  and step % 2 == 1)
                pred = engine(x, route_of(scenario, rank, world, step), use_branch)
                loss = loss + ((pred - y) ** 2).mean()
            engine.backward(loss)
            engine.step()
        weights = {k: v.clone() for k, v in engine.state_dict().items()}
        stats = engine.stats()
    return weights, stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", default="moe,one_rank_expert,eval,skip,shared,forwards")
    ap.add_argument("--modes", default="all", help="all, or reduction/fetch,...")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--mismatch", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rank, world = torchrun_job.join_gloo()
    if args.mismatch:
        who, bucket = args.mismatch.split(":")
        os.environ["ZPS_TEST_BUCKET_BYTES"] = "512"  # a few buckets in the tiny model
        if int(who) == rank:
            os.environ["ZPS_TEST_SKIP_BUCKET"] = bucket
        t0 = time.monotonic()
        try:
            train("moe", "pre-reduced", "direct", rank, world, args.steps, True)
            print(f"rank {rank}: no error", flush=True)
            code = 0
        except ZpsError as e:
            print(json.dumps({"rank": rank, "error": str(e), "seconds": time.monotonic() - t0}),
                  flush=True)
            code = 3
        dist.barrier()  # every rank has printed before torchrun stops the group
        sys.exit(code)
    modes = MODES if args.modes == "all" else [tuple(m.split("/")) for m in args.modes.split(",")]
    result = {}
    for scenario in args.scenarios.split(","):
        ref = None
        for reduction, fetch in modes:
            weights, stats = train(scenario, reduction, fetch, rank, world, args.steps, False)
            if ref is None:
                ref = weights
            diff = max((weights[k] - ref[k]).abs().max().item() for k in ref)
            result[f"{scenario} {reduction} {fetch}"] = {
                "max_diff": diff, "trace_rebuilds": stats["trace_rebuilds"]}
    if rank == 0:
        print(json.dumps({"result": "divergent", "world": world, "runs": result}), flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
