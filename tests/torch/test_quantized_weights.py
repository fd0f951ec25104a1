"""Quantized weights through zps.torch: DeepSpeed's zero_optimization.zero_quantized_weights makes
the shards serve an int8 block-quantized copy (one fp32 scale per 256 elements), which the worker
dequantizes into fp32 before the forward and backward read it. A job with it trains about as the
one that fetches the fp32 master does, repeats bit for bit, and its fetches carry under 0.35x of
the fp32 job's bytes."""

import pytest
import torch

import zps.torch as zt
from zps.torch import config as zconfig
import quantized_job

torch.set_num_threads(2)


def test_zero_quantized_weights_means_int8_blocks():
    on = {"zero_optimization": {"stage": 3, "zero_quantized_weights": True}}
    assert zconfig.load(on).serving() == "int8-block"
    assert zconfig.load({"zero_optimization": {"stage": 3}}).serving() == "bf16"
    with pytest.raises(zt.ZpsError, match=r"zps\.serving_dtype.*zero_quantized_weights"):
        zconfig.load({**on, "zps": {"serving_dtype": "bf16"}})


def _run(steps, quantized):
    if quantized:
        cfg = quantized_job.config()
        cfg["zero_optimization"] = {"stage": 3, "zero_quantized_weights": True}
    else:
        cfg = quantized_job.config(serving_dtype="fp32")
    job, losses, state, fetched = quantized_job.run(cfg, steps)
    assert job["shard"]["serving_dtype"] == ("int8-block" if quantized else "fp32")
    return losses, state, fetched


def test_int8_weights_train_like_fp32_and_repeat_bit_for_bit():
    plain_losses, plain, plain_bytes = _run(8, quantized=False)
    q_losses, q, q_bytes = _run(8, quantized=True)
    q2_losses, q2, _ = _run(8, quantized=True)
    assert q_losses == q2_losses
    for k in q:
        assert torch.equal(q[k], q2[k]), k
    assert q_losses[-1] < q_losses[0]  # it trained
    # The forward reads int8-rounded weights: close to the fp32 run, not equal.
    for a, b in zip(plain_losses, q_losses):
        assert abs(a - b) <= 0.02 * a, (plain_losses, q_losses)
    assert q_losses != plain_losses  # it did quantize
    # 1 + 4/256 bytes an element against 4, plus the covering blocks around small pieces (the
    # biases: 96 and 64 elements in 256-element blocks). Measured: 0.28.
    assert q_bytes <= 0.35 * plain_bytes, (q_bytes, plain_bytes)
