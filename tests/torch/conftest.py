"""Shared helpers for the zps.torch tests: real embedded clusters of real zps-server processes."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch

torch.set_num_threads(int(os.environ.get("ZPS_TEST_TORCH_THREADS", "1")))

import zps.torch as zt  # noqa: E402  (after torch, as zps.torch asks)
from zps.cluster import server_binary  # noqa: E402


class Mlp(torch.nn.Module):
    """64 -> 192 -> 64 with a gelu: chunks of 8192 elements, each big enough for blockwise int8
    moments."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 192)
        self.b = torch.nn.Linear(192, 64)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)))


def base_config(**zps_keys):
    z = {"shards": 1, "op_timeout_s": 60, "connect_timeout_s": 30}
    z.update(zps_keys)
    return {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zps": z}


@pytest.fixture
def config():
    return base_config()


def train(engine, batches, loss_fn):
    losses = []
    for x, y in batches:
        loss = loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def zps_ckpt(*args):
    """Runs the zps-ckpt beside the zps-server the clusters run with `args` (str() of each);
    returns its stdout. A failure fails the test with its stderr."""
    ckpt = pathlib.Path(server_binary()).with_name("zps-ckpt")
    r = subprocess.run([str(ckpt), *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def checkpoint_stores(engine):
    """The checkpoint stores of the engine's embedded cluster, as zps-ckpt's --data-dir takes
    them."""
    return ",".join(str(d / "checkpoints") for d in engine.cluster.data_dirs())
