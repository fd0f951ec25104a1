"""Quantized weights dequantized with torch ops on the parameter's own device.

With `zero_quantized_weights` the shards serve an int8 block-quantized copy (one fp32 scale per
256 elements, common/include/zps/common/block_quant.h). For a CUDA parameter the engine moves
those block records to the GPU as they were fetched (1 + 4/256 bytes an element, half of bf16's)
and dequantizes them there, into the parameter's storage, with the functions below; the same
functions run on CPU tensors, where tests/torch/test_device_dequant.py checks them bit for bit
against the C library's SIMD codec (zps_dequantize_blocks).

Why the bits agree: a value is float(code) * scale, one IEEE fp32 multiply (torch's mul on
float32, with no fused operation to round differently), then one rounding to the parameter's
dtype, to nearest with ties to even in both. Only a NaN's payload may differ (a block whose
scale is NaN dequantizes to NaN either way).
"""

from __future__ import annotations

import torch

SCALE_BYTES = 4


def dequantize_blocks(records: torch.Tensor, block: int, skip: int, out: torch.Tensor) -> None:
    """Writes out.numel() elements, starting `skip` elements into the first of the int8 block
    records in `records` (a 1-D uint8 tensor of whole records: a little-endian fp32 scale, then
    `block` codes, the last record possibly short), into `out` (1-D, any float dtype, on
    records' device), rounded to out's dtype."""
    stride = SCALE_BYTES + block
    full = records.numel() // stride
    tail = records.numel() - full * stride  # a short last record: 4 + its elements bytes
    values = []
    if full:
        recs = records[: full * stride].view(full, stride)
        scales = recs[:, :SCALE_BYTES].contiguous().view(torch.float32)   # (full, 1)
        values.append(recs[:, SCALE_BYTES:].view(torch.int8).to(torch.float32).mul_(scales)
                      .reshape(-1))
    if tail:
        rec = records[full * stride:]
        scale = rec[:SCALE_BYTES].contiguous().view(torch.float32)
        values.append(rec[SCALE_BYTES:].view(torch.int8).to(torch.float32).mul_(scale))
    flat = values[0] if len(values) == 1 else torch.cat(values)
    n = out.numel()
    if skip + n > flat.numel():
        raise ValueError(f"{n} elements from {skip} do not lie in {flat.numel()} quantized ones")
    out.copy_(flat[skip: skip + n])


def dequantize_pieces(data: torch.Tensor, pieces, block: int, out: torch.Tensor) -> None:
    """Dequantizes a parameter's pieces ((elems, skip, offset, bytes) each, in element order:
    zps_acquire_quantized) from `data` (1-D uint8, the buffer's bytes) into `out` (1-D, the
    parameter's elements), on data's device."""
    at = 0
    for elems, skip, offset, nbytes in pieces:
        dequantize_blocks(data[offset: offset + nbytes], block, skip, out[at: at + elems])
        at += elems
    if at != out.numel():
        raise ValueError(f"quantized pieces hold {at} elements, the parameter {out.numel()}")
