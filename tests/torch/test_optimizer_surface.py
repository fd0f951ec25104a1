"""The optimizer surface through zps.torch: frozen parameters, gradient accumulation, fp16 loss
scaling, and the DeepSpeed schedule keys."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zps.torch as zt
from conftest import base_config


def _data(n, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 6, generator=g), torch.randn(16, 2, generator=g)) for _ in range(n)]


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))


def test_frozen_parameters_are_fetched_never_pushed_never_changed():
    model = _net()
    for p in model[0].parameters():
        p.requires_grad_(False)
    with zt.initialize(model, base_config(serving_dtype="fp32")) as engine:
        before = engine.state_dict()
        pushed0 = engine.stats()["pushed_bytes"]
        for x, y in _data(4):
            engine.backward(F.mse_loss(engine(x), y))
            engine.step()
        after = engine.state_dict()
        assert torch.equal(before["0.weight"], after["0.weight"])
        assert not torch.equal(before["2.weight"], after["2.weight"])
        trained_bytes = (16 * 2 + 2) * 4
        assert engine.stats()["pushed_bytes"] - pushed0 == 4 * trained_bytes


def test_gradient_accumulation_equals_one_big_batch():
    data = _data(6)
    big = [(torch.cat([a[0], b[0]]), torch.cat([a[1], b[1]])) for a, b in zip(data[::2], data[1::2])]
    cfg = base_config(serving_dtype="fp32")
    cfg["optimizer"] = {"type": "SGD", "params": {"lr": 0.1}}
    m1 = _net()
    with zt.initialize(m1, dict(cfg, gradient_accumulation_steps=2)) as engine:
        boundaries = []
        for x, y in data:
            engine.backward(F.mse_loss(engine(x), y))
            boundaries.append(engine.step()["boundary"])
        assert boundaries == [False, True] * 3
        assert engine.global_step == 3
        accumulated = engine.state_dict()
    m2 = _net()
    with zt.initialize(m2, cfg) as engine:
        for x, y in big:
            engine.backward(F.mse_loss(engine(x), y))
            engine.step()
        single = engine.state_dict()
    for k in single:
        torch.testing.assert_close(accumulated[k], single[k], rtol=1e-5, atol=1e-6)


def test_fp16_loss_scaling_skips_an_overflowed_step():
    model = _net()
    cfg = base_config()
    cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    with zt.initialize(model, cfg) as engine:
        assert engine.loss_scale == 256
        x, y = _data(1)[0]
        engine.backward(F.mse_loss(engine(x), y) * float("inf"))
        info = engine.step()
        assert info["skipped"] and engine.loss_scale == 128
        engine.backward(F.mse_loss(engine(x), y))
        info = engine.step()
        assert not info["skipped"]


def test_schedule_keys_are_checked():
    with pytest.raises(zt.ZpsError, match="warmup_steps"):
        zt.initialize(_net(), {"scheduler": {"type": "WarmupLR",
                                             "params": {"warmup_steps": 10}}})
    with pytest.raises(zt.ZpsError, match="scheduler.type"):
        zt.initialize(_net(), {"scheduler": {"type": "OneCycle", "params": {}}})
    model = _net()
    cfg = base_config(serving_dtype="fp32")
    cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.0,
                                                       "warmup_num_steps": 5}}
    with zt.initialize(model, cfg) as engine:  # lr 0 throughout: nothing moves
        before = engine.state_dict()
        for x, y in _data(3):
            engine.backward(F.mse_loss(engine(x), y))
            engine.step()
        after = engine.state_dict()
        for k in before:
            assert torch.equal(before[k], after[k])


def test_speculative_update_gives_the_bits_of_sync():
    """zps.update = "speculative": the shards update each chunk as its gradient completes; with
    clipping on and a skipped fp16 step, the fp32 masters end bit-identical to zps.update =
    "sync"."""
    results = {}
    for mode in ("sync", "speculative"):
        cfg = base_config(serving_dtype="fp32", update=mode, shards=2, chunk_elems=64)
        cfg["gradient_clipping"] = 0.5
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
        with zt.initialize(_net(), cfg) as engine:
            skipped = []
            for i, (x, y) in enumerate(_data(8)):
                loss = F.mse_loss(engine(x), y)
                engine.backward(loss * float("inf") if i == 3 else loss)
                skipped.append(engine.step()["skipped"])
            assert skipped == [i == 3 for i in range(8)]
            results[mode] = engine.state_dict()
    for k in results["sync"]:
        assert torch.equal(results["sync"][k], results["speculative"][k]), k


def test_update_mode_is_checked():
    with pytest.raises(zt.ZpsError, match="zps.update"):
        zt.initialize(_net(), base_config(update="async"))
