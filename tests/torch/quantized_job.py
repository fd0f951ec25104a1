"""The job that test_quantized_grads.py and test_quantized_weights.py train through zps.torch on
a real embedded cluster: a small MLP with fixed initial values, batches from a fixed teacher
(so that the loss falls over the steps), and a run that returns what those tests compare. Not a
test itself; import it after conftest (which sets torch's thread count first)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

import zps.torch as zt
from conftest import base_config, train


class Net(nn.Module):
    # On 2 shards of 4096-element chunks: parameters split across chunks and shards, pieces
    # shorter than a 256-element gradient block and longer, pieces that start inside a
    # 256-element weight block and pieces shorter than one.
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 96)
        self.b = nn.Linear(96, 64)

    def forward(self, x):
        return self.b(F.gelu(self.a(x)))


def config(**zps_keys):
    """base_config on 2 shards of 4096-element chunks with AdamW at lr 3e-3; `zps_keys` add to
    (or replace) the "zps" section's."""
    cfg = base_config(shards=2, chunk_elems=4096, **zps_keys)
    cfg["optimizer"]["params"]["lr"] = 3e-3
    return cfg


def batches(n):
    """`n` (input, target) batches of a fixed teacher: the same in every run."""
    g = torch.Generator().manual_seed(5)
    teacher = torch.randn(64, 64, generator=g) / 8
    out = []
    for _ in range(n):
        x = torch.randn(16, 64, generator=g)
        out.append((x, torch.tanh(x @ teacher)))
    return out


def run(cfg, n_batches):
    """Trains a fresh Net (the same initial values every time) on the first `n_batches` batches
    under `cfg`. Returns (job, losses, state, fetched): the job the cluster runs (engine.job),
    every batch's loss, a copy of the final state_dict, and the bytes fetch replies carried."""
    torch.manual_seed(0)
    model = Net()
    with zt.initialize(model, cfg) as engine:
        losses = train(engine, batches(n_batches), F.mse_loss)
        fetched = engine.client.stats().fetched_bytes
        state = {k: v.clone() for k, v in engine.state_dict().items()}
        job = engine.job
    return job, losses, state, fetched
