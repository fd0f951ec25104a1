"""zps.torch and the CUDA backend.

Here (no GPU; in CI no driver either) libzps_c.so loads, the backend reports FAILED_PRECONDITION
"no CUDA device", and the C entry points that need it refuse with that code instead of crashing.
On a machine with a CUDA device (ctest label gpu; scripts/gpu-check.sh) CUDA parameters go
through the backend — pinned slots, the copy stream, pushes from device memory — and train to
the same values as the host-staging path (the same bits: both copy the same bf16 bytes and push
the same fp32 gradients), and cuda_backend "on" is honoured; the other cases skip.
"""

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zps.torch as zt
from zps import _native
from zps._errors import ZpsError

from conftest import base_config, train

HAS_CUDA = torch.cuda.is_available() and _native.cuda_available(0) is None


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 4))


def _data(n, d_in, d_out, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, d_in, generator=g), torch.randn(16, d_out, generator=g))
            for _ in range(n)]


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is present")
def test_no_device_is_a_clear_status():
    err = _native.cuda_available(0)
    assert err is not None
    assert err.code == "FAILED_PRECONDITION", err
    assert "no CUDA device" in str(err)


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is present")
def test_cuda_device_option_without_a_device_fails_cleanly(config):
    """options.cuda_device on a machine without a device: zps_connect returns the Status."""
    job = {"params": [{"name": "w", "shape": [4]}]}
    options = {"endpoint": "127.0.0.1:1", "token": "t", "cuda_device": 0,
               "connect_timeout_ms": 1000}
    with pytest.raises(ZpsError) as e:
        _native.Client(json.dumps(options), json.dumps(job))
    assert e.value.code == "FAILED_PRECONDITION"
    assert "no CUDA device" in str(e.value)


def test_cuda_backend_key_is_checked():
    with pytest.raises(ZpsError) as e:
        zt.initialize(_mlp(), base_config(cuda_backend="maybe"))
    assert e.value.code == "INVALID_ARGUMENT"
    with pytest.raises(ZpsError) as e:
        zt.initialize(_mlp(), base_config(collectives="mpi"))
    assert e.value.code == "INVALID_ARGUMENT"


def test_cpu_parameters_never_touch_the_backend(config):
    """cuda_backend "on" with CPU parameters: nothing to do for it, training as ever."""
    model = _mlp()
    with zt.initialize(model, base_config(cuda_backend="on")) as engine:
        losses = train(engine, _data(4, 8, 4) * 3, F.mse_loss)
        assert losses[-1] < losses[0]
        assert engine.client.cuda_info()["device"] == -1


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_backend_carries_cuda_parameters_and_matches_host_staging():
    results = []
    for backend in ("off", "on"):
        model = _mlp().cuda()
        with zt.initialize(model, base_config(cuda_backend=backend)) as engine:
            data = [(x.cuda(), y.cuda()) for x, y in _data(4, 8, 4)]
            losses = train(engine, data * 5, F.mse_loss)
            info = engine.client.cuda_info()
            if backend == "on":
                assert info["device"] == 0 and info["h2d_bytes"] > 0 and info["d2h_bytes"] > 0
            else:
                assert info["device"] == -1
            results.append((losses, engine.state_dict()))
    assert results[0][0] == results[1][0]
    for k in results[0][1]:
        assert torch.equal(results[0][1][k].cpu(), results[1][1][k].cpu()), k


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_fp32_parameters_with_bf16_serving_are_cast_on_the_device():
    model = _mlp().cuda()
    with zt.initialize(model, base_config(cuda_backend="on", serving_dtype="bf16")) as engine:
        data = [(x.cuda(), y.cuda()) for x, y in _data(4, 8, 4)]
        losses = train(engine, data * 10, F.mse_loss)
        assert losses[-1] < losses[0]
        assert all(p.is_cuda and p.dtype == torch.float32 for p in model.parameters())
