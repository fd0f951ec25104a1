"""One rank of a zps.torch job under torchrun, for test_reshard_world.py (not a test itself).

Trains a small MLP on servers already running (ZPS_ENDPOINT, ZPS_TOKEN_FILE) up to --steps, with
--accumulation micro-batches per rank and step. The batch of a micro-batch depends only on the
step and its contributor index, rank * accumulation + micro (the index the shards sum the
contributions in, docs/pytorch.md), so 4 ranks of 1 micro-batch and 2 ranks of 2 feed a step the
same 4 batches in the same order. At the end rank 0 prints one JSON line: {"result": ...,
"crcs": [[chunk, crc32c], ...]} with the chunk CRCs of every shard.
"""

import argparse
import json
import os
import sys
import time

import torch

torch.set_num_threads(1)

import zps.torch as zt  # noqa: E402  (after torch, as zps.torch asks)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--accumulation", type=int, default=1)
    ap.add_argument("--shards", type=int, default=2)
    args = ap.parse_args()
    rank = int(os.environ["RANK"])

    torch.manual_seed(0)  # the initial values (uploaded by rank 0 of a new job only)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 4))
    config = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "scheduler": {"type": "WarmupCosineLR",
                            "params": {"total_num_steps": 12, "warmup_num_steps": 4}},
              "gradient_clipping": 0.5,
              "gradient_accumulation_steps": args.accumulation,
              "zps": {"shards": args.shards, "chunk_elems": 2048, "op_timeout_s": 60,
                      "connect_timeout_s": 30, "ucx_tls": "tcp"}}
    engine = zt.initialize(model, config)
    start = engine.global_step
    print(f"zps.torch rank {rank}: joined the job at step {start}", file=sys.stderr, flush=True)
    for step in range(start, args.steps):
        for micro in range(args.accumulation):
            g = torch.Generator().manual_seed(1000 * step + rank * args.accumulation + micro)
            x = torch.randn(8, 16, generator=g)
            y = torch.randn(8, 4, generator=g)
            loss = torch.nn.functional.mse_loss(model(x), y)
            engine.backward(loss)
            engine.step()
    if rank == 0:
        crcs = []
        for s in range(args.shards):
            # A shard publishes the last step's update just after the decision that step()
            # returned: UNAVAILABLE until it has (as zps-train --print-crcs retries).
            deadline = time.monotonic() + 60
            while True:
                try:
                    crcs += engine.client.chunk_crcs(s, args.steps)
                    break
                except zt.ZpsError as e:
                    if e.code != "UNAVAILABLE" or time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
        print(json.dumps({"result": {"start": start, "steps": engine.global_step},
                          "crcs": sorted(crcs)}), flush=True)
    engine.close()


if __name__ == "__main__":
    main()
