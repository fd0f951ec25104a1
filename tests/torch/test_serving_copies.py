"""zps.serving_copies through zps.torch: the embedded shards run with --serving-copies on-fetch
(no 16-bit serving copies kept; each fetch converts the master), train bit for bit as with stored
copies, also with the masters spilled under a memory budget and with speculative updates, and the
configuration it cannot take is named."""


import pytest
import torch
import torch.nn.functional as F

import zps.torch as zt
from zps.torch import config as zconfig
from conftest import Mlp, base_config


def _train(copies, state_dtype, serving_dtype, chunk_elems=8192, memory_budget=0, update="sync"):
    torch.manual_seed(0)
    model = Mlp()
    cfg = base_config(shards=2, chunk_elems=chunk_elems, state_dtype=state_dtype,
                      serving_dtype=serving_dtype, serving_copies=copies,
                      memory_budget=memory_budget, update=update)
    g = torch.Generator().manual_seed(3)
    with zt.initialize(model, cfg) as engine:
        for proc in engine.cluster.procs:
            assert ("--serving-copies=on-fetch" in proc.args) == (copies == "on-fetch")
            assert any(a.startswith("--memory-budget") for a in proc.args) == (memory_budget > 0)
        losses = []
        for _ in range(4):
            x, y = torch.randn(16, 64, generator=g), torch.randn(16, 64, generator=g)
            loss = F.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        return losses, engine.state_dict()


@pytest.mark.parametrize("state_dtype,serving_dtype", [("int8", "bf16"), ("fp32", "fp32")])
def test_on_fetch_trains_as_stored_copies_do(state_dtype, serving_dtype):
    stored_losses, stored = _train("stored", state_dtype, serving_dtype)
    made_losses, made = _train("on-fetch", state_dtype, serving_dtype)
    assert made_losses == stored_losses
    for k, v in stored.items():
        assert torch.equal(v, made[k]), k


def test_on_fetch_from_spilled_masters_trains_as_stored_copies_do():
    # 2048-element chunks (7 on shard 0, 6 on shard 1), int8 state records of 16 KiB: a 96 KiB
    # budget holds shard 0's spill pipeline (5 records) and one resident record, so 6 of its
    # fetches convert a master read back from the spill file; shard 1's 6 records fit, resident
    # in its store.
    stored_losses, stored = _train("stored", "int8", "bf16", chunk_elems=2048)
    made_losses, made = _train("on-fetch", "int8", "bf16", chunk_elems=2048,
                               memory_budget=96 << 10)
    assert made_losses == stored_losses
    for k, v in stored.items():
        assert torch.equal(v, made[k]), k


@pytest.mark.parametrize("memory_budget", [0, 96 << 10])
def test_on_fetch_with_speculative_updates_trains_as_stored_copies_do(memory_budget):
    # Speculation updates spares beside the fetches that convert the live masters. With the 96
    # KiB budget, each shard sets one spare set aside from it (one chunk speculated per step, the
    # others updated at the commit), and every master is spilled.
    stored_losses, stored = _train("stored", "int8", "bf16", chunk_elems=2048)
    made_losses, made = _train("on-fetch", "int8", "bf16", chunk_elems=2048,
                               memory_budget=memory_budget, update="speculative")
    assert made_losses == stored_losses
    for k, v in stored.items():
        assert torch.equal(v, made[k]), k


def test_serving_copies_key_is_checked():
    assert zconfig.load({}).serving_copies == "stored"
    assert zconfig.load({"zps": {"serving_copies": "on-fetch"}}).serving_copies == "on-fetch"
    with pytest.raises(zt.ZpsError, match=r"zps\.serving_copies"):
        zconfig.load({"zps": {"serving_copies": "never"}})
    assert zconfig.load({"zps": {"serving_copies": "on-fetch",
                                 "memory_budget": 1 << 30}}).memory_budget == 1 << 30
    with pytest.raises(zt.ZpsError, match=r"zps\.serving_copies.*zps\.serving_budget"):
        zconfig.load({"zps": {"serving_copies": "on-fetch", "serving_budget": 1 << 30}})
    assert zconfig.load({"zps": {"serving_copies": "on-fetch",
                                 "update": "speculative"}}).update == "speculative"
