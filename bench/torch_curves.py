#!/usr/bin/env python3
"""Loss curves of the TransformerEncoder LM (examples/train_lm.py), zps against plain torch:

  - fp32: zps with fp32 serving copies against torch.optim.AdamW (the parity setting);
  - bf16: zps with bf16 serving copies (the forward and backward run on bf16-rounded weights)
    against torch's own bf16 autocast (torch.autocast("cpu", torch.bfloat16), fp32 master).

Both use AdamW, clipping 1.0, the same init, data and order. Prints one JSON line per curve
pair with the band (the largest gap between the 10-step moving averages, relative to the torch
curve, after the first 10 steps), writes a PNG with both panels (Debian's matplotlib), and exits
1 if a band is above --max-band.

    /usr/bin/python3 bench/torch_curves.py --steps 200 --out docs/img/torch-curves.png
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import zps.torch as zt  # noqa: E402
import train_lm  # noqa: E402


def run(args, mode, init, text):
    model = train_lm.ByteLM(args.d_model, args.layers, seq_len=args.seq_len)
    model.load_state_dict(init)
    losses = []
    if mode.startswith("torch"):
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        for step in range(args.steps):
            x, y = train_lm.batch(text, step, 0, 1, args.batch, args.seq_len)
            opt.zero_grad()
            with torch.autocast("cpu", torch.bfloat16, enabled=mode == "torch-bf16-autocast"):
                out = model(x)
            loss = F.cross_entropy(out.float().reshape(-1, 256), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
        return losses
    serving = "fp32" if mode == "zps-fp32" else "bf16"
    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": args.lr, "weight_decay": 0.0}},
           "gradient_clipping": 1.0, "zps": {"shards": 2, "serving_dtype": serving}}
    with zt.initialize(model, cfg) as engine:
        for step in range(args.steps):
            x, y = train_lm.batch(text, step, 0, 1, args.batch, args.seq_len)
            loss = F.cross_entropy(engine(x).reshape(-1, 256), y.reshape(-1))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    return losses


def smooth(xs, k=10):
    return [sum(xs[max(0, i - k + 1):i + 1]) / len(xs[max(0, i - k + 1):i + 1]) for i in range(len(xs))]


def band(a, b, skip=10):
    sa, sb = smooth(a), smooth(b)
    return max(abs(x - y) / y for x, y in zip(sa[skip:], sb[skip:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-band", type=float, default=0.05)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    init = train_lm.ByteLM(args.d_model, args.layers, seq_len=args.seq_len).state_dict()
    text = train_lm.corpus()
    curves = {m: run(args, m, init, text)
              for m in ("torch-fp32", "zps-fp32", "torch-bf16-autocast", "zps-bf16")}
    bands = {"fp32": band(curves["zps-fp32"], curves["torch-fp32"]),
             "bf16": band(curves["zps-bf16"], curves["torch-bf16-autocast"])}
    for name, value in bands.items():
        print(json.dumps({"result": "torch_curves", "pair": name, "steps": args.steps,
                          "band": value, "max_band": args.max_band,
                          "final_zps": smooth(curves["zps-" + name])[-1],
                          "final_torch": smooth(curves["torch-fp32" if name == "fp32"
                                                       else "torch-bf16-autocast"])[-1]}))
    if args.out:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        for ax, (name, a, b) in zip(axes, [("fp32", "torch-fp32", "zps-fp32"),
                                           ("bf16", "torch-bf16-autocast", "zps-bf16")]):
            ax.plot(curves[a], label=a, color="tab:blue", alpha=0.35)
            ax.plot(curves[b], label=b, color="tab:orange", alpha=0.35)
            ax.plot(smooth(curves[a]), color="tab:blue", label=f"{a} (10-step mean)")
            ax.plot(smooth(curves[b]), color="tab:orange", linestyle="--",
                    label=f"{b} (10-step mean)")
            ax.set_title(f"{name}: band {bands[name] * 100:.2f}% (max gap of the means)")
            ax.set_xlabel("step")
            ax.legend(fontsize=8)
        axes[0].set_ylabel("training loss (cross-entropy, bytes)")
        fig.suptitle(f"TransformerEncoder LM, d_model {args.d_model}, {args.layers} layers, "
                     f"batch {args.batch}x{args.seq_len}, AdamW lr {args.lr}, clip 1.0")
        fig.tight_layout()
        fig.savefig(args.out, dpi=100)
        print(f"wrote {args.out}")
    return 0 if all(v <= args.max_band for v in bands.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
