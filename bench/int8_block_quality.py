"""Chooses the int8 state's block size: a small language model trained with AdamW whose moments
are stored, after every step, through zps's int8 format (the dynamic quantization map of
server/src/optimizer/state_codec.h, a bf16 absmax scale rounded up, one scale per block of the
flat parameter space with every parameter starting on a multiple of 64 elements, as a zps layout
places them) at several block sizes, against fp32 moments. Prints one JSON line per block size:
the held-out loss after the run, its gap to fp32 state, the moments' relative quantisation error
at the end, and the bytes per element of one moment.

    /usr/bin/python3 bench/int8_block_quality.py [--steps 300] [--blocks 32,64,128,256,2048]

The quantiser here is a vectorised copy of the C++ one (same decades, cells and rounding); the
C++ kernels are checked against their own reference in tests/unit/server/optimizer_state_test.cc.
"""
import argparse
import json
import math

import torch

ALIGN = 64  # zps' default align_elems


def map_consts(signed):
    scale, cells, base, limit = [], [], [], []
    for d in range(7):
        n = (1 << d) if signed else (2 << d)
        scale.append(float(10 ** (6 - d)))
        cells.append(n / 0.9)
        base.append(n if signed else n - 1)
        limit.append(n if (not signed and d == 6) else n - 1)
    return scale, cells, base, limit


def table(signed):
    t = torch.zeros(256, dtype=torch.float64)
    _, _, base, _ = map_consts(signed)
    for d in range(7):
        n = (1 << d) if signed else (2 << d)
        for cell in range(n):
            v = 10.0 ** (d - 6) * (0.1 + (cell + 0.5) * 0.9 / n)
            t[base[d] + cell] = v
    if not signed:
        t[255] = 1.0
    return t.float()


BOUNDS = torch.tensor([1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1], dtype=torch.float32)
CONSTS = {s: [torch.tensor(c) for c in map_consts(s)] for s in (True, False)}
TABLES = {s: table(s) for s in (True, False)}


def bf16_up(x):
    """x >= 0 rounded up to a bfloat16 (as a float32)."""
    bits = x.view(torch.int32)
    low = bits & 0xFFFF
    bits = torch.where(low != 0, bits + 0x10000, bits) & ~0xFFFF
    return bits.view(torch.float32)


def quantize_dequantize(x, block, signed):
    """x (flat, length a multiple of block) through the int8 format; returns the decoded floats."""
    xb = x.view(-1, block)
    scale = bf16_up(xb.abs().amax(dim=1).contiguous())
    inv = torch.where(scale == 0, torch.zeros_like(scale), 1.0 / scale)
    a = xb.abs() * inv[:, None]
    d = (a[..., None] >= BOUNDS).sum(-1)
    sc, ce, base, lim = CONSTS[signed]
    t = (a * sc[d].float() - 0.1) * ce[d].float()
    cell = torch.nan_to_num(t, nan=-1.0).trunc().clamp(min=0)
    cell = torch.minimum(cell, lim[d].float()).long()
    k = base[d] + cell
    zero = 2.75e-7 if signed else 1e-38
    k = torch.where(a < zero, torch.zeros_like(k), k)
    v = TABLES[signed][k] * scale[:, None]
    if signed:
        v = torch.where(xb < 0, -v, v)
    return v.reshape(-1)


class Flat:
    """The parameters' moments laid out as a zps layout would: each parameter at a multiple of
    ALIGN, padding zero; block boundaries fall at multiples of `block` of this space."""

    def __init__(self, params, block):
        self.params = params
        self.block = block
        self.offsets = []
        off = 0
        for p in params:
            off = (off + ALIGN - 1) // ALIGN * ALIGN
            self.offsets.append(off)
            off += p.numel()
        self.total = (off + block - 1) // block * block

    def roundtrip(self, tensors, signed):
        flat = torch.zeros(self.total)
        for t, o in zip(tensors, self.offsets):
            flat[o:o + t.numel()] = t.reshape(-1)
        back = quantize_dequantize(flat, self.block, signed)
        err_num = (back - flat).abs().sum().item()
        err_den = flat.abs().sum().item()
        for t, o in zip(tensors, self.offsets):
            t.copy_(back[o:o + t.numel()].view_as(t))
        return err_num / max(err_den, 1e-30)


class LM(torch.nn.Module):
    def __init__(self, vocab=256, d=128, layers=2, heads=4, ctx=64):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(ctx, d) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, layers)
        self.norm = torch.nn.LayerNorm(d)
        self.out = torch.nn.Linear(d, vocab)
        self.ctx = ctx

    def forward(self, x):
        n = x.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
        h = self.emb(x) + self.pos[:n]
        return self.out(self.norm(self.enc(h, mask=mask)))


def corpus(n, seed):
    """A byte stream with structure to learn: words from a small vocabulary, Zipf-distributed."""
    g = torch.Generator().manual_seed(seed)
    words = [bytes(torch.randint(97, 123, (int(l),), generator=g).tolist())
             for l in torch.randint(2, 8, (200,), generator=g)]
    w = torch.tensor([1.0 / (i + 1) for i in range(len(words))])
    out = bytearray()
    while len(out) < n:
        idx = torch.multinomial(w, 64, replacement=True, generator=g)
        for i in idx.tolist():
            out += words[i] + b" "
    return torch.tensor(list(out[:n]), dtype=torch.long)


def run(block, steps, seed, train, held):
    torch.manual_seed(seed)
    model = LM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    params = [p for p in model.parameters()]
    flat = Flat(params, block) if block else None
    g = torch.Generator().manual_seed(seed + 1)
    ctx, batch = model.ctx, 16
    err_m = err_v = 0.0
    for _ in range(steps):
        starts = torch.randint(0, train.numel() - ctx - 1, (batch,), generator=g)
        x = torch.stack([train[s:s + ctx] for s in starts])
        y = torch.stack([train[s + 1:s + ctx + 1] for s in starts])
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if flat:
            with torch.no_grad():
                st = [opt.state[p] for p in params]
                err_m = flat.roundtrip([s["exp_avg"] for s in st], True)
                err_v = flat.roundtrip([s["exp_avg_sq"] for s in st], False)
    with torch.no_grad():
        losses = []
        for s in range(0, held.numel() - ctx - 1, ctx * 4):
            x, y = held[s:s + ctx][None], held[s + 1:s + ctx + 1][None]
            losses.append(torch.nn.functional.cross_entropy(model(x).reshape(-1, 256),
                                                            y.reshape(-1)).item())
    return sum(losses) / len(losses), err_m, err_v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--blocks", default="32,64,128,256,2048")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    text = corpus(400_000, 7)
    train, held = text[:360_000], text[360_000:]
    base, _, _ = run(0, a.steps, a.seed, train, held)
    print(json.dumps({"block": "fp32", "steps": a.steps, "held_out_loss": round(base, 4)}),
          flush=True)
    for b in [int(x) for x in a.blocks.split(",")]:
        loss, em, ev = run(b, a.steps, a.seed, train, held)
        print(json.dumps({"block": b, "steps": a.steps, "held_out_loss": round(loss, 4),
                          "gap_vs_fp32_pct": round(100 * (loss - base) / base, 3),
                          "m_rel_err": round(em, 4), "v_rel_err": round(ev, 4),
                          "bytes_per_elem": round((b + 2) / b, 4)}), flush=True)


if __name__ == "__main__":
    main()
