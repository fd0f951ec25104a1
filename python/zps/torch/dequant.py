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
# Blocks dequantized at a time: bounds the fp32 temporary on the device (64 MiB at 256-element
# blocks) whatever the parameter's size.
BATCH_BLOCKS = 65536


def _block_values(records: torch.Tensor, block: int, first: int, end: int) -> torch.Tensor:
    """The fp32 values of blocks [first, end) of the records (the last block possibly short)."""
    stride = SCALE_BYTES + block
    full = records.numel() // stride
    parts = []
    if first < min(end, full):
        recs = records[first * stride: min(end, full) * stride].view(-1, stride)
        scales = recs[:, :SCALE_BYTES].contiguous().view(torch.float32)   # (blocks, 1)
        parts.append(recs[:, SCALE_BYTES:].view(torch.int8).to(torch.float32).mul_(scales)
                     .reshape(-1))
    if end > full:  # the short last record: 4 + its elements bytes
        rec = records[full * stride:]
        scale = rec[:SCALE_BYTES].contiguous().view(torch.float32)
        parts.append(rec[SCALE_BYTES:].view(torch.int8).to(torch.float32).mul_(scale))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def dequantize_blocks(records: torch.Tensor, block: int, skip: int, out: torch.Tensor) -> None:
    """Writes out.numel() elements, starting `skip` elements into the first of the int8 block
    records in `records` (a 1-D uint8 tensor of whole records: a little-endian fp32 scale, then
    `block` codes, the last record possibly short), into `out` (1-D, any float dtype, on
    records' device), rounded to out's dtype."""
    stride = SCALE_BYTES + block
    full = records.numel() // stride
    tail = records.numel() - full * stride
    held = full * block + (tail - SCALE_BYTES if tail else 0)
    n = out.numel()
    if tail and tail <= SCALE_BYTES or skip + n > held:
        raise ValueError(f"{n} elements from {skip} do not lie in {held} quantized ones")
    if n == 0:
        return
    last = (skip + n - 1) // block + 1
    for first in range(skip // block, last, BATCH_BLOCKS):
        end = min(first + BATCH_BLOCKS, last)
        lo, hi = max(skip, first * block), min(skip + n, end * block)   # stream elements
        values = _block_values(records, block, first, end)
        out[lo - skip: hi - skip].copy_(values[lo - first * block: hi - first * block])


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
