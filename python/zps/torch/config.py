"""DeepSpeed-style JSON config for zps.torch.

Keys that zps shares with DeepSpeed have DeepSpeed's names and meaning; what is zps's own lives in
the "zps" section. A key zps does not have is an error naming it: nothing is silently ignored
(docs/pytorch.md, "Config").
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Union

from zps._errors import ZpsError

# Every default of the config, once, by key path (DeepSpeed's names; "zps." for zps's own). The
# Config fields below take theirs from here, and load() fills an absent key from here: nothing
# else in the package repeats a default.
DEFAULTS: dict[str, Any] = {
    "optimizer.type": "AdamW",
    "optimizer.params.lr": 1e-3,
    "optimizer.params.betas": (0.9, 0.999),
    "optimizer.params.eps": 1e-8,
    "optimizer.params.weight_decay": 0.0,
    "optimizer.params.momentum": 0.0,
    "optimizer.params.nesterov": False,
    "optimizer.params.bias_correction": True,
    "optimizer.params.adam_w_mode": True,
    "optimizer.params.torch_adam": False,
    "scheduler.type": "",
    "gradient_clipping": 0.0,
    "fp16.enabled": False,
    "fp16.loss_scale": 0.0,
    "fp16.initial_scale_power": 16,
    "fp16.loss_scale_window": 1000,
    "fp16.hysteresis": 1,
    "fp16.min_loss_scale": 1.0,
    "bf16.enabled": False,
    "bf16.bf16_optimizer_states": False,
    "bf16.bf16_master_weights_and_grads": False,
    "gradient_accumulation_steps": 1,
    "train_micro_batch_size_per_gpu": 0,
    "train_batch_size": 0,
    "steps_per_print": 0,
    "zero_optimization.stage": 3,
    "zero_optimization.stage3_prefetch_bucket_size": 0,
    "zero_optimization.stage3_max_live_parameters": 0,
    "zero_optimization.stage3_param_persistence_threshold": 100000,
    "zero_optimization.zero_quantized_gradients": False,
    "zero_optimization.zero_quantized_weights": False,
    "zps.endpoint": "",
    "zps.token_file": "",
    "zps.shards": 2,
    "zps.ucx_tls": "",
    "zps.reduction": "server-sum",
    "zps.fetch_strategy": "direct",
    "zps.update": "sync",
    "zps.gloo_hostname": "",
    "zps.cuda_backend": "auto",
    "zps.collectives": "auto",
    "zps.serving_dtype": "",
    "zps.state_dtype": "fp32",
    "zps.quantized_grads": "",
    "zps.grad_error_feedback": True,
    "zps.max_live_bytes": 1 << 30,
    "zps.prefetch_bytes": 256 << 20,
    "zps.memory_budget": 0,
    "zps.serving_budget": 0,
    "zps.serving_copies": "stored",
    "zps.data_dir": "",
    "zps.keep_cluster_dir": False,
    "zps.checkpoint_every": 0,
    "zps.chunk_elems": 1 << 22,
    "zps.op_timeout_s": 300.0,
    "zps.connect_timeout_s": 60.0,
    "zps.server_threads": 0,
}

_OPTIMIZERS = {"adamw": "adamw", "adam": "adam", "sgd": "sgd"}

ConfigSource = Union[dict, str, "os.PathLike[str]", None]
"""What initialize and init take as a config: a dict, the path of a JSON file, or None."""


def _bad(path, why):
    return ZpsError("INVALID_ARGUMENT", f"config {path}: {why}")


class _Section:
    """One JSON object: typed getters that record the keys read; finish() rejects the rest.
    An absent key reads as its default in DEFAULTS."""

    def __init__(self, obj, path):
        if not isinstance(obj, dict):
            raise _bad(path, "must be a JSON object")
        self.obj, self.path, self.seen = obj, path, set()

    def has(self, key):
        return key in self.obj

    def get(self, key, kind, lo=None, hi=None, choices=None):
        self.seen.add(key)
        where = f"{self.path}.{key}"
        if key not in self.obj or self.obj[key] is None:
            return None if kind is dict else DEFAULTS[where.removeprefix("config.")]
        v = self.obj[key]
        if kind is bool:
            if not isinstance(v, bool):
                raise _bad(where, f"must be true or false, got {v!r}")
            return v
        if kind in (int, float):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise _bad(where, f"must be a number, got {v!r}")
            if kind is int and float(v) != int(v):
                raise _bad(where, f"must be an integer, got {v!r}")
            v = kind(v)
            if not math.isfinite(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
                raise _bad(where, f"{v!r} is out of range [{lo}, {hi}]")
            return v
        if kind is str:
            if not isinstance(v, str):
                raise _bad(where, f"must be a string, got {v!r}")
            if choices is not None and v not in choices:
                raise _bad(where, f"must be one of {', '.join(choices)}, got {v!r}")
            return v
        if kind is list:
            if not isinstance(v, (list, tuple)):
                raise _bad(where, f"must be a list, got {v!r}")
            return list(v)
        if kind is dict:
            return _Section(v, where)
        raise AssertionError(kind)

    def finish(self):
        extra = sorted(set(self.obj) - self.seen)
        if extra:
            raise ZpsError("INVALID_ARGUMENT", f"config key {self.path}.{extra[0]} is not a zps "
                           "option (docs/pytorch.md lists the keys zps reads)")


@dataclass
class Schedule:
    type: str = DEFAULTS["scheduler.type"]  # "", WarmupLR, WarmupDecayLR, WarmupCosineLR
    params: dict = field(default_factory=dict)


_D = DEFAULTS


@dataclass
class Config:
    """The parsed config. Each field's default is its key's entry in DEFAULTS."""
    # optimizer
    optimizer: str = _OPTIMIZERS[_D["optimizer.type"].lower()]  # adamw, adam (L2), sgd
    lr: float = _D["optimizer.params.lr"]
    betas: tuple = _D["optimizer.params.betas"]
    eps: float = _D["optimizer.params.eps"]
    weight_decay: float = _D["optimizer.params.weight_decay"]
    momentum: float = _D["optimizer.params.momentum"]
    nesterov: bool = _D["optimizer.params.nesterov"]
    bias_correction: bool = _D["optimizer.params.bias_correction"]
    schedule: Schedule = field(default_factory=Schedule)
    gradient_clipping: float = _D["gradient_clipping"]
    # precision
    fp16: bool = _D["fp16.enabled"]
    dynamic_loss_scale: bool = True
    initial_loss_scale: float = 2.0 ** _D["fp16.initial_scale_power"]
    loss_scale_window: int = _D["fp16.loss_scale_window"]
    min_loss_scale: float = _D["fp16.min_loss_scale"]
    bf16: bool = _D["bf16.enabled"]
    # batching
    gradient_accumulation_steps: int = _D["gradient_accumulation_steps"]
    train_micro_batch_size_per_gpu: int = _D["train_micro_batch_size_per_gpu"]
    train_batch_size: int = _D["train_batch_size"]
    steps_per_print: int = _D["steps_per_print"]
    # zero_optimization (DeepSpeed counts elements)
    prefetch_elems: int = _D["zero_optimization.stage3_prefetch_bucket_size"]
    max_live_elems: int = _D["zero_optimization.stage3_max_live_parameters"]
    persistence_threshold: int = _D["zero_optimization.stage3_param_persistence_threshold"]
    # Block-quantized gradient pushes with error feedback (docs/data-plane.md): "" = off, "int8"
    # (what zero_quantized_gradients: true means) or "int4" (zps.quantized_grads).
    quantized_grads: str = _D["zps.quantized_grads"]
    # Testing only: false quantizes every gradient push on its own, without the residual of the
    # last (the worker's grad_error_feedback; zps-train's --grad-error-feedback=false), to show
    # what the feedback is for. No effect without quantized gradients.
    grad_error_feedback: bool = _D["zps.grad_error_feedback"]
    # The shards serve an int8 block-quantized copy of the weights, which the workers dequantize
    # into fp32 buffers (docs/data-plane.md "Quantized weights").
    quantized_weights: bool = _D["zero_optimization.zero_quantized_weights"]
    # zps
    endpoint: str = _D["zps.endpoint"]
    token_file: str = _D["zps.token_file"]
    shards: int = _D["zps.shards"]
    ucx_tls: str = _D["zps.ucx_tls"]
    reduction: str = _D["zps.reduction"]  # or pre-reduced: the ranks reduce-scatter (Gloo) first
    fetch_strategy: str = _D["zps.fetch_strategy"]  # or bandwidth-centric: a slice, all-gather
    update: str = _D["zps.update"]  # or speculative: the shards update each chunk as soon as its
                                    # gradient is complete (bit-identical to sync)
    gloo_hostname: str = _D["zps.gloo_hostname"]
    cuda_backend: str = _D["zps.cuda_backend"]  # CUDA parameters: auto (the backend where it
                                                # loads), on, off
    collectives: str = _D["zps.collectives"]  # pre-reduced device gradients: auto (NCCL), gloo,
                                              # nccl
    serving_dtype: str = _D["zps.serving_dtype"]  # "" = from fp16/bf16 (fp16, bf16), else bf16
    # The optimizer's moments on the servers (fp32, bf16 or int8; the master stays fp32).
    state_dtype: str = _D["zps.state_dtype"]
    max_live_bytes: int = _D["zps.max_live_bytes"]
    prefetch_bytes: int = _D["zps.prefetch_bytes"]
    memory_budget: int = _D["zps.memory_budget"]
    serving_budget: int = _D["zps.serving_budget"]
    serving_copies: str = _D["zps.serving_copies"]
    data_dir: str = _D["zps.data_dir"]
    keep_cluster_dir: bool = _D["zps.keep_cluster_dir"]  # keep the embedded cluster's temporary
                                                         # directory at a clean close() too
    checkpoint_every: int = _D["zps.checkpoint_every"]
    chunk_elems: int = _D["zps.chunk_elems"]
    op_timeout_s: float = _D["zps.op_timeout_s"]
    connect_timeout_s: float = _D["zps.connect_timeout_s"]
    server_threads: int = _D["zps.server_threads"]
    shards_given: bool = False
    endpoint_given: bool = False
    # What the user's config sets of the job description's "optimizer" and "commit" sections,
    # under the job spec's own keys (common/include/zps/common/job_spec.h; docs/pytorch.md has
    # the generated table). Each DeepSpeed key is mapped where it is read, below; a key left out
    # keeps the job spec's default, which the native codec fills in.
    job: dict = field(default_factory=lambda: {"optimizer": {}, "commit": {}})

    def serving(self) -> str:
        if self.quantized_weights:
            return "int8-block"  # the job spec's name of the DType
        if self.serving_dtype:
            return self.serving_dtype
        return "fp16" if self.fp16 else "bf16"

    def grad_dtype(self) -> str:
        if self.quantized_grads:
            return self.quantized_grads + "-block"  # the job spec's name of the DType
        return "fp16" if self.fp16 else "fp32"


_SCHEDULE_KEYS = {
    "WarmupLR": {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                 "last_batch_iteration"},
    "WarmupDecayLR": {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                      "total_num_steps", "last_batch_iteration"},
    "WarmupCosineLR": {"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
                       "cos_min_ratio", "warmup_type", "last_batch_iteration"},
}


def load(config: ConfigSource) -> Config:
    """Parses `config` (a dict, or the path of a JSON file) into a Config. Raises ZpsError."""
    if isinstance(config, (str, os.PathLike)):
        try:
            with open(config) as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise ZpsError("INVALID_ARGUMENT", f"config file {config}: {e}") from None
    if config is None:
        config = {}
    root = _Section(config, "config")
    c = Config()

    opt = root.get("optimizer", dict)
    if opt is not None:
        kind = opt.get("type", str)
        if kind.lower() not in _OPTIMIZERS:
            raise _bad("optimizer.type", f"zps has Adam, AdamW and SGD, not {kind!r}")
        params = opt.get("params", dict) or _Section({}, "config.optimizer.params")
        c.lr = params.get("lr", float, 0.0)
        c.weight_decay = params.get("weight_decay", float, 0.0)
        c.optimizer = _OPTIMIZERS[kind.lower()]
        job_opt = c.job["optimizer"]
        job_opt.update(lr=c.lr, weight_decay=c.weight_decay)
        if c.optimizer == "sgd":
            c.momentum = params.get("momentum", float, 0.0, 0.999999)
            c.nesterov = params.get("nesterov", bool)
            job_opt.update(momentum=c.momentum, nesterov=c.nesterov)
        else:
            betas = params.get("betas", list)
            if len(betas) != 2 or not all(isinstance(b, (int, float)) for b in betas):
                raise _bad("optimizer.params.betas", f"must be two numbers, got {betas!r}")
            c.betas = (float(betas[0]), float(betas[1]))
            c.eps = params.get("eps", float, 0.0)
            c.bias_correction = params.get("bias_correction", bool)
            # DeepSpeed's "Adam" is decoupled (AdamW) unless adam_w_mode is false.
            if c.optimizer == "adam" and params.get("adam_w_mode", bool):
                c.optimizer = "adamw"
            params.get("torch_adam", bool)  # same update either way on the servers
            job_opt.update(beta1=c.betas[0], beta2=c.betas[1], eps=c.eps,
                           bias_correction=c.bias_correction)
        job_opt["type"] = c.optimizer
        params.finish()
        opt.finish()

    sch = root.get("scheduler", dict)
    if sch is not None:
        kind = sch.get("type", str, choices=sorted(_SCHEDULE_KEYS))
        params = sch.get("params", dict) or _Section({}, "config.scheduler.params")
        for key in params.obj:
            if key not in _SCHEDULE_KEYS[kind]:
                raise ZpsError("INVALID_ARGUMENT", f"config key config.scheduler.params.{key} is "
                               f"not a parameter of {kind}")
            params.seen.add(key)
        if params.obj.get("last_batch_iteration", -1) != -1:
            raise _bad("scheduler.params.last_batch_iteration",
                       "zps resumes the schedule from the servers' step; leave it at -1")
        c.schedule = Schedule(kind, {k: v for k, v in params.obj.items()
                                     if k != "last_batch_iteration"})
        sch.finish()

    c.gradient_clipping = root.get("gradient_clipping", float, 0.0)
    c.job["commit"]["max_grad_norm"] = c.gradient_clipping

    fp16 = root.get("fp16", dict)
    if fp16 is not None:
        c.fp16 = fp16.get("enabled", bool)
        scale = fp16.get("loss_scale", float, 0.0)
        if scale != 0.0:
            raise _bad("fp16.loss_scale", "zps scales dynamically (0); a static scale is not "
                       "a zps option")
        c.initial_loss_scale = 2.0 ** fp16.get("initial_scale_power", int, 0, 60)
        c.loss_scale_window = fp16.get("loss_scale_window", int, 1)
        hysteresis = fp16.get("hysteresis", int, 1)
        if hysteresis != 1:
            raise _bad("fp16.hysteresis", "zps lowers the scale at the first overflow (1); "
                       f"hysteresis {hysteresis} is not a zps option")
        c.min_loss_scale = fp16.get("min_loss_scale", float, 0.0)
        c.job["commit"].update(initial_loss_scale=c.initial_loss_scale,
                               scale_window=c.loss_scale_window, min_loss_scale=c.min_loss_scale)
        fp16.finish()
    bf16 = root.get("bf16", dict)
    bf16_states = False
    if bf16 is not None:
        c.bf16 = bf16.get("enabled", bool)
        # DeepSpeed's bf16 optimizer states are zps's bf16 state dtype. Its bf16 master weights
        # have no zps counterpart: the servers always keep the fp32 master.
        bf16_states = bf16.get("bf16_optimizer_states", bool)
        if bf16.get("bf16_master_weights_and_grads", bool):
            raise _bad("bf16.bf16_master_weights_and_grads",
                       "zps keeps fp32 master weights on its servers; compact the optimizer "
                       "state instead (bf16.bf16_optimizer_states, or zps.state_dtype bf16 or "
                       "int8)")
        bf16.finish()
    if c.fp16 and c.bf16:
        raise _bad("fp16.enabled", "fp16 and bf16 cannot both be enabled")

    c.gradient_accumulation_steps = root.get("gradient_accumulation_steps", int, 1, 1 << 16)
    c.train_micro_batch_size_per_gpu = root.get("train_micro_batch_size_per_gpu", int, 0)
    c.train_batch_size = root.get("train_batch_size", int, 0)
    c.steps_per_print = root.get("steps_per_print", int, 0)

    zero = root.get("zero_optimization", dict)
    if zero is not None:
        stage = zero.get("stage", int)
        if stage != 3:
            raise _bad("zero_optimization.stage", f"zps partitions like ZeRO stage 3, not {stage}")
        c.prefetch_elems = zero.get("stage3_prefetch_bucket_size", int, 0)
        c.max_live_elems = zero.get("stage3_max_live_parameters", int, 0)
        c.persistence_threshold = zero.get("stage3_param_persistence_threshold", int, 0)
        if zero.get("zero_quantized_gradients", bool):
            c.quantized_grads = "int8"
        c.quantized_weights = bool(zero.get("zero_quantized_weights", bool))
        zero.finish()

    z = root.get("zps", dict)
    if z is not None:
        c.endpoint = z.get("endpoint", str)
        c.token_file = z.get("token_file", str)
        c.shards_given = z.has("shards")
        c.shards = z.get("shards", int, 1, 256)
        c.ucx_tls = z.get("ucx_tls", str)
        c.reduction = z.get("reduction", str, choices=["server-sum", "pre-reduced"])
        c.fetch_strategy = z.get("fetch_strategy", str, choices=["direct", "bandwidth-centric"])
        c.update = z.get("update", str, choices=["sync", "speculative"])
        c.gloo_hostname = z.get("gloo_hostname", str)
        c.cuda_backend = z.get("cuda_backend", str, choices=["auto", "on", "off"])
        c.collectives = z.get("collectives", str, choices=["auto", "gloo", "nccl"])
        c.serving_dtype = z.get("serving_dtype", str, choices=["bf16", "fp16", "fp32"])
        if c.serving_dtype and c.quantized_weights:
            raise _bad("zps.serving_dtype", f"{c.serving_dtype!r} contradicts "
                       "zero_optimization.zero_quantized_weights: true")
        c.state_dtype = z.get("state_dtype", str, choices=["fp32", "bf16", "int8"])
        if z.has("quantized_grads"):
            q = z.get("quantized_grads", str, choices=["off", "int8", "int4"])
            if q == "off" and c.quantized_grads:
                raise _bad("zps.quantized_grads", "'off' contradicts "
                           "zero_optimization.zero_quantized_gradients: true")
            c.quantized_grads = "" if q == "off" else q
        c.grad_error_feedback = z.get("grad_error_feedback", bool)
        if bf16_states and z.has("state_dtype") and c.state_dtype != "bf16":
            raise _bad("zps.state_dtype", f"{c.state_dtype!r} contradicts "
                       "bf16.bf16_optimizer_states (bf16 state)")
        c.max_live_bytes = z.get("max_live_bytes", int, 0)
        c.prefetch_bytes = z.get("prefetch_bytes", int, 0)
        c.memory_budget = z.get("memory_budget", int, 0)
        c.serving_budget = z.get("serving_budget", int, 0)
        c.serving_copies = z.get("serving_copies", str, choices=["stored", "on-fetch"])
        if c.serving_copies == "on-fetch" and c.serving_budget:
            raise _bad("zps.serving_copies", "'on-fetch' keeps no serving copies, so there is "
                       "nothing for zps.serving_budget to hold: drop one of them")
        c.data_dir = z.get("data_dir", str)
        c.keep_cluster_dir = z.get("keep_cluster_dir", bool)
        c.checkpoint_every = z.get("checkpoint_every", int, 0)
        c.chunk_elems = z.get("chunk_elems", int, 64)
        c.op_timeout_s = z.get("op_timeout_s", float, 0.001)
        c.connect_timeout_s = z.get("connect_timeout_s", float, 0.001)
        c.server_threads = z.get("server_threads", int, 0)
        z.finish()
    root.finish()
    if bf16_states:
        c.state_dtype = "bf16"
    if bf16_states or (z is not None and z.has("state_dtype")):
        c.job["optimizer"]["state_dtype"] = c.state_dtype

    if c.chunk_elems % 64:
        raise _bad("zps.chunk_elems", "must be a multiple of 64")
    # DeepSpeed counts the prefetch and live-parameter budgets in elements.
    # Quantized weights are dequantized into fp32 buffers on the workers for CPU parameters
    # (CUDA parameters keep the block records, about 1 byte an element: the byte budgets made
    # from elements here then hold more of them).
    esize = 4 if c.serving() in ("fp32", "int8-block") else 2
    if c.prefetch_elems:
        c.prefetch_bytes = c.prefetch_elems * esize
    if c.max_live_elems:
        c.max_live_bytes = c.max_live_elems * esize
    return c
