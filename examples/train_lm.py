#!/usr/bin/env python3
"""A byte-level language model built from torch.nn.TransformerEncoder, trained through zps.

The model is plain PyTorch; the only zps lines are initialize, backward and step. With no
endpoint in the config, an embedded local cluster starts and stops with the script. Under
torchrun each process is one zps rank (rank 0 starts the cluster), and each reads its own slice
of the text.

    PYTHONPATH=python /usr/bin/python3 examples/train_lm.py --steps 100
    /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 \
        examples/train_lm.py --steps 50          # 2 ranks (PYTHONPATH as above)
    examples/train_lm.py --config my_deepspeed.json  # a DeepSpeed-style config file
"""

import argparse
import glob
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import zps.torch as zt  # noqa: E402


class ByteLM(nn.Module):
    def __init__(self, d_model=128, layers=2, heads=4, seq_len=64, vocab=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len),
                             persistent=False)

    def forward(self, ids):
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        h = self.embed(ids) + self.pos(pos)
        h = self.encoder(h, mask=self.mask[:t, :t])
        return self.head(self.norm(h))


def corpus():
    """Debian's license texts, or (on a machine without them) this repository's docs."""
    files = sorted(glob.glob("/usr/share/common-licenses/*")) or sorted(
        glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "*.md")))
    data = b"".join(open(p, "rb").read() for p in files if os.path.isfile(p))
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def batch(text, step, rank, world, batch_size, seq_len):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    starts = torch.randint(0, len(text) - seq_len - 1, (batch_size,), generator=g)
    rows = torch.stack([text[s:s + seq_len + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def default_config(args):
    return {
        "train_micro_batch_size_per_gpu": args.batch,
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "betas": [0.9, 0.95],
                                                  "eps": 1e-8, "weight_decay": 0.0}},
        "gradient_clipping": 1.0,
        "zps": {"shards": args.shards, "reduction": args.reduction,
                "fetch_strategy": args.fetch_strategy},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--config", help="a DeepSpeed-style JSON config (default: built in)")
    ap.add_argument("--plain", action="store_true", help="plain PyTorch (AdamW), no zps")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--reduction", default="server-sum", choices=["server-sum", "pre-reduced"])
    ap.add_argument("--fetch-strategy", default="direct", choices=["direct", "bandwidth-centric"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.manual_seed(0)
    model = ByteLM(args.d_model, args.layers, seq_len=args.seq_len).to(args.device)
    text = corpus()
    if args.plain:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                weight_decay=0.0)
        engine = None
    else:
        engine = zt.initialize(model, args.config or default_config(args))
    step0 = engine.global_step if engine else 0
    warmup = min(5, max(0, args.steps - step0 - 1))  # steps left out of the tokens/s figure
    t0, losses = time.monotonic(), []
    for step in range(step0, args.steps):
        if step == step0 + warmup:
            t0 = time.monotonic()
        x, y = batch(text, step, rank, world, args.batch, args.seq_len)
        x, y = x.to(args.device), y.to(args.device)
        if engine:
            loss = F.cross_entropy(engine(x).reshape(-1, 256), y.reshape(-1))
            engine.backward(loss)
            info = engine.step()
        else:
            opt.zero_grad()
            loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            info = {}
        losses.append(loss.item())
        if rank == 0 and (step % 10 == 0 or step + 1 == args.steps):
            extra = f" grad_norm {info['grad_norm']:.3f}" if info else ""
            print(f"step {step:4d} loss {losses[-1]:.4f}{extra}", flush=True)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    dt = time.monotonic() - t0
    tokens = (args.steps - step0 - warmup) * args.batch * args.seq_len * world
    if rank == 0:
        k = max(1, len(losses) // 10)
        first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
        params = sum(p.numel() for p in model.parameters())
        print(json.dumps({"result": "train_lm", "mode": "plain" if args.plain else "zps",
                          "world": world, "params": params, "d_model": args.d_model,
                          "layers": args.layers, "device": args.device, "batch": args.batch, "seq_len": args.seq_len,
                          "threads": torch.get_num_threads(), "first_loss": first,
                          "last_loss": last, "tokens_per_s": tokens / dt, "seconds": dt}),
              flush=True)
    if engine:
        engine.close()


if __name__ == "__main__":
    main()
