"""How a parameter lives on a worker: its identity and shape stay, its storage comes and goes.

A released parameter keeps its Parameter object, shape, dtype and device, but its storage is
resized to 0 bytes (FSDP's approach). Acquiring it regrows the same storage and writes the fetched
bytes straight into it through data_ptr(): autograd's saved tensors and views alias that storage,
so they see the values again in backward, and no version counter is bumped (a copy_ into the
parameter itself would trip "modified by an inplace operation").

A regrown CPU storage of 4 MiB or more is advised MADV_HUGEPAGE before the fetched bytes touch
it, as the shards' state buffers are: a large storage is a fresh mapping each time (glibc maps an
allocation above its mmap threshold, at most 32 MiB, anew and unmaps it on free), so without the
hint each acquire faults it in 4 KiB at a time. A hint only: where transparent huge pages are
"never", or the kernel has none to give, nothing changes.
"""

import ctypes
import os
import platform
import sys

import torch

from zps import _native
from zps._errors import ZpsError

TORCH_TO_ZPS = {torch.float32: _native.F32, torch.float16: _native.F16,
                torch.bfloat16: _native.BF16}
ZPS_TO_TORCH = {v: k for k, v in TORCH_TO_ZPS.items()}


def _storage(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def storage_bytes(t):
    s = _storage(t)
    return s.nbytes() if hasattr(s, "nbytes") else s.size() * t.element_size()


def resize_storage(t, nbytes):
    s = _storage(t)
    if hasattr(t, "untyped_storage"):
        s.resize_(nbytes)
    else:  # torch 1.13: a TypedStorage, sized in elements
        s.resize_(nbytes // t.element_size())


_MADV_HUGEPAGE = 14      # <sys/mman.h> on Linux
_HUGE_FROM = 4 << 20     # bytes; as the shards' AlignedBuffer
_PAGE = 4096


def _libc_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        f = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    f.restype = ctypes.c_int
    return f


_madvise = _libc_madvise()


def advise_huge_pages(t):
    """Advises the whole pages of CPU tensor `t`'s memory MADV_HUGEPAGE (a hint: errors are
    ignored); tensors under 4 MiB, or not on the CPU, are left alone."""
    nbytes = t.numel() * t.element_size()
    if _madvise is None or t.device.type != "cpu" or nbytes < _HUGE_FROM:
        return
    start = (t.data_ptr() + _PAGE - 1) & ~(_PAGE - 1)
    end = (t.data_ptr() + nbytes) & ~(_PAGE - 1)
    if end > start:
        _madvise(start, end - start, _MADV_HUGEPAGE)


_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def malloc_huge_pages_hint(zparams):
    """A line for the log, or None: the gradients of large trainable CPU parameters are torch's
    own allocations, which glibc maps anew each time and faults in 4 KiB pages unless the process
    was started with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (glibc 2.35 or later: malloc then
    advises its fresh mappings MADV_HUGEPAGE). None where that is set, where transparent huge
    pages are off or absent, off glibc, or without such a parameter."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    if "glibc.malloc.hugetlb" in os.environ.get("GLIBC_TUNABLES", ""):
        return None
    if not any(zp.trainable and zp.param.device.type == "cpu" and zp.nbytes >= _HUGE_FROM
               for zp in zparams):
        return None
    try:
        with open(_THP_MODE) as f:
            if "[never]" in f.read():
                return None
    except OSError:
        return None
    return ("zps.torch: the gradients of this model's large CPU parameters are faulted in 4 KiB "
            "pages; starting the worker with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 lets glibc "
            "give them transparent huge pages (docs/pytorch.md, \"How parameters live\")")


def host_view(ptr, nbytes, dtype):
    """A CPU tensor over `nbytes` of memory at `ptr` (no copy; the memory must outlive it)."""
    buf = (ctypes.c_byte * nbytes).from_address(ptr)
    return torch.frombuffer(buf, dtype=dtype)


class ZParam:
    """One unique Parameter of the model (a tied Parameter is one ZParam with several names)."""

    def __init__(self, pid, param, names):
        if param.dtype not in TORCH_TO_ZPS:
            raise ZpsError("INVALID_ARGUMENT", f"parameter {names[0]} has dtype {param.dtype}; "
                           "zps serves float32, float16 and bfloat16 parameters")
        if not param.is_contiguous():
            raise ZpsError("INVALID_ARGUMENT", f"parameter {names[0]} is not contiguous")
        self.id = pid
        self.param = param
        self.names = names
        self.shape = tuple(param.shape)
        self.numel = param.numel()
        self.nbytes = self.numel * param.element_size()
        self.dtype_code = TORCH_TO_ZPS[param.dtype]
        self.trainable = param.requires_grad
        self.refs = 0
        self.acc_node = None       # the AccumulateGrad node (kept: its hook dies with it)
        self.accumulated = 0       # AccumulateGrad calls this step
        self.pushed = False        # this step's gradient went to the servers
        self.persistent = False    # small: held from first use to the end of the step
        self.step_hold = False     # a hold until the end of the step (persistent or external)

    @property
    def live(self):
        return self.refs > 0

    def check_unchanged(self, current):
        if current is not self.param:
            raise ZpsError("FAILED_PRECONDITION", f"parameter {self.names[0]} was replaced after "
                           "zps.torch.initialize; the parameter set is fixed at initialize")
        if tuple(current.shape) != self.shape or current.dtype != ZPS_TO_TORCH[self.dtype_code]:
            raise ZpsError("FAILED_PRECONDITION", f"parameter {self.names[0]} changed shape or "
                           f"dtype after initialize ({self.shape} -> {tuple(current.shape)})")

    def free(self):
        resize_storage(self.param.data, 0)

    def regrow(self):
        resize_storage(self.param.data, self.nbytes)
        advise_huge_pages(self.param.data)
