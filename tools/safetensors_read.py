#!/usr/bin/env python3
"""An independent reader of the safetensors format (struct + json + numpy only).

Written from the format description, not from zps code:
  - 8 bytes: N, unsigned little-endian 64-bit, the size of the header;
  - N bytes: a UTF-8 JSON object; each key is a tensor name (or "__metadata__", a str->str map)
    mapping to {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}, offsets relative to
    the start of the byte buffer that follows the header;
  - the byte buffer: tensors, little-endian, row-major (C order).
The offsets must cover the buffer exactly, without holes or overlaps, and each tensor's byte
length must equal prod(shape) * itemsize.

Usage:
  safetensors_read.py FILE                 print one line per tensor: name dtype shape
  safetensors_read.py FILE --dump DIR      also write DIR/<index>.f32 (the tensor as float32
                                           little-endian) and DIR/index.txt ("<index> <name>")
Exit status 0 when the file is valid, 1 with a message otherwise.
"""
import json
import os
import struct
import sys

import numpy as np

DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # converted to float32 by shifting into the high half
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}


class FormatError(Exception):
    pass


def read(path):
    """Returns (metadata, [(name, dtype_str, shape, float32 ndarray)]) in data order."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise FormatError("file shorter than 8 bytes")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise FormatError(f"header length {n} exceeds the file")
        header = json.loads(f.read(n).decode("utf-8"))
        data_start = 8 + n
        data_len = size - data_start
        if not isinstance(header, dict):
            raise FormatError("header is not a JSON object")
        metadata = header.pop("__metadata__", {})
        entries = []
        for name, info in header.items():
            dt, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
            if dt not in DTYPES:
                raise FormatError(f"{name}: unknown dtype {dt}")
            count = int(np.prod(shape, dtype=np.int64)) if shape else 1
            if e - b != count * DTYPES[dt].itemsize:
                raise FormatError(f"{name}: {e - b} bytes for shape {shape} {dt}")
            if not 0 <= b <= e <= data_len:
                raise FormatError(f"{name}: offsets [{b}, {e}) outside the data ({data_len})")
            entries.append((b, e, name, dt, shape))
        entries.sort()
        pos = 0
        for b, e, name, _, _ in entries:
            if b != pos:
                raise FormatError(f"{name}: starts at {b}, expected {pos} (hole or overlap)")
            pos = e
        if pos != data_len:
            raise FormatError(f"the tensors cover {pos} of {data_len} data bytes")
        out = []
        for b, e, name, dt, shape in entries:
            f.seek(data_start + b)
            raw = np.frombuffer(f.read(e - b), dtype=DTYPES[dt])
            if dt == "BF16":
                arr = (raw.astype(np.uint32) << 16).view(np.float32)
            else:
                arr = raw.astype(np.float32)
            out.append((name, dt, shape, arr.reshape(shape)))
        return metadata, out


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--dump"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        metadata, tensors = read(argv[1])
    except (FormatError, ValueError, KeyError, TypeError, OSError) as err:
        print(f"safetensors_read: {argv[1]}: {err}", file=sys.stderr)
        return 1
    print(f"metadata {json.dumps(metadata, sort_keys=True)}")
    for name, dt, shape, _ in tensors:
        print(f"{name} {dt} {list(shape)}")
    if len(argv) == 4:
        os.makedirs(argv[3], exist_ok=True)
        with open(os.path.join(argv[3], "index.txt"), "w") as idx:
            for i, (name, _, _, arr) in enumerate(tensors):
                arr.astype("<f4").tofile(os.path.join(argv[3], f"{i}.f32"))
                idx.write(f"{i} {name}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
