"""Module and gradient hooks: fetch before use, release after, push each gradient when it is done.

- Forward: a pre-hook acquires the module's own parameters (recurse=False) in one fetch; a
  post-hook releases them, and wraps the outputs that need grad in `_PreBackward`, an identity
  autograd Function whose backward re-acquires the parameters just before the module's backward.
- Backward: a hook on each trainable parameter's AccumulateGrad node (torch 1.13 has no
  post-accumulate hook) pushes the gradient as soon as it is accumulated, frees it, and releases
  the modules whose parameters are all done.
- A parameter read outside its module's forward (`model.head.weight` in the loss) is acquired
  on attribute access (the module's class gets a `__getattr__` that knows about zps) and held
  until the end of the step.
- Small parameters (below the persistence threshold) are held from their first use to the end
  of the step. Everything still held is released at the step's end (`Residency.end_step`).

Two classes with one job each, wired together by HookSet: `Residency` holds parameter storage
(fetch on acquire, free on the last release), `GradientPusher` sends gradients (push on
accumulation, zeros for the unused at the step's end, backpressure on the pushes in flight).
"""

from __future__ import annotations

import os

import torch

from zps import _native
from zps._errors import ZpsError, stale_step
from zps.torch.dequant import dequantize_pieces
from zps.torch.params import ZParam, ZPS_TO_TORCH, TORCH_TO_ZPS, host_view


def host_staging() -> bool:
    """Tests: take CPU parameters through the path that CUDA parameters use (host staging, or
    with quantized weights the torch-op dequantization), to exercise it without a GPU."""
    return os.environ.get("ZPS_TORCH_HOST_STAGING") == "1"


class Residency:
    """Which parameters hold storage: fetched on acquire, released when the last hold goes.
    One training thread."""

    def __init__(self, client: _native.Client, zparams: list[ZParam],
                 by_param: dict[int, ZParam], serving_code: int, persistence_threshold: int,
                 cuda_backend: bool = False, quant_block: int = 0) -> None:
        self.client = client
        # CUDA parameters through the CUDA backend (pinned slots, copy stream);
        # False: staged on the host and copied on the current stream.
        self.cuda_backend = cuda_backend
        self.zparams = zparams          # by id
        self.by_param = by_param        # id(Parameter) -> ZParam
        self.serving_code = serving_code
        self.live_bytes = 0
        self.peak_live_bytes = 0
        self.host_staging = host_staging()
        # Quantized weights kept as fetched (the client's keep_quantized option): elements per
        # block; 0 = the client hands out values.
        self.quant_block = quant_block
        # Quantized buffers whose copy to the device may still read them: (event, id), released
        # once the event completed (their host memory is the client's, held until release).
        self.in_copy = []
        for zp in zparams:
            zp.persistent = zp.numel < persistence_threshold

    def acquire(self, zps: list[ZParam]) -> None:
        need = [zp for zp in zps if zp.refs == 0]
        if need:
            self._fill(need)
        for zp in zps:
            zp.refs += 1
            if zp.persistent and not zp.step_hold:
                zp.step_hold = True
                zp.refs += 1

    def release(self, zps: list[ZParam]) -> None:
        for zp in zps:
            if zp.refs <= 0:
                raise ZpsError("INTERNAL", f"parameter {zp.names[0]} released more than acquired")
            zp.refs -= 1
            if zp.refs == 0:
                zp.free()
                self.live_bytes -= zp.nbytes

    def hold_for_step(self, zp: ZParam) -> None:
        """Acquires `zp` until end_step (a read outside its module's forward)."""
        if not zp.step_hold:
            self.acquire([zp])
            if not zp.step_hold:
                zp.step_hold = True
            else:  # persistent: acquire already took the step hold
                self.release([zp])

    def _fill(self, zps):
        """Regrows and fills `zps` (none of them live); on error frees them again and raises."""
        for zp in zps:
            zp.regrow()
            self.live_bytes += zp.nbytes
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        try:
            self._fetch(zps)
        except BaseException:
            for zp in zps:
                zp.free()
                self.live_bytes -= zp.nbytes
            raise

    def _fetch(self, zps):
        if self.quant_block:
            self._drain_copies({zp.id for zp in zps})
            quantized = [zp for zp in zps if zp.param.is_cuda or self.host_staging]
            cpu = [zp for zp in zps if not zp.param.is_cuda and not self.host_staging]
            if cpu:  # dequantized by the C library, on the CPU
                self.client.fetch_into([zp.id for zp in cpu], [zp.param.data_ptr() for zp in cpu],
                                       [zp.dtype_code for zp in cpu])
            for zp in quantized:
                self._fetch_quantized(zp)
            return
        device = [zp for zp in zps if zp.param.is_cuda and self.cuda_backend]
        staged = [zp for zp in zps if (zp.param.is_cuda and not self.cuda_backend)
                  or (not zp.param.is_cuda and self.host_staging)]
        cpu = [zp for zp in zps if not zp.param.is_cuda and not self.host_staging]
        if device:
            self._fetch_device(device)
        if cpu:
            self.client.fetch_into([zp.id for zp in cpu], [zp.param.data_ptr() for zp in cpu],
                                   [zp.dtype_code for zp in cpu])
        for zp in staged:
            # Staged on the host, then copied on the current stream (the CUDA backend of the
            # collectives issue replaces this with pinned slots and a copy stream). The copy
            # goes into .data, a tensor with its own version counter: the parameter's is not
            # bumped. A copy from pageable memory returns once the host buffer has been read.
            ptr, nbytes = self.client.acquire(zp.id)
            try:
                src = host_view(ptr, nbytes, ZPS_TO_TORCH[self.serving_code])
                with torch.no_grad():
                    zp.param.data.copy_(src.view(zp.shape))
                if zp.param.is_cuda:
                    torch.cuda.current_stream(zp.param.device).synchronize()
            finally:
                self.client.release(zp.id)

    def _fetch_device(self, zps):
        """Through the CUDA backend: each parameter lands in a pinned slot (UCX receives into it)
        and is copied on the backend's copy stream, ordered against the current stream by
        events. A parameter whose dtype differs from the serving dtype lands in a temporary of
        the serving dtype and is cast on the current stream."""
        serving = ZPS_TO_TORCH[self.serving_code]
        stream = torch.cuda.current_stream(zps[0].param.device)
        direct, temps, ptrs = [], [], []
        for zp in zps:
            if zp.param.dtype == serving:
                ptrs.append(zp.param.data_ptr())
            else:
                t = torch.empty(zp.numel, dtype=serving, device=zp.param.device)
                temps.append((zp, t))
                ptrs.append(t.data_ptr())
            direct.append(zp)
        self.client.fetch_to_device([zp.id for zp in direct], ptrs, stream.cuda_stream)
        with torch.no_grad():
            for zp, t in temps:
                zp.param.data.copy_(t.view(zp.shape))

    def _fetch_quantized(self, zp):
        """The block records as fetched go to the parameter's device (from the CUDA backend's
        pinned slots: an asynchronous copy on the current stream) and are dequantized there,
        into the parameter's storage, by torch ops on that stream. The client's buffer is
        released once an event after them completed (on the CPU: at once)."""
        ptr, nbytes, pieces = self.client.acquire_quantized(zp.id)
        event = None
        try:
            records = host_view(ptr, nbytes, torch.uint8)
            if zp.param.is_cuda:
                records = records.to(zp.param.device, non_blocking=True)
            with torch.no_grad():
                dequantize_pieces(records, pieces, self.quant_block, zp.param.data.view(-1))
            if zp.param.is_cuda:
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(zp.param.device))
        finally:
            if event is None:
                self.client.release(zp.id)
        if event is not None:
            self.in_copy.append((event, zp.id))

    def _drain_copies(self, wait_for=()):
        """Releases the quantized buffers whose device copies completed; waits for those of
        `wait_for` (ids about to be acquired again) and, with wait_for None, for all."""
        pending = []
        for event, pid in self.in_copy:
            if wait_for is None or pid in wait_for:
                event.synchronize()
            elif not event.query():
                pending.append((event, pid))
                continue
            self.client.release(pid)
        self.in_copy = pending

    def end_step(self) -> None:
        """Releases every hold (the step is over)."""
        self.release_all()

    def release_all(self) -> None:
        self._drain_copies(None)
        for zp in self.zparams:
            zp.step_hold = False
            if zp.refs > 0:
                zp.refs = 1
                self.release([zp])


class GradientPusher:
    """The gradients of the step: each pushed once it is accumulated, a zero gradient for a
    trainable parameter that got none by the end of the step, and the pushes in flight bounded.
    Holds no parameter storage (Residency does). One training thread."""

    def __init__(self, client: _native.Client, zparams: list[ZParam], max_pending_pieces: int,
                 cuda_backend: bool = False, pre_reduced: bool = False) -> None:
        self.client = client
        # CUDA gradients pushed from device memory through the CUDA backend; False: copied to
        # the host first.
        self.cuda_backend = cuda_backend
        # Pre-reduced across ranks: the C API overwrites device gradients (reduce-scatter).
        self.client_pre_reduced = pre_reduced
        self.max_pending_pieces = max_pending_pieces
        self.zparams = zparams          # by id
        self.step = 0
        self.micro = 0          # micro-batch of the step (gradient accumulation)

    def on_accumulated(self, zp: ZParam) -> None:
        zp.accumulated += 1
        if zp.pushed:
            raise ZpsError("FAILED_PRECONDITION", f"parameter {zp.names[0]} got a second gradient "
                           "in one step after its first was pushed (a parameter used both inside "
                           "and outside a reentrant checkpoint?); use "
                           "torch.utils.checkpoint(..., use_reentrant=False)")
        self._push(zp)

    def _push(self, zp, zero=False):
        p = zp.param
        if zero:
            g = torch.zeros(zp.numel, dtype=torch.float32)
        else:
            g = p.grad.detach()
            if g.is_cuda and self.cuda_backend:
                self._push_device(zp, g)
                return
            if g.is_cuda:
                g = g.to("cpu", torch.float32)
            elif g.dtype != torch.float32:
                g = g.float()
            g = g.contiguous()
        self.client.push_grad(zp.id, self.step, g.data_ptr(), zp.numel, self.micro)
        self._await_pushes()
        zp.pushed = True
        p.grad = None

    def _await_pushes(self):
        """Backpressure on the pushes in flight. A push refused as a stale step (this rank
        re-joined a step that the servers then decided with its old process's pushes, the same
        bits: a torchrun restart) does not stop the backward pass: Engine.step() takes the
        servers' decision of the step instead."""
        try:
            self.client.await_pushes_below(self.max_pending_pieces)
        except ZpsError as e:
            if not stale_step(e):
                raise

    def _push_device(self, zp, g):
        """Through the CUDA backend: read on the copy stream into a pinned slot after the current
        stream's work, then pushed (pre-reduced: as fp32, into its bucket, which the buckets'
        reduce-scatter in their order, with NCCL or Gloo, then pushes)."""
        stream = torch.cuda.current_stream(g.device)
        if self.client_pre_reduced or g.dtype not in TORCH_TO_ZPS:
            g = g.float()
        g = g.contiguous()
        self.client.push_grad_device(zp.id, self.step, g.data_ptr(), TORCH_TO_ZPS[g.dtype],
                                     zp.numel, self.micro, stream.cuda_stream)
        self._await_pushes()
        zp.pushed = True
        zp.param.grad = None

    def end_step(self) -> None:
        """Pushes what is still unpushed (a zero gradient for trainable parameters that got none
        this step: the servers expect every byte); the next micro-batch starts with none
        pushed."""
        for zp in self.zparams:
            if zp.trainable and not zp.pushed:
                self._push(zp, zero=zp.param.grad is None)
        for zp in self.zparams:
            zp.accumulated = 0
            zp.pushed = False


class _PreBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hooks, module, *tensors):
        ctx.hooks, ctx.module = hooks, module
        return tuple(t.detach() for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ctx.hooks.pre_backward(ctx.module)
        return (None, None) + grads


def _map_tensors(obj, fn):
    """Applies fn to the list of tensors needing grad inside obj; returns obj rebuilt."""
    found = []

    def collect(o):
        if isinstance(o, torch.Tensor):
            if o.requires_grad:
                found.append(o)
        elif isinstance(o, (list, tuple)):
            for x in o:
                collect(x)
        elif isinstance(o, dict):
            for x in o.values():
                collect(x)

    collect(obj)
    if not found:
        return obj, False
    replaced = iter(fn(found))
    mapping = {id(t): next(replaced) for t in found}

    def rebuild(o):
        if isinstance(o, torch.Tensor):
            return mapping.get(id(o), o)
        if isinstance(o, tuple) and hasattr(o, "_fields"):  # namedtuple
            return type(o)(*[rebuild(x) for x in o])
        if isinstance(o, (list, tuple)):
            return type(o)(rebuild(x) for x in o)
        if isinstance(o, dict):
            out = type(o)() if type(o) is not dict else {}
            for k, v in o.items():
                out[k] = rebuild(v)
            return out
        return o

    return rebuild(obj), True


class HookSet:
    """The hooks installed on one model; remove() takes every one of them off."""

    def __init__(self, model: torch.nn.Module, residency: Residency, pusher: GradientPusher,
                 module_params: dict[torch.nn.Module, list[tuple[str, ZParam]]]) -> None:
        self.res = residency
        self.pusher = pusher
        self.module_params = module_params   # module -> [(name, ZParam)] of its own parameters
        self.handles = []
        self.bwd_held = {}                   # module -> number of backward acquires
        self.bwd_pending = {}                # module -> set of ZParam ids not yet accumulated
        self.owners = {}                     # ZParam id -> modules that own it
        for m, plist in module_params.items():
            for _, zp in plist:
                self.owners.setdefault(zp.id, []).append(m)
        self.swapped = []
        for m, plist in module_params.items():
            if not plist:
                continue
            self.handles.append(m.register_forward_pre_hook(self._pre_forward))
            self.handles.append(m.register_forward_hook(self._post_forward))
            self._swap_class(m)
        for zp in residency.zparams:
            if zp.trainable:
                acc = zp.acc_node
                self.handles.append(acc.register_hook(self._grad_hook(zp)))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        for m, cls in self.swapped:
            m.__class__ = cls
        self.swapped = []

    # ---- forward ----
    def _zps_of(self, module):
        plist = self.module_params[module]
        for name, zp in plist:
            zp.check_unchanged(module._parameters.get(name))
        if sum(p is not None for p in module._parameters.values()) != len(plist):
            raise ZpsError("FAILED_PRECONDITION", f"module {type(module).__name__} gained "
                           "parameters after zps.torch.initialize; the parameter set is fixed")
        return [zp for _, zp in plist]

    def _pre_forward(self, module, inputs):
        self.res.acquire(self._zps_of(module))

    def _post_forward(self, module, inputs, output):
        zps = [zp for _, zp in self.module_params[module]]
        wrapped = False
        if torch.is_grad_enabled() and any(zp.trainable for zp in zps):
            output, wrapped = _map_tensors(
                output, lambda ts: _PreBackward.apply(self, module, *ts))
            if not wrapped:
                # No output needs grad we can see: keep the parameters until the step ends, so
                # that a backward through them still finds their values.
                for zp in zps:
                    self.res.hold_for_step(zp)
        self.res.release(zps)
        return output

    # ---- backward ----
    def pre_backward(self, module):
        zps = [zp for _, zp in self.module_params[module]]
        self.res.acquire(zps)
        self.bwd_held[module] = self.bwd_held.get(module, 0) + 1
        self.bwd_pending[module] = {zp.id for zp in zps if zp.trainable and not zp.pushed}
        if not self.bwd_pending[module]:
            self._release_backward(module)

    def _release_backward(self, module):
        n = self.bwd_held.pop(module, 0)
        self.bwd_pending.pop(module, None)
        zps = [zp for _, zp in self.module_params[module]]
        for _ in range(n):
            self.res.release(zps)

    def _grad_hook(self, zp):
        def hook(grad_inputs, grad_outputs):
            self.pusher.on_accumulated(zp)
            for m in self.owners.get(zp.id, ()):
                pending = self.bwd_pending.get(m)
                if pending is not None:
                    pending.discard(zp.id)
                    if not pending:
                        self._release_backward(m)
        return hook

    def end_step(self):
        for m in list(self.bwd_held):
            self._release_backward(m)

    # ---- reads outside forward ----
    def _swap_class(self, module):
        cls = type(module)
        res = self.res
        by_param = res.by_param
        base_getattr = cls.__getattr__

        def __getattr__(self_, name):
            value = base_getattr(self_, name)
            if isinstance(value, torch.nn.Parameter):
                zp = by_param.get(id(value))
                if zp is not None and zp.refs == 0:
                    res.hold_for_step(zp)
            return value

        sub = type(cls.__name__, (cls,), {"__getattr__": __getattr__, "_zps_base_class": cls})
        module.__class__ = sub
        self.swapped.append((module, cls))
