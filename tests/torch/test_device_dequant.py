"""Quantized weights dequantized on the parameter's device (zps/torch/dequant.py).

For CUDA parameters the int8 block records go to the GPU as fetched and torch ops dequantize
them there. The same functions run here on CPU tensors and must give exactly the bits of the C
library's SIMD codec (zps_dequantize_blocks, what zps_fetch_into uses): over records with short
last blocks, runs that start inside a block, zero and all-zero blocks, subnormal, tiny and huge
scales, the extreme codes, and fp32, bf16 and fp16 outputs. NaN elements (a block with a NaN
scale) must be NaN on both sides; their payload is not a value and may differ. On a machine with
a CUDA device the same comparison runs on the GPU, and a job with CUDA parameters trains to the
bits of the CPU path (skipped here).

Through a real cluster, ZPS_TORCH_HOST_STAGING=1 sends CPU parameters down the device path
(the client keeps the fetched records, zps_acquire_quantized hands them out, torch ops
dequantize them): the job trains to the same bits as with the C library dequantizing.
"""

import ctypes
import struct

import pytest
import torch

from zps import _native
from zps._errors import ZpsError
from zps.torch import dequant
from zps.torch.dequant import dequantize_blocks, dequantize_pieces
import quantized_job

BLOCK = 256
HAS_CUDA = torch.cuda.is_available() and _native.cuda_available(0) is None
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA,
                                                                 reason="no CUDA device"))]
TO_CODE = {torch.float32: _native.F32, torch.bfloat16: _native.BF16, torch.float16: _native.F16}
SCALES = [0.0, 1.0, 1e-3, 3.7e5, 2.0 ** -126 / 3, 2.0 ** -149, 3.4028235e38 / 127,
          3.4028235e38, 65504.0 / 127, 6.1e-5 / 127, -0.5, float("nan"), float("inf")]


def _records(n, seed):
    """The int8 block records of n elements: scales cycling through SCALES (one block of all
    zero codes, the extreme codes in every block), random codes elsewhere."""
    g = torch.Generator().manual_seed(seed)
    out = bytearray()
    for b, start in enumerate(range(0, n, BLOCK)):
        length = min(BLOCK, n - start)
        codes = torch.randint(-128, 128, (length,), generator=g, dtype=torch.int8)
        if b == 2:
            codes.zero_()
        else:
            codes[0], codes[-1] = 127, -128
        scale = SCALES[(b + seed) % len(SCALES)]
        out += struct.pack("<f", scale) + codes.numpy().tobytes()
    return torch.frombuffer(out, dtype=torch.uint8)


def _c_dequant(records, skip, elems, dtype):
    out = torch.empty(elems, dtype=dtype)
    _native.dequantize_blocks(records.data_ptr(), records.numel(), 8, BLOCK, skip, elems,
                              TO_CODE[dtype], out.data_ptr())
    return out


def _assert_same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    nan_a, nan_b = torch.isnan(a.float()), torch.isnan(b.float())
    assert torch.equal(nan_a, nan_b)
    bits = {4: torch.int32, 2: torch.int16}[a.element_size()]
    ia, ib = a.view(bits), b.view(bits)
    differ = (ia != ib) & ~nan_a
    assert not differ.any(), (a[differ][:8], b[differ][:8])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,skip,elems", [(256, 0, 256), (1, 0, 1), (1000, 0, 1000),
                                          (1000, 37, 963), (2 * 256 + 77, 200, 300),
                                          (13 * 256 + 5, 5, 13 * 256), (700, 255, 1)])
def test_torch_ops_give_the_c_codecs_bits(device, dtype, n, skip, elems):
    for seed in range(len(SCALES)):
        records = _records(n, seed)
        want = _c_dequant(records, skip, elems, dtype)
        out = torch.full((elems,), 7.0, dtype=dtype, device=device)
        dequantize_blocks(records.to(device), BLOCK, skip, out)
        _assert_same_bits(out.cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_batches_of_blocks_give_the_same_bits(device, monkeypatch):
    """A large parameter is dequantized a batch of blocks at a time (a bounded temporary)."""
    monkeypatch.setattr(dequant, "BATCH_BLOCKS", 2)
    records = _records(7 * 256 + 9, 3)
    for skip, elems in [(0, 7 * 256 + 9), (100, 7 * 256 - 91), (600, 3), (511, 2)]:
        out = torch.empty(elems, dtype=torch.bfloat16, device=device)
        dequantize_blocks(records.to(device), BLOCK, skip, out)
        _assert_same_bits(out.cpu(), _c_dequant(records, skip, elems, torch.bfloat16))


@pytest.mark.parametrize("device", DEVICES)
def test_pieces_are_dequantized_in_order_into_one_parameter(device):
    """Two chunks' covering blocks back to back, as zps_acquire_quantized hands them out."""
    a, b = _records(600, 1), _records(300, 4)   # a's last block is short: 600 = 2 x 256 + 88
    data = torch.cat([a, b])
    pieces = [(600 - 100, 100, 0, a.numel()), (290, 10, a.numel(), b.numel())]
    out = torch.empty(790, dtype=torch.bfloat16, device=device)
    dequantize_pieces(data.to(device), pieces, BLOCK, out)
    want = torch.cat([_c_dequant(a, 100, 500, torch.bfloat16),
                      _c_dequant(b, 10, 290, torch.bfloat16)])
    _assert_same_bits(out.cpu(), want)
    with pytest.raises(ValueError, match="790"):
        dequantize_pieces(data.to(device), pieces[:1], BLOCK, out)


def test_a_run_outside_the_records_is_refused():
    records = _records(300, 0)
    with pytest.raises(ValueError, match="do not lie"):
        dequantize_blocks(records, BLOCK, 100, torch.empty(201))
    with pytest.raises(ZpsError, match="INVALID_ARGUMENT"):
        _c_dequant(records, 100, 201, torch.float32)
    with pytest.raises(ZpsError, match="INVALID_ARGUMENT"):
        out = torch.empty(4)
        _native.dequantize_blocks(records.data_ptr(), records.numel(), 8, 100, 0, 4,
                                  _native.F32, out.data_ptr())


def _run(monkeypatch, steps, through_torch):
    monkeypatch.setenv("ZPS_TORCH_HOST_STAGING", "1" if through_torch else "0")
    cfg = quantized_job.config()
    cfg["zero_optimization"] = {"stage": 3, "zero_quantized_weights": True}
    return quantized_job.run(cfg, steps)


def test_torch_op_path_trains_to_the_c_paths_bits(monkeypatch):
    """The job of test_quantized_weights.py with its parameters dequantized by torch ops from
    the records as fetched (the path CUDA parameters take) and by the C library: the same
    losses and final weights, bit for bit."""
    _, c_losses, c_state, _ = _run(monkeypatch, 4, through_torch=False)
    _, t_losses, t_state, _ = _run(monkeypatch, 4, through_torch=True)
    assert t_losses == c_losses
    for k in c_state:
        assert torch.equal(t_state[k], c_state[k]), k
    assert t_losses[-1] < t_losses[0]


def test_kept_quantized_buffers_are_not_handed_out_as_values(monkeypatch):
    """With the records kept (options keep_quantized), zps_acquire refuses: its callers would
    read block records as values."""
    import zps.torch as zt
    monkeypatch.setenv("ZPS_TORCH_HOST_STAGING", "1")
    cfg = quantized_job.config()
    cfg["zero_optimization"] = {"stage": 3, "zero_quantized_weights": True}
    torch.manual_seed(0)
    with zt.initialize(quantized_job.Net(), cfg) as engine:
        assert engine.res.quant_block == BLOCK
        with pytest.raises(ZpsError, match="FAILED_PRECONDITION.*keep_quantized"):
            engine.client.acquire(0)
        ptr, nbytes, pieces = engine.client.acquire_quantized(0)
        try:
            numel = engine.zparams[0].numel
            assert sum(p[0] for p in pieces) == numel
            assert nbytes < numel * 2  # under half of bf16's bytes
            records = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr),
                                       dtype=torch.uint8)
            got = torch.empty(numel)
            dequantize_pieces(records, pieces, BLOCK, got)
        finally:
            engine.client.release(0)
        want = torch.empty(numel)
        engine.client.fetch_into([0], [want.data_ptr()], [_native.F32])
        _assert_same_bits(got, want)


def _fetched_like_the_c_path(engine, dtype):
    """Acquires every parameter through the engine's Residency (the device path where the
    parameter is on CUDA or staged) and compares it with zps_fetch_into's CPU dequantization."""
    for zp in engine.zparams:
        engine.res.acquire([zp])
        try:
            got = zp.param.data.view(-1).cpu().clone()
        finally:
            engine.res.release([zp])
        engine.res.release_all()
        want = torch.empty(zp.numel, dtype=dtype)
        engine.client.fetch_into([zp.id], [want.data_ptr()], [TO_CODE[dtype]])
        _assert_same_bits(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_cpu_parameters_hold_the_c_paths_bits(monkeypatch, dtype):
    import zps.torch as zt
    monkeypatch.setenv("ZPS_TORCH_HOST_STAGING", "1")
    cfg = quantized_job.config()
    cfg["zero_optimization"] = {"stage": 3, "zero_quantized_weights": True}
    torch.manual_seed(0)
    with zt.initialize(quantized_job.Net().to(dtype), cfg) as engine:
        _fetched_like_the_c_path(engine, dtype)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_parameters_hold_the_c_paths_bits(monkeypatch, dtype):
    """CUDA parameters: the records go to the GPU as fetched and are dequantized there, into
    the parameter's storage; the values are the C library's CPU dequantization, bit for bit,
    and the copies to the device carried the records (under half of bf16's bytes)."""
    import zps.torch as zt
    monkeypatch.setenv("ZPS_TORCH_HOST_STAGING", "0")
    cfg = quantized_job.config()
    cfg["zero_optimization"] = {"stage": 3, "zero_quantized_weights": True}
    torch.manual_seed(0)
    with zt.initialize(quantized_job.Net().to("cuda", dtype), cfg) as engine:
        assert engine.res.quant_block == BLOCK
        _fetched_like_the_c_path(engine, dtype)
        x, y = quantized_job.batches(1)[0]
        loss = torch.nn.functional.mse_loss(engine(x.to("cuda", dtype)).float(), y.cuda())
        engine.backward(loss)
        engine.step()
        assert torch.isfinite(loss)
