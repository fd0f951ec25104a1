#!/usr/bin/env python3
"""Tokens/s of the TransformerEncoder LM (examples/train_lm.py) through zps against plain PyTorch
(torch.optim.AdamW + clip_grad_norm_ in this process), on the same model and batch, measured
in alternating blocks of --block steps in one process (plain block, zps block, plain block, ...),
so that both see the same background load on a shared machine. Blocks, not single steps: the
servers finish a step's update after step() returns, overlapping the next step as in a real
loop, and a block lets that happen inside zps's own time (only its last update spills into the
next plain block). Reports the median block time per step of each, the tokens/s, and the ratio
zps/plain, as one JSON line per size.

    /usr/bin/python3 bench/torch_speed.py --sizes 128x2,256x4 --steps 40 --threads 2
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import zps.torch as zt  # noqa: E402
import train_lm  # noqa: E402


def run(d_model, layers, args, text):
    torch.manual_seed(0)
    plain = train_lm.ByteLM(d_model, layers, seq_len=args.seq_len)
    zmodel = train_lm.ByteLM(d_model, layers, seq_len=args.seq_len)
    zmodel.load_state_dict(plain.state_dict())
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-3, weight_decay=0.0)
    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
           "gradient_clipping": 1.0,
           "zps": {"shards": args.shards, "serving_dtype": args.serving}}
    engine = zt.initialize(zmodel, cfg)
    times = {"plain": [], "zps": []}

    def plain_step(step):
        x, y = train_lm.batch(text, step, 0, 1, args.batch, args.seq_len)
        opt.zero_grad()
        loss = F.cross_entropy(plain(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
        opt.step()

    def zps_step(step):
        x, y = train_lm.batch(text, step, 0, 1, args.batch, args.seq_len)
        loss = F.cross_entropy(engine(x).reshape(-1, 256), y.reshape(-1))
        engine.backward(loss)
        engine.step()

    try:
        step = 0
        for _ in range(args.warmup):  # both, untimed
            plain_step(step)
            zps_step(step)
            step += 1
        while step < args.steps:
            n = min(args.block, args.steps - step)
            for name, fn in (("plain", plain_step), ("zps", zps_step)):
                t0 = time.perf_counter()
                for i in range(n):
                    fn(step + i)
                times[name].append((time.perf_counter() - t0) / n)
            step += n
    finally:
        engine.close()
    tokens = args.batch * args.seq_len
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"result": "torch_speed", "d_model": d_model, "layers": layers,
            "params": sum(p.numel() for p in plain.parameters()), "batch": args.batch,
            "seq_len": args.seq_len, "threads": torch.get_num_threads(), "shards": args.shards,
            "serving": args.serving, "blocks": len(times["zps"]), "block_steps": args.block,
            "plain_step_s": med["plain"], "zps_step_s": med["zps"],
            "plain_tokens_per_s": tokens / med["plain"], "zps_tokens_per_s": tokens / med["zps"],
            "ratio": med["plain"] / med["zps"],
            "load": os.getloadavg()[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="128x2,256x4,512x4", help="d_model x layers, comma-separated")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--block", type=int, default=5, help="steps per timed block")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--serving", default="bf16", choices=["bf16", "fp16", "fp32"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    text = train_lm.corpus()
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    for size in args.sizes.split(","):
        d, l = (int(v) for v in size.split("x"))
        print(json.dumps(run(d, l, args, text)), flush=True)


if __name__ == "__main__":
    main()
