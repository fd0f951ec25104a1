"""Shared helpers for the zps.torch tests: real embedded clusters of real zps-server processes."""

import os
import sys

import pytest
import torch

torch.set_num_threads(int(os.environ.get("ZPS_TEST_TORCH_THREADS", "1")))

import zps.torch as zt  # noqa: E402  (after torch, as zps.torch asks)


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
