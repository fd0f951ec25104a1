"""The C API's CUDA entry points (zps_fetch_to_device, zps_push_grad_device) on a stand-in CUDA
runtime (tests/fakes/fake_cudart.cc, through ZPS_CUDART: "device" memory is host memory, copies
run at once), against a real embedded cluster: what a machine without a GPU can check of the
path zps.torch takes for CUDA tensors — the backend created from options.cuda_device, fetches
into its staging slots and copies out with the served bits, pushes from "device" memory in
every gradient dtype, and pre-reduced pushes at 2 ranks (Gloo on the host: no NCCL on a fake
runtime) agreeing with server-sum. CUDA itself (streams, events, asynchrony) is not exercised:
that needs a GPU (test_cuda.py, label gpu). ctest: torch.cuda_fake_runtime.
"""

import json
import math
import os
import threading

import pytest
import torch

from zps import _native
from zps.cluster import LocalCluster

pytestmark = pytest.mark.skipif(not os.environ.get("ZPS_CUDART"),
                                reason="needs ZPS_CUDART naming the stand-in runtime")

SIZES = [300, 70000]   # the second spans several 64 KiB slots


def _job(world, reduction):
    return {"params": [{"name": f"p{i}", "shape": [n]} for i, n in enumerate(SIZES)],
            "chunk_elems": 1 << 16, "num_shards": 2,
            "optimizer": {"type": "sgd", "lr": 0.1},
            "commit": {"grad_divisor": float(world)},
            "shard": {"reduction": reduction, "world_size": world, "grad_dtype": "fp32",
                      "serving_dtype": "bf16"}}


def _options(cluster, rank, reduction, collectives="auto"):
    return {"endpoint": cluster.endpoint, "token": cluster.token, "rank": rank,
            "op_timeout_ms": 60000, "connect_timeout_ms": 30000, "reduction": reduction,
            "cuda_device": 0, "cuda_slot_bytes": 65536, "cuda_slots": 64,
            "collectives": collectives}


def _values(i, n):
    return (torch.arange(n, dtype=torch.float32) * 7 + i).remainder(64) * 0.25  # exact in bf16


def test_fetch_to_device_gives_the_served_bits_and_pushes_from_device_memory():
    with LocalCluster(shards=2) as cluster:
        c = _native.Client(json.dumps(_options(cluster, 0, "server-sum")),
                           json.dumps(_job(1, "server-sum")))
        try:
            for i, n in enumerate(SIZES):
                v = _values(i, n)
                c.push_initial(i, v.data_ptr(), n)
            c.flush()
            c.begin_step(0)
            dev = [torch.empty(n, dtype=torch.bfloat16) for n in SIZES]  # "device" memory
            c.fetch_to_device([0, 1], [d.data_ptr() for d in dev], 0)
            for i, n in enumerate(SIZES):
                assert torch.equal(dev[i].float(), _values(i, n)), i
            # p0: an fp32 gradient; p1: a bf16 one (converted for the fp32 grad dtype).
            g0 = torch.full((SIZES[0],), 0.5)
            g1 = torch.full((SIZES[1],), 0.25, dtype=torch.bfloat16)
            c.push_grad_device(0, 0, g0.data_ptr(), _native.F32, SIZES[0], 0, 0)
            c.push_grad_device(1, 0, g1.data_ptr(), _native.BF16, SIZES[1], 0, 0)
            c.flush()
            commit = c.await_commit(0)
            want = math.sqrt(0.25 * SIZES[0] + 0.0625 * SIZES[1])
            assert abs(commit.global_norm - want) < 1e-3 * want, (commit.global_norm, want)
            c.end_step()
            info = c.cuda_info()
            assert info["device"] == 0 and info["collectives"] == "none", info
            assert info["h2d_bytes"] == 2 * sum(SIZES), info
            assert info["d2h_bytes"] == 4 * SIZES[0] + 2 * SIZES[1], info
        finally:
            c.close()


def test_quantized_weights_are_dequantized_into_the_staging_slots():
    # serving_dtype int8-block: the covering blocks land on the host, are dequantized into the
    # pinned slot as fp32, and copied out as fp32 (the job info's serving dtype).
    job = _job(1, "server-sum")
    job["shard"]["serving_dtype"] = "int8-block"
    with LocalCluster(shards=2) as cluster:
        c = _native.Client(json.dumps(_options(cluster, 0, "server-sum")), json.dumps(job))
        try:
            assert c.info().serving_dtype == _native.F32
            for i, n in enumerate(SIZES):
                v = _values(i, n)
                c.push_initial(i, v.data_ptr(), n)
            c.flush()
            c.begin_step(0)
            dev = [torch.empty(n, dtype=torch.float32) for n in SIZES]  # "device" memory
            c.fetch_to_device([0, 1], [d.data_ptr() for d in dev], 0)
            for i, n in enumerate(SIZES):
                # Within half an int8 step of each 256-element block's absmax (15.75 here).
                err = (dev[i] - _values(i, n)).abs().max().item()
                assert err <= 15.75 / 254 + 1e-6, (i, err)
                assert not torch.equal(dev[i], _values(i, n)), i  # it was quantized
            info = c.cuda_info()
            assert info["h2d_bytes"] == 4 * sum(SIZES), info
            c.end_step()
        finally:
            c.close()


def _two_ranks(reduction):
    """Norms of steps 0 and 1 of 2 ranks pushing different gradients from "device" memory."""
    with LocalCluster(shards=2) as cluster:
        out, errors = {}, []

        def rank(r):
            try:
                c = _native.Client(json.dumps(_options(cluster, r, reduction, "gloo")),
                                   json.dumps(_job(2, reduction)))
                try:
                    if r == 0:
                        for i, n in enumerate(SIZES):
                            c.push_initial(i, _values(i, n).data_ptr(), n)
                        c.flush()
                    norms = []
                    dev = [torch.empty(n, dtype=torch.bfloat16) for n in SIZES]
                    for step in range(2):
                        # As a training step: the parameters first (at version >= step), then
                        # the gradients.
                        c.begin_step(step)
                        c.fetch_to_device([0, 1], [d.data_ptr() for d in dev], 0)
                        for i, n in enumerate(SIZES):
                            g = (torch.arange(n, dtype=torch.float32) % 5) * (r + 1) * 0.125
                            c.push_grad_device(i, step, g.data_ptr(), _native.F32, n, 0, 0)
                        c.flush()
                        norms.append(c.await_commit(step).global_norm)
                        c.end_step()
                    out[r] = (norms, c.cuda_info())
                finally:
                    c.close()
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        return out


def test_pre_reduced_device_pushes_agree_with_server_sum():
    summed = _two_ranks("server-sum")
    reduced = _two_ranks("pre-reduced")
    assert reduced[0][1]["collectives"] == "gloo", reduced[0][1]
    for step in range(2):
        a, b = summed[0][0][step], reduced[0][0][step]
        assert abs(a - b) <= 1e-6 * a, (step, a, b)
    # pre-reduced: each rank reads its whole gradient to the host (Gloo reduces there).
    assert reduced[1][1]["d2h_bytes"] == 2 * 4 * sum(SIZES), reduced[1][1]
