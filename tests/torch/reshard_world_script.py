"""One rank of a zps.torch job under torchrun, for test_reshard_world.py (not a test itself).

Trains a small MLP on servers already running (ZPS_ENDPOINT, ZPS_TOKEN_FILE) up to --steps, with
--accumulation micro-batches per rank and step. The batch of a micro-batch depends only on the
step and its contributor index, rank * accumulation + micro (the index the shards sum the
contributions in, docs/pytorch.md), so 4 ranks of 1 micro-batch and 2 ranks of 2 feed a step the
same 4 batches in the same order. At the end rank 0 prints one JSON line: {"result": ...,
"crcs": [[chunk, crc32c], ...]} with the chunk CRCs of every shard. The model, its config and
its batches are torchrun_job.py's, as torchrun_restart_script.py's are.
"""

import argparse
import os
import sys

import torch

torch.set_num_threads(1)

import zps.torch as zt  # noqa: E402  (after torch, as zps.torch asks)
from torchrun_job import batch, config, emit, mlp, shard_crcs  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--accumulation", type=int, default=1)
    ap.add_argument("--shards", type=int, default=2)
    args = ap.parse_args()
    rank = int(os.environ["RANK"])

    model = mlp()
    engine = zt.initialize(model, config(
        args.shards,
        scheduler={"type": "WarmupCosineLR",
                   "params": {"total_num_steps": 12, "warmup_num_steps": 4}},
        gradient_accumulation_steps=args.accumulation))
    start = engine.global_step
    print(f"zps.torch rank {rank}: joined the job at step {start}", file=sys.stderr, flush=True)
    for step in range(start, args.steps):
        for micro in range(args.accumulation):
            x, y = batch(step, rank * args.accumulation + micro)
            loss = torch.nn.functional.mse_loss(model(x), y)
            engine.backward(loss)
            engine.step()
    if rank == 0:
        emit({"result": {"start": start, "steps": engine.global_step},
              "crcs": shard_crcs(engine, args.shards, args.steps)})
    engine.close()


if __name__ == "__main__":
    main()
