"""The training-loop API: zps.torch.initialize(model, config) -> Engine.

    engine = zt.initialize(model, config)
    loss = loss_fn(engine(x), y)
    engine.backward(loss)        # or loss.backward()
    info = engine.step()         # the servers' commit

After initialize the model holds no parameter data: its Parameters keep identity and shape, the
values live on the shards, and hooks fetch them around each use (zps.torch.hooks).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
import warnings
from typing import Any, Iterable, Optional

import torch

from zps import _native
from zps._errors import ZpsError, stale_step
from zps.cluster import LocalCluster
from zps.torch import config as config_mod
from zps.torch import construct, weights
from zps.torch.hooks import GradientPusher, HookSet, Residency, host_staging
from zps.torch.params import ZParam, malloc_huge_pages_hint, resize_storage, storage_bytes

_SERVING = {"fp32": _native.F32, "fp16": _native.F16, "bf16": _native.BF16}

_log = logging.getLogger(__name__)

# torch.optim-style parameter groups: [{"params": [...], "lr": ..., "weight_decay": ...}].
ParamGroups = Optional[Iterable[dict[str, Any]]]


def _unique_params(model):
    """[(names, Parameter)] in registration order; a tied Parameter once, with all its names."""
    order, names = [], {}
    for mname, module in model.named_modules(remove_duplicate=False):
        for pname, p in module._parameters.items():
            if p is None:
                continue
            full = f"{mname}.{pname}" if mname else pname
            if id(p) not in names:
                names[id(p)] = []
                order.append(p)
            if full not in names[id(p)]:
                names[id(p)].append(full)
    return [(names[id(p)], p) for p in order]


def _dist_env():
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if not 0 <= rank < world:
        raise ZpsError("INVALID_ARGUMENT", f"RANK {rank} is not in [0, WORLD_SIZE {world})")
    return rank, world


def _groups_of(model_params, param_groups, cfg):
    """Per unique parameter: its (lr, weight_decay) group index, from torch.optim-style groups."""
    if not param_groups:
        return [0] * len(model_params), [(cfg.lr, cfg.weight_decay)]
    groups, index = [], {}
    for g in param_groups:
        if not isinstance(g, dict) or "params" not in g:
            raise ZpsError("INVALID_ARGUMENT", "param_groups must be dicts with 'params', as "
                           "for torch.optim")
        extra = set(g) - {"params", "lr", "weight_decay", "name"}
        if extra:
            raise ZpsError("INVALID_ARGUMENT", f"param group key {sorted(extra)[0]!r} is not a "
                           "zps option (groups have lr and weight_decay)")
        gi = len(groups)
        groups.append((float(g.get("lr", cfg.lr)), float(g.get("weight_decay", cfg.weight_decay))))
        for p in g["params"]:
            if id(p) in index:
                raise ZpsError("INVALID_ARGUMENT", "a parameter appears in two param groups")
            index[id(p)] = gi
    return [index.get(id(p), 0) for _, p in model_params], groups


class Engine:
    """One rank of a zps job training `module`. One training thread drives it."""

    module: torch.nn.Module
    config: config_mod.Config
    rank: int
    world: int
    global_step: int        # the step to train next (after a resume, the servers' step)
    loss_scale: float       # the fp16 loss scale backward() multiplies by
    last_checkpoint_step: int
    closed: bool

    def __init__(self, module: torch.nn.Module, config: config_mod.ConfigSource,
                 param_groups: ParamGroups = None,
                 init_from: str | os.PathLike[str] | None = None) -> None:
        if getattr(module, "_zps_engine", None) is not None:
            raise ZpsError("FAILED_PRECONDITION", "this module is already initialized with "
                           "zps.torch; call initialize once per module")
        self.module = module
        self.config = cfg = config_mod.load(config)
        if cfg.steps_per_print:
            _show_progress()
        self.rank, self.world = _dist_env()
        self.cluster = None
        self._checkpoint_thread = None
        self._checkpoint_result = None
        self.closed = False
        named = _unique_params(module)
        if not named:
            raise ZpsError("INVALID_ARGUMENT", "the module has no parameters")
        group_of, groups = _groups_of(named, param_groups, cfg)
        # Checked on every rank, before any server is started or contacted: a file that does not
        # fit the model fails the same way everywhere, with nothing uploaded.
        initial = weights.open_initial_weights(init_from, named, module)
        if initial is not None:
            named = weights.materialize_meta(module, named)
        for names, p in named:
            if p.device.type not in ("cpu", "cuda"):
                hint = " (a model built on the meta device needs init_from)" \
                    if p.device.type == "meta" else ""
                raise ZpsError("INVALID_ARGUMENT", f"parameter {names[0]} is on {p.device}; zps "
                               f"serves cpu and cuda parameters{hint}")
        cuda_device = self._cuda_device(cfg, named)
        # Quantized weights for CUDA parameters: the block records go to the GPU as fetched and
        # are dequantized there (zps/torch/dequant.py); CPU parameters are dequantized by the C
        # library either way.
        keep_quantized = cfg.quantized_weights and (
            host_staging() or any(p.device.type == "cuda" for _, p in named))
        # AccumulateGrad nodes must be made while the parameters have their full shape.
        zparams = []
        for i, (names, p) in enumerate(named):
            zp = ZParam(i, p, names)
            if p.requires_grad:
                empty = storage_bytes(p.data) == 0 and zp.nbytes > 0  # staged by zt.init
                if empty:  # expand_as checks the storage bounds; the bytes stay untouched
                    resize_storage(p.data, zp.nbytes)
                zp.acc_node = p.expand_as(p).grad_fn.next_functions[0][0]
                if empty:
                    resize_storage(p.data, 0)
            zparams.append(zp)
        self.zparams = zparams
        hint = malloc_huge_pages_hint(zparams)
        if hint and self.rank == 0:
            _log.info(hint)
        endpoint, token = self._endpoint(cfg, lambda: self._job(cfg, zparams, group_of, groups))
        try:
            if cfg.endpoint_given and not cfg.shards_given:  # the servers know their count
                cfg.shards = _native.cluster_shards(endpoint, token,
                                                    int(cfg.connect_timeout_s * 1000))
            self.job = self._job(cfg, zparams, group_of, groups)
            options = {"endpoint": endpoint, "token": token, "rank": self.rank,
                       "ucx_tls": cfg.ucx_tls,
                       "op_timeout_ms": int(cfg.op_timeout_s * 1000),
                       "connect_timeout_ms": int(cfg.connect_timeout_s * 1000),
                       "prefetch_bytes": cfg.prefetch_bytes, "max_live_bytes": cfg.max_live_bytes,
                       "reduction": cfg.reduction, "fetch_strategy": cfg.fetch_strategy,
                       "gloo_hostname": cfg.gloo_hostname,
                       "cuda_device": cuda_device, "collectives": cfg.collectives,
                       "keep_quantized": keep_quantized,
                       "grad_error_feedback": cfg.grad_error_feedback}
            # With an embedded cluster, a shard that stops is the error of the next call.
            self.client = _native.Client(json.dumps(options), json.dumps(self.job),
                                         watch=self.cluster)
        except BaseException:
            self._stop_cluster()
            raise
        info = self.client.info()
        self.global_step = info.resume_step
        self.loss_scale = info.loss_scale
        self.serving_code = info.serving_dtype
        staging = construct.staging_of(module)
        if info.resume_step == 0 and self.rank == 0:
            self._upload(zparams, staging, initial)
        if initial is not None:
            initial.load_buffers()
            initial.close()
        for zp in zparams:
            zp.free()
        if staging is not None:
            staging.close()
        by_param = {id(zp.param): zp for zp in zparams}
        # Pushes in flight are bounded to about prefetch_bytes of gradient copies.
        pieces = max(4, cfg.prefetch_bytes // (cfg.chunk_elems * 4) + 1)
        self.res = Residency(self.client, zparams, by_param, self.serving_code,
                             cfg.persistence_threshold, cuda_backend=cuda_device >= 0,
                             quant_block=info.quant_block if keep_quantized else 0)
        self.pusher = GradientPusher(
            self.client, zparams, pieces, cuda_backend=cuda_device >= 0,
            pre_reduced=cfg.reduction == "pre-reduced" and self.world > 1)
        self.pusher.step = self.global_step
        self.micro = 0
        module_params = collections.OrderedDict()
        for m in module.modules():
            module_params[m] = [(n, by_param[id(p)]) for n, p in m._parameters.items()
                                if p is not None]
        self.hooks = HookSet(module, self.res, self.pusher, module_params)
        self.client.begin_step(self.global_step)
        module._zps_engine = self
        self._t_last = time.monotonic()

    # ---- setup ----
    def _job(self, cfg, zparams, group_of, groups):
        """The job description for the C API: the job spec's JSON keys (docs/pytorch.md's table,
        generated from common/include/zps/common/job_spec.h, whose codec reads this document and
        fills in the defaults of keys left out): what config.load mapped from the user's config
        (cfg.job), and what only the engine knows (ranks, parameters, groups, frozen)."""
        k = cfg.gradient_accumulation_steps
        shard = {"reduction": cfg.reduction, "update": cfg.update, "world_size": self.world,
                 "grad_dtype": cfg.grad_dtype(), "serving_dtype": cfg.serving(),
                 "accumulation_steps": k}
        if len(groups) > 1 or groups[0] != (cfg.lr, cfg.weight_decay):
            shard["param_groups"] = [{"lr": lr, "weight_decay": wd} for lr, wd in groups]
            shard["param_group"] = group_of
        if any(not zp.trainable for zp in zparams):
            shard["frozen"] = [0 if zp.trainable else 1 for zp in zparams]
        if cfg.schedule.type:
            shard["lr_schedule"] = {"type": cfg.schedule.type, **cfg.schedule.params}
        return {
            "params": [{"name": zp.names[0], "shape": list(zp.shape) or [1]} for zp in zparams],
            "chunk_elems": cfg.chunk_elems,
            "num_shards": cfg.shards,
            "optimizer": dict(cfg.job["optimizer"]),
            "commit": {**cfg.job["commit"], "grad_divisor": float(self.world * k),
                       "dynamic_loss_scale": cfg.fp16},
            "shard": shard,
        }

    @staticmethod
    def _cuda_device(cfg, named):
        """The CUDA device whose parameters go through the CUDA backend (pinned slots, copy
        stream), or -1: no CUDA parameters, zps.cuda_backend "off", or (with "auto") a backend
        that cannot run here, where they are staged on the host as before."""
        devices = sorted({p.device.index if p.device.index is not None
                          else torch.cuda.current_device()
                          for _, p in named if p.device.type == "cuda"})
        if not devices or cfg.cuda_backend == "off":
            return -1
        if len(devices) > 1:
            raise ZpsError("INVALID_ARGUMENT", f"parameters on CUDA devices {devices}; zps.torch "
                           "serves one device per rank")
        err = _native.cuda_available(devices[0])
        if err is not None:
            if cfg.cuda_backend == "on":
                raise err
            warnings.warn(f"zps.torch: the CUDA backend is not available ({err}); CUDA "
                          "parameters are staged on the host")
            return -1
        return devices[0]

    def _endpoint(self, cfg, job_of):
        endpoint = cfg.endpoint or os.environ.get("ZPS_ENDPOINT", "")
        cfg.endpoint_given = bool(endpoint)
        if endpoint:
            token = os.environ.get("ZPS_TOKEN", "")
            token_file = cfg.token_file or os.environ.get("ZPS_TOKEN_FILE", "")
            if token_file:
                try:
                    with open(token_file) as f:
                        token = f.read().strip()
                except OSError as e:
                    raise ZpsError("INVALID_ARGUMENT", f"zps.token_file {token_file}: {e}") from None
            if not token:
                raise ZpsError("INVALID_ARGUMENT", "an endpoint needs a token (zps.token_file, "
                               "ZPS_TOKEN_FILE or ZPS_TOKEN)")
            return endpoint, token
        # No endpoint: an embedded local cluster, started by rank 0 and shared with the others
        # through torch.distributed (torchrun's environment).
        if self.rank == 0:
            # A budget no shard could start with is refused here, with the shards' own advice.
            _native.check_memory_budget(json.dumps(job_of()), cfg.memory_budget)
            self.cluster = LocalCluster(
                shards=cfg.shards, ucx_tls=cfg.ucx_tls, memory_budget=cfg.memory_budget,
                serving_budget=cfg.serving_budget, checkpoint_every=cfg.checkpoint_every,
                data_dir=cfg.data_dir or None, keep_dir=cfg.keep_cluster_dir,
                threads=cfg.server_threads, serving_copies=cfg.serving_copies)
            shared = [self.cluster.endpoint, self.cluster.token]
        else:
            shared = [None, None]
        if self.world > 1:
            import torch.distributed as dist
            if not dist.is_initialized():
                dist.init_process_group("gloo")
            dist.broadcast_object_list(shared, src=0)
        return shared[0], shared[1]

    def _upload(self, zparams, staging, initial):
        """Rank 0 of a new job: the initial values (from init_from's files when given, else the
        module's, from the zt.init staging file for parameters built inside zt.init), at most
        about 256 MiB in flight."""
        in_flight = 0
        for zp in zparams:
            if initial is not None:
                values = initial.param_f32(zp.id)
            elif staging is not None and staging.is_staged(zp.param):
                values = torch.empty(zp.shape, dtype=torch.float32)
                staging.read_f32(zp.param, values)
            else:
                values = zp.param.detach()
                if values.is_cuda or values.dtype != torch.float32:
                    values = values.to("cpu", torch.float32)
                values = values.contiguous()
            self.client.push_initial(zp.id, values.data_ptr(), zp.numel)
            in_flight += zp.numel * 4
            if in_flight >= 256 << 20:
                self.client.flush()
                in_flight = 0
        self.client.flush()

    def _stop_cluster(self):
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None

    # ---- the loop ----
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    forward = __call__

    def backward(self, loss: torch.Tensor) -> None:
        """loss.backward(), scaled by the fp16 loss scale when fp16 is on."""
        if self.config.fp16:
            loss = loss * self.loss_scale
        loss.backward()

    def is_gradient_accumulation_boundary(self) -> bool:
        return self.micro + 1 == self.config.gradient_accumulation_steps

    def step(self) -> dict[str, Any]:
        """Ends this rank's micro-batch. At a gradient accumulation boundary (every call when
        gradient_accumulation_steps is 1) it waits for the servers' commit and moves to the next
        step, returning a dict: step, skipped, grad_norm, loss_scale, grad_scale,
        optimizer_step, checkpoint, boundary. Between boundaries it returns {"step",
        "boundary": False} once this micro-batch's gradients are on their way."""
        self.hooks.end_step()
        self.pusher.end_step()
        self.res.end_step()
        if not self.is_gradient_accumulation_boundary():
            self.micro += 1
            self.pusher.micro = self.micro
            return {"step": self.global_step, "boundary": False}
        self.micro = 0
        self.pusher.micro = 0
        # This rank's fetches of the step are over: bandwidth-centric, it takes part in the
        # all-gathers it skipped and agrees on the next step's plan, before waiting on anything
        # that needs the other ranks' backward (their gradients' collectives, the commit).
        self.client.end_step()
        try:
            self.client.flush()
        except ZpsError as e:
            # A rank that re-joined the step in progress (a torchrun restart) may find it
            # decided meanwhile with its old process's pushes (the same bits): its own copies
            # are refused as stale, and the decision below is the step's.
            if not stale_step(e):
                raise
            _log.warning("zps.torch rank %d: step %d was decided with this rank's earlier "
                         "pushes (its process before a restart); taking the decision",
                         self.rank, self.global_step)
        info = self.client.await_commit(self.global_step)
        out = {"step": info.step, "skipped": bool(info.skip), "grad_norm": info.global_norm,
               "loss_scale": info.loss_scale, "grad_scale": info.grad_scale,
               "optimizer_step": info.optimizer_step, "checkpoint": bool(info.checkpoint),
               "boundary": True}
        self.loss_scale = info.next_loss_scale
        self.global_step += 1
        self.pusher.step = self.global_step
        self.client.begin_step(self.global_step)
        # The step that carries a checkpoint returns once it is durable on every shard (as
        # documented); other steps only collect a result that is already there.
        self._finish_checkpoint(wait=bool(info.checkpoint))
        if self.config.steps_per_print and self.global_step % self.config.steps_per_print == 0:
            now = time.monotonic()
            _log.info("zps.torch rank %d: step %d grad_norm %.4g resident %d B (%.2f s since "
                      "last print)", self.rank, info.step, info.global_norm,
                      self.resident_param_bytes(), now - self._t_last)
            self._t_last = now
        return out

    # ---- state ----
    def resident_param_bytes(self) -> int:
        """Parameter bytes this process holds now: the parameters' live storage plus the
        fetched buffers the prefetcher keeps (<= zps.max_live_bytes)."""
        return self.res.live_bytes + self.client.stats().live_bytes

    def stats(self) -> dict[str, int]:
        s = self.client.stats()
        return {k: getattr(s, k) for k, _ in s._fields_} | {
            "param_live_bytes": self.res.live_bytes,
            "param_peak_live_bytes": self.res.peak_live_bytes}

    def state_dict(self) -> collections.OrderedDict[str, torch.Tensor]:
        """Full weights read from the servers, under exactly the keys of module.state_dict()
        (buffers from the worker, a tied parameter under each of its names): the shards' fp32
        masters at the current step, whatever the serving dtype, cast to each parameter's
        dtype."""
        out = collections.OrderedDict()
        values = {}
        for key, t in self.module.state_dict(keep_vars=True).items():
            zp = self.res.by_param.get(id(t))
            if zp is None:
                out[key] = t.detach().clone()
                continue
            if zp.id not in values:
                v = torch.empty(zp.shape, dtype=torch.float32)
                self.client.read_master(zp.id, self.global_step, v.data_ptr())
                values[zp.id] = v.to(zp.param.dtype)
            out[key] = values[zp.id]
        return out

    def save_checkpoint(self, wait_timeout_s: float = 600.0) -> None:
        """Asks the servers for a checkpoint at the end of the step in progress (the next
        engine.step()), durable on every shard once that step is committed. Returns at once; the
        next step() waits for it and raises if it failed. Needs shards with a data dir
        (zps.data_dir for the embedded cluster)."""
        if self._checkpoint_thread is not None:
            raise ZpsError("FAILED_PRECONDITION", "a checkpoint is already pending")
        result = {}

        def run():
            try:
                result["step"] = self.client.checkpoint_now(int(wait_timeout_s * 1000))
            except ZpsError as e:
                result["error"] = e

        waiting = self.client.shard_status(0).get("checkpoint_waiters", 0)
        self._checkpoint_result = result
        self._checkpoint_thread = threading.Thread(target=run, name="zps-checkpoint", daemon=True)
        self._checkpoint_thread.start()
        # Return once the coordinator holds the request, so that it is for this step for sure
        # (the step may commit as soon as its gradients are in, before step() is called).
        deadline = time.monotonic() + self.config.op_timeout_s
        while self._checkpoint_thread.is_alive() and time.monotonic() < deadline:
            if self.client.shard_status(0).get("checkpoint_waiters", 0) > waiting:
                return
            time.sleep(0.002)
        if not self._checkpoint_thread.is_alive() and "error" in result:
            self._checkpoint_thread = None
            raise result["error"]

    def _finish_checkpoint(self, wait):
        t = self._checkpoint_thread
        if t is None:
            return None
        t.join(timeout=self.config.op_timeout_s if wait else 0.0)
        if t.is_alive():
            if wait:
                raise ZpsError("DEADLINE_EXCEEDED", "the checkpoint of this step was not durable "
                               f"on every shard within zps.op_timeout_s ({self.config.op_timeout_s} s)")
            return None
        self._checkpoint_thread = None
        result = self._checkpoint_result
        if "error" in result:
            raise result["error"]
        self.last_checkpoint_step = result["step"]
        return result["step"]

    def close(self) -> None:
        """Restores the module's class and hooks (its parameters stay released), leaves the job,
        and stops the embedded cluster if this rank started one."""
        if self.closed:
            return
        self.closed = True
        self.hooks.remove()
        self.client.close()
        self._stop_cluster()
        self.module._zps_engine = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def initialize(model: torch.nn.Module, config: config_mod.ConfigSource = None,
               param_groups: ParamGroups = None, model_parameters: ParamGroups = None,
               init_from: str | os.PathLike[str] | None = None) -> Engine:
    """Puts `model`'s parameters on zps and returns the Engine that trains it.

    config: a dict or the path of a JSON file, in DeepSpeed's key names (docs/pytorch.md).
    param_groups / model_parameters: torch.optim-style groups ([{"params", "lr",
    "weight_decay"}]) for per-group lr and weight decay.
    init_from: a new job's initial weights from safetensors instead of the module's values: a
    .safetensors file (`zps-ckpt export`), or a Hugging Face-style sharded set (its directory or
    its model.safetensors.index.json); zps.torch.weights has the rules. Every rank checks it
    (so it must be readable on every rank); a job that resumes from the servers' state ignores
    its values.
    Raises ZpsError: INVALID_ARGUMENT (config, dtypes), UNAVAILABLE (servers unreachable),
    UNAUTHENTICATED (token), FAILED_PRECONDITION (initialized twice, another job's spec);
    WeightsMismatch (init_from does not fit the model), NOT_FOUND and DATA_LOSS (its files).
    """
    return Engine(model, config, param_groups if param_groups is not None else model_parameters,
                  init_from=init_from)


def _show_progress() -> None:
    """steps_per_print asks for progress lines, logged at INFO: where the application set no
    level for the "zps" loggers, INFO is theirs from now on (the application's own level on
    "zps" wins)."""
    top = logging.getLogger("zps")
    if top.level == logging.NOTSET:
        top.setLevel(logging.INFO)
