"""The job that the torchrun rank scripts (torchrun_restart_script.py, reshard_world_script.py)
train, one rank per process, on servers already running (ZPS_ENDPOINT, ZPS_TOKEN_FILE): a small
MLP with fixed initial values, the config they share, batches that depend only on the step and
the contributor index, and rank 0's report of every shard's chunk CRCs. And, for the rank
scripts that start an embedded cluster per run (divergent_script.py,
quantized_gather_script.py), the gloo process group they share and an engine closed only once
every rank is done with it. Not a test itself.

Import it after torch, as zps.torch asks; the scripts set torch's thread count first.
"""

import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import zps.torch as zt


def mlp():
    """The model, with the same initial values in every rank (uploaded by rank 0 of a new job
    only)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 4))


def config(shards, zps=None, **top):
    """AdamW at lr 1e-2 with gradient clipping, on `shards` shards of 2048-element chunks over
    UCX tcp; `zps` adds keys to the "zps" section and `top` adds top-level keys."""
    return {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
            "gradient_clipping": 0.5,
            "zps": {"shards": shards, "chunk_elems": 2048, "op_timeout_s": 60,
                    "connect_timeout_s": 30, "ucx_tls": "tcp", **(zps or {})},
            **top}


def batch(step, index):
    """The (input, target) of contributor `index` in `step`: the same in every run, whichever
    rank and attempt computes it."""
    g = torch.Generator().manual_seed(1000 * step + index)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def emit(obj):
    """One JSON line in one write: the ranks share torchrun's stdout, and a line written in two
    parts (text, then newline) can have another rank's line land between them."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def shard_crcs(engine, shards, step):
    """Every shard's [chunk, crc32c] pairs after `step`, sorted."""
    crcs = []
    for s in range(shards):
        # A shard publishes the last step's update just after the decision that step()
        # returned: UNAVAILABLE until it has (as zps-train --print-crcs retries).
        deadline = time.monotonic() + 60
        while True:
            try:
                crcs += engine.client.chunk_crcs(s, step)
                break
            except zt.ZpsError as e:
                if e.code != "UNAVAILABLE" or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
    return sorted(crcs)


def join_gloo():
    """Joins the gloo process group of torchrun's ranks; returns (rank, world size)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    return rank, world


@contextlib.contextmanager
def embedded_engine(model, cfg):
    """zt.initialize(model, cfg) for the with-block. Rank 0 stops the embedded cluster at close,
    so every rank waits at a barrier first, whether its block raised or not; an exception the
    block raised is raised again after close."""
    engine = zt.initialize(model, cfg)
    error = None
    try:
        yield engine
    except Exception as e:  # reported after every rank is done with the cluster
        error = e
    dist.barrier()
    engine.close()
    if error is not None:
        raise error
