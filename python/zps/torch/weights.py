"""A new job's initial weights from safetensors files: zt.initialize(model, config, init_from=path).

`path` is one .safetensors file (what `zps-ckpt export` writes), a directory, or the index of a
Hugging Face-style sharded set (model-00001-of-0000N.safetensors ... with
model.safetensors.index.json: {"metadata": {...}, "weight_map": {name: file}}). A directory
holds either such an index (model.safetensors.index.json, or the only *.safetensors.index.json)
or a single *.safetensors file.

Everything is checked before the first byte is uploaded, from the headers alone: each file's
header and sizes (a malformed or truncated file is DATA_LOSS), the index against the files'
headers, and the tensors against the model (WeightsMismatch, listing every offending name). Then
rank 0 reads one tensor at a time, converts it to fp32 and pushes it (bounded memory: one tensor
and the pushes in flight, whatever the model size). Parameters match by name: the module's own
names (named_parameters), where a tied parameter may appear under any one of its names. A file
tensor that names one of the model's buffers is copied into that buffer on every rank (the
servers hold parameters only); buffers the files do not name keep their values.

A model built on the meta device (`torch.device("meta")`, or `device="meta"` per module) holds no
values at all: with init_from its meta parameters become CPU parameters with released storage
(shape, dtype, requires_grad and ties kept, under every name; the Parameter objects are new),
and its meta buffers take the files' values, so every meta buffer must be in the files.

dtypes: a parameter's tensor may be F32, BF16 or F16, whatever the parameter's own dtype: the
servers' fp32 masters take the file's values exactly (BF16 and F16 widen to fp32 without loss).
Anything else is a dtype mismatch: F64 would round, and integer and F8 tensors are not weights
this reader converts. A buffer takes the file's dtype when it is its own or a lossless widening
(e.g. BF16 into float32).

Thread-safety: none; used by the thread that calls initialize.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import struct
from typing import Optional

import torch

from zps._errors import ZpsError
from zps.torch.params import resize_storage

INDEX_NAME = "model.safetensors.index.json"

# Every safetensors dtype: its element size, and the torch dtype this reader makes of it (None:
# recognised, valid in a file, but never taken).
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
             "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
# What a parameter's tensor may be: exact in fp32.
_PARAM_DTYPES = ("F32", "BF16", "F16")
# file dtype -> buffer dtypes that hold every value of it.
_WIDENS_TO = {
    "F16": {torch.float16, torch.float32, torch.float64},
    "BF16": {torch.bfloat16, torch.float32, torch.float64},
    "F32": {torch.float32, torch.float64},
}
_MAX_HEADER = 100 << 20  # the safetensors library's own limit


class WeightsMismatch(ZpsError, ValueError):
    """init_from's tensors do not match the model (code INVALID_ARGUMENT). The message lists every
    offending name; so do the attributes:

    missing: model parameters no file names (a tied one by its first name), and meta buffers
        (which have no value of their own);
    extra: file tensors that are neither a parameter nor a buffer of the model;
    shape: (name, file shape, model shape);
    dtype: (name, file dtype, what it may be);
    duplicate: parameters a set names under two of their (tied) names."""

    def __init__(self, path, missing, extra, shape, dtype, duplicate):
        self.missing, self.extra, self.shape = missing, extra, shape
        self.dtype, self.duplicate = dtype, duplicate
        parts = []
        if missing:
            parts.append(f"missing {len(missing)}: " + ", ".join(missing))
        if extra:
            parts.append(f"extra {len(extra)}: " + ", ".join(extra))
        if shape:
            parts.append(f"shape {len(shape)}: " + ", ".join(
                f"{n} (file {list(f)}, model {list(m)})" for n, f, m in shape))
        if dtype:
            parts.append(f"dtype {len(dtype)}: " + ", ".join(
                f"{n} (file {f}, model takes {w})" for n, f, w in dtype))
        if duplicate:
            parts.append(f"named twice {len(duplicate)}: " + ", ".join(
                " and ".join(names) for names in duplicate))
        super().__init__("INVALID_ARGUMENT", f"init_from {path} does not match the model; nothing "
                         "was uploaded. " + "; ".join(parts))


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One tensor of a file, as its header gives it."""
    name: str
    path: str
    dtype: str
    shape: tuple
    offset: int   # of its first byte in the file
    nbytes: int


def _data_loss(path, what):
    return ZpsError("DATA_LOSS", f"{path}: {what}")


def read_header(path) -> dict[str, Tensor]:
    """{name: Tensor} of one safetensors file, its header checked against the file's size: every
    tensor's bytes lie in the data section and match its shape and dtype. Raises ZpsError:
    NOT_FOUND (no file), DATA_LOSS (malformed or truncated)."""
    path = str(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _data_loss(path, "shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise _data_loss(path, f"header length {n} does not fit the file ({size} bytes)")
            raw = f.read(n)
    except FileNotFoundError:
        raise ZpsError("NOT_FOUND", f"no file {path}") from None
    except OSError as e:
        raise ZpsError("IO_ERROR", f"{path}: {e}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise _data_loss(path, f"header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise _data_loss(path, "header is not a JSON object")
    data_start, data_len = 8 + n, size - 8 - n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = meta["dtype"], meta["shape"], meta["data_offsets"]
            itemsize = _ITEMSIZE[dtype]
            numel = 1
            for d in shape:
                if not isinstance(d, int) or d < 0:
                    raise ValueError(d)
                numel *= d
            if not (isinstance(begin, int) and isinstance(end, int)
                    and 0 <= begin <= end <= data_len and end - begin == numel * itemsize):
                raise ValueError((begin, end))
        except (KeyError, TypeError, ValueError):
            raise _data_loss(path, f"bad header entry {name!r} (dtype, shape and data_offsets "
                             f"within {data_len} data bytes)") from None
        out[name] = Tensor(name, path, dtype, tuple(shape), data_start + begin, end - begin)
    return out


def _read_index(index_path) -> dict[str, Tensor]:
    """The tensors of a sharded set, after checking its index against its files' headers."""
    index_path = pathlib.Path(index_path)
    try:
        index = json.loads(index_path.read_text())
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict) or not all(
                isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map")
    except FileNotFoundError:
        raise ZpsError("NOT_FOUND", f"init_from: no file {index_path}") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _data_loss(index_path, f"not a safetensors index ({e!r})") from None
    tensors, wrong = {}, []
    for file in sorted(set(weight_map.values())):
        if os.path.isabs(file) or ".." in pathlib.PurePath(file).parts:
            raise _data_loss(index_path, f"file {file!r} is not inside the set's directory")
        for name, t in read_header(index_path.parent / file).items():
            if weight_map.get(name) == file:
                tensors[name] = t
            else:
                wrong.append(f"{name} (in {file})")
    wrong += [f"{n} (indexed in {f})" for n, f in weight_map.items() if n not in tensors]
    if wrong:
        raise _data_loss(index_path, "the index and its files disagree on " + ", ".join(wrong))
    return tensors


def read_set(path) -> dict[str, Tensor]:
    """{name: Tensor} of a file, a sharded set's index, or a directory holding either (module
    doc). Raises ZpsError: NOT_FOUND, INVALID_ARGUMENT (a directory that is neither), DATA_LOSS."""
    p = pathlib.Path(path)
    if p.is_dir():
        indexes = [p / INDEX_NAME] if (p / INDEX_NAME).exists() else \
            sorted(p.glob("*.safetensors.index.json"))
        if len(indexes) == 1:
            return _read_index(indexes[0])
        files = sorted(p.glob("*.safetensors"))
        if not indexes and len(files) == 1:
            return read_header(files[0])
        raise ZpsError("INVALID_ARGUMENT", f"init_from {p}: a directory must hold one "
                       f"*.safetensors.index.json or one *.safetensors file; it holds "
                       f"{[x.name for x in indexes + files] or 'neither'}")
    if p.name.endswith(".json"):
        return _read_index(p)
    return read_header(p)


class InitialWeights:
    """The checked plan of an init_from: which file tensor each parameter and buffer takes."""

    def __init__(self, path, named, module):
        """named: the module's unique parameters, [(names, Parameter)] (a tied one once with all
        its names); a parameter's position in it is its id."""
        self.path = str(path)
        tensors = read_set(path)
        param_names = {n for names, _ in named for n in names}
        buffers = dict(module.named_buffers())
        missing, shape, dtype, duplicate = [], [], [], []
        self.param_tensor = {}             # parameter id -> Tensor
        for pid, (names, p) in enumerate(named):
            found = [n for n in names if n in tensors]
            if not found:
                missing.append(names[0])
                continue
            if len(found) > 1:
                duplicate.append(found)
            t = tensors[found[0]]
            want = tuple(p.shape)
            # A scalar parameter is [1] in zps's layout, and so in its exports.
            if t.shape != want and not (want == () and t.shape == (1,)):
                shape.append((t.name, t.shape, want))
            if t.dtype not in _PARAM_DTYPES:
                dtype.append((t.name, t.dtype, "/".join(_PARAM_DTYPES)))
            self.param_tensor[pid] = t
        self.buffer_tensor = []            # (module, buffer name, Tensor)
        extra = []
        for name, t in tensors.items():
            if name in param_names:
                continue
            if name not in buffers:
                extra.append(name)
                continue
            buf = buffers[name]
            if t.shape != tuple(buf.shape):
                shape.append((name, t.shape, tuple(buf.shape)))
            if _TORCH.get(t.dtype) != buf.dtype and buf.dtype not in _WIDENS_TO.get(t.dtype, ()):
                dtype.append((name, t.dtype, str(buf.dtype).replace("torch.", "")))
            owner, _, leaf = name.rpartition(".")
            self.buffer_tensor.append((module.get_submodule(owner) if owner else module, leaf, t))
        missing += [f"{n} (a buffer on the meta device)" for n, b in buffers.items()
                    if b.device.type == "meta" and n not in tensors]
        if missing or extra or shape or dtype or duplicate:
            raise WeightsMismatch(self.path, missing, sorted(extra), shape, dtype, duplicate)
        self._files = {}

    def read(self, t: Tensor) -> torch.Tensor:
        """A tensor's values, on the CPU in its file dtype."""
        f = self._files.get(t.path)
        if f is None:
            f = self._files[t.path] = open(t.path, "rb", buffering=0)
        buf = bytearray(t.nbytes)
        f.seek(t.offset)
        view = memoryview(buf)
        while view:
            got = f.readinto(view)
            if not got:
                raise _data_loss(t.path, f"short read of {t.name}")
            view = view[got:]
        if not t.nbytes:
            return torch.empty(t.shape, dtype=_TORCH[t.dtype])
        return torch.frombuffer(buf, dtype=_TORCH[t.dtype]).reshape(t.shape)

    def param_f32(self, pid) -> torch.Tensor:
        """Parameter `pid`'s initial values as a contiguous fp32 CPU tensor."""
        return self.read(self.param_tensor[pid]).to(torch.float32).contiguous()

    def load_buffers(self):
        """Copies the files' buffer values into the module's buffers (every rank); a meta buffer
        is replaced by a CPU tensor."""
        with torch.no_grad():
            for owner, leaf, t in self.buffer_tensor:
                buf = owner._buffers[leaf]
                value = self.read(t).to(buf.dtype)
                if buf.device.type == "meta":
                    owner._buffers[leaf] = value
                else:
                    buf.copy_(value)

    def close(self):
        for f in self._files.values():
            f.close()
        self._files = {}


def open_initial_weights(path, named, module) -> Optional[InitialWeights]:
    """The checked plan for `path`, or None without one. Raises as InitialWeights does."""
    if path is None:
        return None
    return InitialWeights(os.fspath(path), named, module)


def materialize_meta(module, named):
    """`named` with each meta Parameter replaced, in the module under all of its names, by a CPU
    Parameter of the same shape, dtype and requires_grad whose storage is released (the module
    doc). Only where init_from gives every value."""
    out = []
    for names, p in named:
        if p.device.type == "meta":
            q = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype),
                                   requires_grad=p.requires_grad)
            resize_storage(q.data, 0)  # never touched: no page of it was resident
            for n in names:
                owner, _, leaf = n.rpartition(".")
                (module.get_submodule(owner) if owner else module)._parameters[leaf] = q
            p = q
        out.append((names, p))
    return out
