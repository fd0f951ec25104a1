"""Building a model larger than the worker's memory: `with zt.init(config): model = Build()`.

Inside the context every nn.Module's __init__ is wrapped (as DeepSpeed's zero.Init does): when a
module's own __init__ returns, its parameters' values are written to a staging file and their
storage is released (the Parameter keeps shape, dtype and identity). A parameter touched again
later in construction (a parent re-initialising or tying a child's weight) is read back on
access and staged again when the next __init__ returns. zps.torch.initialize then uploads the
staged values (rank 0) and deletes the file.

Why a staging file and not the servers directly: the servers need the whole job (the flat layout
of every parameter) before they take a value, and the layout is known only once the model is
built. The file is written with plain write() calls, so its pages are page cache, not this
process's resident memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
import threading

import torch

from zps._errors import ZpsError
from zps.torch import config as config_mod
from zps.torch.params import resize_storage, storage_bytes

_state = threading.local()


class StagingFile:
    """Append-only file of parameter values: (offset, nbytes, dtype) per staged Parameter."""

    def __init__(self, directory=None):
        fd, self.path = tempfile.mkstemp(prefix="zps-staging-", dir=directory)
        self.f = os.fdopen(fd, "w+b", buffering=0)
        self.records = {}   # id(param) -> (param, offset, nbytes)
        self.size = 0

    def stage(self, p):
        t = p.detach()
        nbytes = t.numel() * t.element_size()
        if storage_bytes(t) == 0 and nbytes > 0:
            return  # already staged and not read back
        if not t.is_contiguous():
            raise ZpsError("INVALID_ARGUMENT", "zt.init: a non-contiguous parameter")
        offset = self.size
        if nbytes:
            self.f.seek(offset)
            self._write_all(_bytes_at(t.data_ptr(), nbytes))
        self.size += nbytes
        self.records[id(p)] = (p, offset, nbytes)
        resize_storage(p.data, 0)

    def load_into(self, p):
        """Regrows p's storage and reads its staged bytes back into it."""
        _, offset, nbytes = self.records[id(p)]
        resize_storage(p.data, nbytes)
        if nbytes:
            self._read_all(offset, _bytes_at(p.data.data_ptr(), nbytes))

    def read_f32(self, p, out):
        """Reads p's staged values into the fp32 CPU tensor `out` (numel elements)."""
        _, offset, nbytes = self.records[id(p)]
        raw = torch.empty(nbytes, dtype=torch.uint8)
        self._read_all(offset, _bytes_at(raw.data_ptr(), nbytes))
        out.copy_(raw.view(p.dtype).view(out.shape))

    def _write_all(self, buf):
        mv = memoryview(buf).cast("B")
        while mv:
            n = self.f.write(mv)
            mv = mv[n:]

    def _read_all(self, offset, buf):
        mv = memoryview(buf).cast("B")
        self.f.seek(offset)
        while mv:
            n = self.f.readinto(mv)
            if not n:
                raise ZpsError("IO_ERROR", f"zt.init staging file {self.path}: short read")
            mv = mv[n:]

    def is_staged(self, p):
        return id(p) in self.records and storage_bytes(p.data) == 0 and p.numel() > 0

    def close(self):
        self.f.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def _bytes_at(ptr, nbytes):
    # A raw view of tensor memory: numpy() would mark the storage as not resizable.
    return (ctypes.c_char * nbytes).from_address(ptr)


def _subclasses(cls):
    out, todo = [], [cls]
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(c.__subclasses__())
    return out


class _Init:
    """The context `init` returns."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.staging = StagingFile(directory)
        self.patched = []
        self.touched = {}          # id(param) -> param read back during construction
        self.depth = 0

    def _wrap(self, cls):
        if "__init__" not in cls.__dict__ or getattr(cls.__init__, "_zps_wrapped", False):
            return
        orig = cls.__init__
        ctx = self

        def __init__(module, *args, **kwargs):
            mark = module.__dict__.get("_zps_init_depth", 0)
            object.__setattr__(module, "_zps_init_depth", mark + 1)
            ctx.depth += 1
            try:
                orig(module, *args, **kwargs)
            finally:
                ctx.depth -= 1
                object.__setattr__(module, "_zps_init_depth", mark)
            if mark == 0:  # this object's outermost __init__ has returned
                ctx._after_init(module)

        __init__._zps_wrapped = True
        __init__.__wrapped__ = orig
        cls.__init__ = __init__
        self.patched.append((cls, orig))

    def _after_init(self, module):
        # The whole subtree: a parent may have replaced or tied a child's parameter.
        for m in module.modules():
            for p in m._parameters.values():
                if p is not None and not self.staging.is_staged(p):
                    self.staging.stage(p)
        for pid, p in list(self.touched.items()):
            self.staging.stage(p)
            del self.touched[pid]
        object.__setattr__(module, "_zps_staging", self.staging)

    def __enter__(self) -> _Init:
        if getattr(_state, "active", None) is not None:
            raise ZpsError("FAILED_PRECONDITION", "zt.init contexts do not nest")
        _state.active = self
        for cls in _subclasses(torch.nn.Module):
            self._wrap(cls)
        ctx = self
        self._orig_init_subclass = torch.nn.Module.__dict__.get("__init_subclass__")

        def __init_subclass__(cls, **kwargs):
            super(torch.nn.Module, cls).__init_subclass__(**kwargs)
            ctx._wrap(cls)

        torch.nn.Module.__init_subclass__ = classmethod(__init_subclass__)
        self._orig_getattr = torch.nn.Module.__getattr__

        def __getattr__(module, name):
            value = ctx._orig_getattr(module, name)
            if isinstance(value, torch.nn.Parameter) and ctx.staging.is_staged(value):
                ctx.staging.load_into(value)
                ctx.touched[id(value)] = value
            return value

        torch.nn.Module.__getattr__ = __getattr__
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, orig in reversed(self.patched):
            cls.__init__ = orig
        self.patched = []
        if self._orig_init_subclass is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = self._orig_init_subclass
        torch.nn.Module.__getattr__ = self._orig_getattr
        for p in self.touched.values():
            self.staging.stage(p)
        self.touched.clear()
        _state.active = None


def init(config: config_mod.ConfigSource = None,
         staging_dir: str | os.PathLike[str] | None = None) -> _Init:
    """Context manager: modules built inside keep no parameter data in memory (see module doc).
    `config` is accepted for symmetry with DeepSpeed's zero.Init(config_dict_or_path=...) and
    checked; staging_dir defaults to $TMPDIR."""
    if config is not None:
        config_mod.load(config)
    return _Init(staging_dir)


def staging_of(model):
    """The StagingFile the model's parameters were staged to, or None."""
    for m in model.modules():
        s = m.__dict__.get("_zps_staging")
        if s is not None:
            return s
    return None
