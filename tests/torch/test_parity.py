"""Parity: an unmodified model trained through zps for 50 steps ends with the parameters plain
PyTorch reaches (torch.optim.AdamW + clip_grad_norm_ + LambdaLR), with fp32 serving copies,
AdamW, clipping on, a warmup-cosine schedule (DeepSpeed's WarmupCosineLR) and weight decay 0 on
biases and norms.

The tolerance is justified against the exact trajectory: the same training in float64 is the
reference, and zps must be as close to it as torch's own float32 run is (within a factor 4 of
torch-fp32's largest deviation). The two fp32 runs differ only in rounding order (the servers'
fused AVX kernel against torch's ops, and the order of the global-norm sum)."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zps.torch as zt

STEPS, W, T = 50, 10, 50
LR, WD, CLIP, COS_MIN = 3e-3, 0.1, 1.6, 0.1


def ratio(i):
    """DeepSpeed's WarmupCosineLR ratio at scheduler iteration i (docs/optimizer.md)."""
    if i < 0:
        return 0.0
    if i < W:
        return 0.0 + (i / W) * (1.0 - 0.0)                    # linear warmup, min ratio 0
    progress = min(1.0, (i - W + 1) / max(1, T - W))
    return max(0.0, COS_MIN + (1.0 - COS_MIN) * ((1 + math.cos(math.pi * progress)) / 2))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(12, 48)
        self.norm = nn.LayerNorm(48)
        self.mid = nn.Linear(48, 48)
        self.out = nn.Linear(48, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.mid(F.gelu(self.norm(self.inp(x))))))


def groups(model):
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (n.endswith("weight") and "norm" not in n)]
    return [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}]


def data():
    g = torch.Generator().manual_seed(7)
    w = torch.randn(12, 3, generator=g)
    out = []
    for _ in range(STEPS):
        x = torch.randn(32, 12, generator=g)
        out.append((x, torch.sin(x @ w) * 3))
    return out


def train_plain(init, dtype):
    model = Net().to(dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in init.items()})
    opt = torch.optim.AdamW(groups(model), lr=LR, betas=(0.9, 0.999), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: ratio(k - 1))
    norms = []
    for x, y in data():
        opt.zero_grad()
        F.mse_loss(model(x.to(dtype)), y.to(dtype)).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        sched.step()
    return {k: v.double() for k, v in model.state_dict().items()}, norms


def train_zps(init):
    model = Net()
    model.load_state_dict(init)
    cfg = {
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": WD}},
        "scheduler": {"type": "WarmupCosineLR", "params": {
            "total_num_steps": T, "warmup_num_steps": W, "warmup_min_ratio": 0.0,
            "cos_min_ratio": COS_MIN, "warmup_type": "linear"}},
        "gradient_clipping": CLIP,
        "zps": {"shards": 2, "serving_dtype": "fp32", "chunk_elems": 1024},
    }
    norms = []
    with zt.initialize(model, cfg, param_groups=groups(model)) as engine:
        for x, y in data():
            engine.backward(F.mse_loss(engine(x), y))
            norms.append(engine.step()["grad_norm"])
        return {k: v.double() for k, v in engine.state_dict().items()}, norms


def test_adamw_clip_schedule_groups_match_plain_torch():
    torch.manual_seed(0)
    init = Net().state_dict()
    exact, norms64 = train_plain(init, torch.float64)
    fp32, norms32 = train_plain(init, torch.float32)
    got, norms_zps = train_zps(init)
    assert sum(n > CLIP for n in norms32) >= 5, "clipping must fire on some steps"
    assert sum(n <= CLIP for n in norms32) >= 1, "and not on others"
    torch_dev = max((fp32[k] - exact[k]).abs().max().item() for k in exact)
    zps_dev = max((got[k] - exact[k]).abs().max().item() for k in exact)
    diff = max((got[k] - fp32[k]).abs().max().item() for k in exact)
    print(f"max |torch32 - fp64| {torch_dev:.3g}, max |zps - fp64| {zps_dev:.3g}, "
          f"max |zps - torch32| {diff:.3g}")
    assert zps_dev <= 4 * torch_dev + 1e-7, (zps_dev, torch_dev)
    for a, b in zip(norms_zps, norms64):
        assert abs(a - b) <= 1e-4 * max(1.0, b)
    # The parameters moved: a no-op update would fail here.
    assert max((got[k] - init[k].double()).abs().max().item() for k in exact) > 1e-2
