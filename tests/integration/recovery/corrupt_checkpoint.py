#!/usr/bin/env python3
"""Flips one byte of a stored tensor of checkpoint STEP in a shard's checkpoint store, on disk.

Usage: corrupt_checkpoint.py STORE_DIR STEP

Tensor slices are RocksDB values of 4 KiB and more, so they live in integrated-BlobDB blob
files (*.blob). A blob record is a 32-byte header, the key, then the value, and the value of a
slice is crc32c(key || payload) followed by the payload (docs/checkpoints.md). The key of a
slice of step S starts with b"d" + S as 8 big-endian bytes, so the records of checkpoint S are
found by content, whatever file RocksDB put them in. The byte flipped lies inside the payload of
the first such record: the value's CRC32C no longer matches, which the store reports as
DATA_LOSS when the value is read. Prints the file and offset; exits 1 if no record is found.
"""
import os
import struct
import sys

KEY_LEN = 1 + 8 + 4 + 1 + 4  # 'd', step, chunk, kind, slice


def main() -> int:
    store, step = sys.argv[1], int(sys.argv[2])
    prefix = b"d" + struct.pack(">q", step)
    for name in sorted(os.listdir(store)):
        if not name.endswith(".blob"):
            continue
        path = os.path.join(store, name)
        with open(path, "r+b") as f:
            data = f.read()
            at = data.find(prefix)
            if at < 0 or at + KEY_LEN + 4 + 64 > len(data):
                continue
            target = at + KEY_LEN + 4 + 40  # inside the payload, past the value's CRC
            f.seek(target)
            f.write(bytes([data[target] ^ 0x5A]))
            f.flush()
            os.fsync(f.fileno())
        print(f"corrupted checkpoint {step}: flipped byte {target} of {path}")
        return 0
    print(f"no value of checkpoint {step} found in {store}/*.blob", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
