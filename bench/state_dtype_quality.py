#!/usr/bin/env python3
"""Training quality per optimizer state dtype: the shards' Adam moments stored as fp32, bf16 (m
rounded to nearest, v up or down by a dither over steps) or int8 (blockwise, dynamic map), the
fp32 master the same in all three.
scripts/bench-quality.sh drives the three sub-commands; each writes or reads rows of one CSV,

    model,dtype,step,train_loss,heldout_loss

where `step` counts the updates done: a train loss at step n is the loss of the n-th batch (on
the weights after n - 1 updates), a held-out loss at step n is measured after n updates, and a
field not measured at that step is empty. The dtype `bf16-sr` names rows kept from runs of the
earlier bf16 method (m and v both stochastically rounded); parse and plot accept it, beside the
current bf16.

  torch   trains through zps.torch (an embedded local cluster, `zps.state_dtype` in the config)
          the TransformerEncoder LM of examples/train_lm.py (its default config: AdamW lr 3e-3,
          betas 0.9/0.95, clipping 1.0) on the first 90% of its corpus, with the held-out loss
          on 64 fixed windows of the last 10%, and a torchvision model (mobilenet_v3_small by
          default; AdamW lr 1e-3, clipping 5.0 as in examples/train_vision.py) on a stream of
          synthetic images (vision_batch) with 256 fixed held-out images; every dtype from the
          same init and the same batches, the same dropout masks. --quant-modes runs the same
          models with quantized weights and gradients instead (fp32 state; the names of
          QUANT_MODES: w8 = zero_quantized_weights, g8 / g4 = zps.quantized_grads int8 / int4,
          -noef = zps.grad_error_feedback false), as the model "<model>-quantized", whose fp32
          rows are the unquantized run. The state dtype fp32-eps is fp32 with Adam's eps 1.01e-8
          instead of 1e-8: a perturbation of every update by at most 1%, the noise floor.
          --schedule warmup-decay (the default) is DeepSpeed's WarmupDecayLR in the config:
          the lr rises linearly from 0 over --warmup-steps (default: 5% of the steps) and falls
          linearly to 0 at the last step, as zps-train's RECIPE in scripts/bench-quality.sh;
          --schedule constant keeps the lr fixed.
  parse   turns zps-train's output (`--log-every 1 --eval-every N`) into rows; --dtype names the
          state dtype or the quantized mode (DTYPES, QUANT_MODES below).
  plot    draws one panel per model (the held-out loss, and the train loss as a moving mean) and
          prints a Markdown table of the final held-out losses against fp32 state with the
          bands (int8 within 1%, bf16 within 0.5%).

    /usr/bin/python3 bench/state_dtype_quality.py torch --models lm,mobilenet_v3_small --steps 200 \\
        --csv /tmp/q.csv
    /usr/bin/python3 bench/state_dtype_quality.py torch --models lm --state-dtypes "" \\
        --quant-modes w8g8,w8g4,w8g4-noef --steps 200 --csv /tmp/q.csv
    build/bin/zps-train --state-dtype int8 --steps 2000 --log-every 1 --eval-every 100 > int8.log
    /usr/bin/python3 bench/state_dtype_quality.py parse --model zps-train-lm --dtype int8 \\
        int8.log >> /tmp/q.csv
    /usr/bin/python3 bench/state_dtype_quality.py plot /tmp/q.csv --png docs/img/state-dtype-quality.png
"""

import argparse
import csv
import math
import os
import re
import sys

FIELDS = ["model", "dtype", "step", "train_loss", "heldout_loss"]
# bf16-sr: bf16 state as it was before m was rounded to nearest (m and v both stochastically
# rounded), the dtype name under which the runs measured with that method are kept.
# The quantized modes of zps-train (--quantized-weights / --quantized-grads, fp32 state) are
# rows of the same form, their "dtype" naming the mode: w8 = int8 weights, g8 / g4 = int8 / int4
# gradients, -noef = without error feedback (--grad-error-feedback=false); fp32 is then the
# unquantized run. fp32-* rows are more fp32 runs, perturbed (another --model-seed, or --eps
# 1.01e-8: a change of every update by at most 1%): the noise floor of a comparison.
STATE_DTYPES = ["fp32", "bf16", "bf16-sr", "int8"]
QUANT_MODES = ["w8", "g8", "g4", "g4-noef", "w8g8", "w8g4", "w8g4-noef"]
DTYPES = STATE_DTYPES + QUANT_MODES + ["fp32-seed2", "fp32-eps"]
# The bands, relative to fp32's final held-out loss (issues 24 and 27).
BANDS = {"bf16": 0.005, "bf16-sr": 0.005, "int8": 0.01, "w8g8": 0.01, "w8g4": 0.02}
LEGEND = {"bf16-sr": "bf16, m and v stochastic (earlier)",
          "w8": "int8 weights", "g8": "int8 grads", "g4": "int4 grads",
          "g4-noef": "int4 grads, no error feedback", "w8g8": "int8 weights + int8 grads",
          "w8g4": "int8 weights + int4 grads",
          "w8g4-noef": "int8 weights + int4 grads, no error feedback",
          "fp32-seed2": "fp32, --model-seed 2", "fp32-eps": "fp32, --eps 1.01e-8"}
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def fmt(x):
    return "" if x is None else f"{x:.6f}"


def write_rows(path, rows):
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(FIELDS)
        for r in rows:
            w.writerow([r[0], r[1], r[2], fmt(r[3]), fmt(r[4])])


# ---- torch: zps.torch in each state dtype ------------------------------------------------------

def quant_keys(mode):
    """The config of a quantized mode's name (QUANT_MODES): (zero_optimization, zps) keys."""
    zero, z = {}, {}
    if "w8" in mode:
        zero["zero_quantized_weights"] = True
    for bits in ("8", "4"):
        if "g" + bits in mode:
            z["quantized_grads"] = "int" + bits
    if mode.endswith("-noef"):
        z["grad_error_feedback"] = False
    return zero, z


def configure(cfg, args, lr, dtype, mode):
    """Sets the state dtype, or the quantized mode's keys (fp32 state), and the lr schedule."""
    if mode is None and dtype == "fp32-eps":
        # the noise floor: fp32 with every update moved by at most 1% (as zps-train's --eps)
        cfg["zps"]["state_dtype"] = "fp32"
        cfg["optimizer"]["params"]["eps"] = 1.01e-8
    elif mode is None:
        cfg["zps"]["state_dtype"] = dtype
    elif mode != "fp32":
        zero, z = quant_keys(mode)
        if zero:
            cfg["zero_optimization"] = {"stage": 3, **zero}
        cfg["zps"].update(z)
    if args.schedule == "warmup-decay":
        warmup = args.warmup_steps if args.warmup_steps > 0 else max(1, args.steps // 20)
        cfg["scheduler"] = {"type": "WarmupDecayLR", "params": {
            "warmup_min_lr": 0.0, "warmup_max_lr": lr, "warmup_num_steps": warmup,
            "warmup_type": "linear", "total_num_steps": args.steps}}


def data_step(args, step):
    # The seed of a step's training batch: the step itself for --data-seed 1, and a range of its
    # own for each other order, 10^7 apart (clear of the held-out batches' 10^6 + i). The
    # held-out batches and the initial values do not depend on it.
    return (args.data_seed - 1) * 10**7 + step


def torch_lm(args, dtype, zt, torch, F, mode=None, name="lm"):
    import train_lm
    torch.manual_seed(0)
    model = train_lm.ByteLM(args.d_model, args.layers, seq_len=args.seq_len)
    text = train_lm.corpus()
    split = len(text) * 9 // 10
    train, held = text[:split], text[split:]
    held_batches = [train_lm.batch(held, 10**6 + i, 0, 1, 16, args.seq_len) for i in range(4)]
    cfg = train_lm.default_config(argparse.Namespace(
        batch=args.batch, lr=3e-3, shards=2, reduction="server-sum", fetch_strategy="direct"))
    configure(cfg, args, 3e-3, dtype, mode)
    rows = []

    def heldout(engine):
        with torch.no_grad():
            losses = [F.cross_entropy(engine(x).reshape(-1, 256), y.reshape(-1)).item()
                      for x, y in held_batches]
        return sum(losses) / len(losses)

    with zt.initialize(model, cfg) as engine:
        rows.append((name, dtype, 0, None, heldout(engine)))
        for step in range(args.steps):
            x, y = train_lm.batch(train, data_step(args, step), 0, 1, args.batch, args.seq_len)
            loss = F.cross_entropy(engine(x).reshape(-1, 256), y.reshape(-1))
            engine.backward(loss)
            engine.step()
            n = step + 1
            h = heldout(engine) if n % args.eval_every == 0 or n == args.steps else None
            rows.append((name, dtype, n, loss.item(), h))
    return rows


def vision_batch(torch, protos, noise, label_noise, n, seed):
    # examples/train_vision.py's task (each class a fixed random pattern plus Gaussian noise),
    # with fresh images each step, so that the held-out loss measures the fit and not
    # memorisation, and a share of the labels drawn at random, so that the loss has a floor well
    # above zero (about 0.87 nats at 20% over 10 classes) and a relative gap stays meaningful.
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, protos.shape[0], (n,), generator=g)
    images = protos[labels] + noise * torch.randn(n, *protos.shape[1:], generator=g)
    shuffled = torch.rand(n, generator=g) < label_noise
    random = torch.randint(0, protos.shape[0], (n,), generator=g)
    return images, torch.where(shuffled, random, labels)


def torch_vision(args, dtype, zt, torch, F, mode=None, name=None):
    import torchvision
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.vision)(num_classes=10)
    protos = torch.randn(10, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
    held = [vision_batch(torch, protos, args.noise, args.label_noise, 64, 10**6 + i) for i in range(4)]
    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "gradient_clipping": 5.0,
           "zps": {"shards": 2}}
    configure(cfg, args, 1e-3, dtype, mode)
    name = name or args.vision
    rows = []

    def heldout(engine):
        # Dropout off, but BatchNorm on the held-out batch's own statistics: torchvision's
        # MobileNetV3 moves its running statistics with momentum 0.01, so after a few hundred
        # steps they still describe the first batches and an eval-mode loss stays at ln 10
        # whatever the weights learnt (the running statistics play no part in training).
        model.eval()
        for mod in model.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
                mod.train()
        with torch.no_grad():
            losses = [F.cross_entropy(engine(x), y).item() for x, y in held]
        model.train()
        return sum(losses) / len(losses)

    with zt.initialize(model, cfg) as engine:
        model.train()
        rows.append((name, dtype, 0, None, heldout(engine)))
        for step in range(args.steps):
            x, y = vision_batch(torch, protos, args.noise, args.label_noise, args.batch,
                                data_step(args, step))
            loss = F.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()
            n = step + 1
            h = heldout(engine) if n % args.eval_every == 0 or n == args.steps else None
            rows.append((name, dtype, n, loss.item(), h))
    return rows


def cmd_torch(args):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import zps.torch as zt
    state_dtypes = [d for d in args.state_dtypes.split(",") if d]
    modes = [m for m in args.quant_modes.split(",") if m]
    for m in modes:
        if m != "fp32" and m not in QUANT_MODES:
            raise SystemExit(f"--quant-modes: {m!r} is not one of fp32, {', '.join(QUANT_MODES)}")
    for model in args.models.split(","):
        runs = [(d, None, model) for d in state_dtypes]
        runs += [(m, m, model + "-quantized") for m in modes]
        for dtype, mode, name in runs:
            if model == "lm":
                rows = torch_lm(args, dtype, zt, torch, F, mode, name)
            else:
                args.vision = model
                rows = torch_vision(args, dtype, zt, torch, F, mode, name)
            write_rows(args.csv, rows)
            last = [r for r in rows if r[4] is not None][-1]
            print(f"{name} {dtype}: held-out loss {rows[0][4]:.4f} -> {last[4]:.4f} "
                  f"at step {last[2]}", flush=True)
    return 0


# ---- parse: zps-train's output -----------------------------------------------------------------

# worker (local) mode: "step     9  loss 4.1234  norm ..."; reference mode: "step     9  loss
# 4.1234  rank0_loss ..."; both 0-based batch indices.
STEP_RE = re.compile(r"^step\s+(\d+)\s+loss\s+(\S+)")
EVAL_RE = re.compile(r"^held-out loss at step (\d+): (\S+)")
START_RE = re.compile(r"held-out loss at start (\S+)")
END_RE = re.compile(r"^held-out loss (\S+) -> (\S+)")


def cmd_parse(args):
    train, held, last = {}, {}, 0
    for line in open(args.log):
        if m := STEP_RE.match(line):
            n = int(m.group(1)) + 1
            train[n] = float(m.group(2))
            last = max(last, n)
        elif m := EVAL_RE.match(line):
            held[int(m.group(1))] = float(m.group(2))
        elif m := END_RE.match(line):
            held[0] = float(m.group(1))
            held["end"] = float(m.group(2))
        elif m := START_RE.search(line):
            held[0] = float(m.group(1))
    if "end" in held:
        held[last] = held.pop("end")
    steps = sorted(set(train) | {k for k in held if isinstance(k, int)})
    rows = [(args.model, args.dtype, s, train.get(s), held.get(s)) for s in steps]
    if args.csv == "-":
        csv.writer(sys.stdout).writerows([[r[0], r[1], r[2], fmt(r[3]), fmt(r[4])] for r in rows])
    else:
        write_rows(args.csv, rows)
    return 0


# ---- plot: the PNG and the table ---------------------------------------------------------------

def load(path):
    data = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            d = data.setdefault(r["model"], {}).setdefault(r["dtype"], {"train": [], "held": []})
            s = int(r["step"])
            if r["train_loss"]:
                d["train"].append((s, float(r["train_loss"])))
            if r["heldout_loss"]:
                d["held"].append((s, float(r["heldout_loss"])))
    for per in data.values():
        for d in per.values():
            d["train"].sort()
            d["held"].sort()
    return data


def moving_mean(points, k):
    out, acc = [], 0.0
    for i, (s, v) in enumerate(points):
        acc += v
        if i >= k:
            acc -= points[i - k][1]
        out.append((s, acc / min(i + 1, k)))
    return out


def finals(per):
    """The held-out loss of each dtype at the last step every dtype reached."""
    common = set.intersection(*(set(s for s, _ in d["held"] if s > 0) for d in per.values()))
    if not common:
        return None, {}
    step = max(common)
    return step, {dt: dict(d["held"])[step] for dt, d in per.items()}


def train_tail(d, step):
    """Mean train loss over the last 10% of the steps up to `step`: a second, less noisy view
    than one held-out evaluation."""
    tail = [v for s, v in d["train"] if 0.9 * step < s <= step]
    return sum(tail) / len(tail) if tail else math.nan


def held_tail(d, step, k=3):
    """Mean of the last `k` held-out evaluations up to `step`: less noisy than the last one."""
    tail = [v for s, v in d["held"] if 0 < s <= step][-k:]
    return sum(tail) / len(tail) if tail else math.nan


def cmd_plot(args):
    data = load(args.csv)
    if args.models:
        data = {m: d for m, d in data.items() if m in args.models.split(",")}
    data = {m: d for m, d in data.items() if m not in args.exclude.split(",")}
    models = [m for m in args.order.split(",") if m in data] + sorted(
        m for m in data if m not in args.order.split(","))
    print("| model | steps | state dtype or mode | held-out loss | vs fp32 | band | "
          "mean of the last 3 held-out | vs fp32 | train loss, last 10% of steps | vs fp32 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for m in models:
        step, fin = finals(data[m])
        summary[m] = (step, fin)
        tails = {dt: train_tail(data[m][dt], step) for dt in fin}
        htails = {dt: held_tail(data[m][dt], step) for dt in fin}
        for dt in [d for d in DTYPES if d in fin]:
            rel = (fin[dt] - fin["fp32"]) / fin["fp32"] if "fp32" in fin else math.nan
            trel = (tails[dt] - tails["fp32"]) / tails["fp32"] if "fp32" in fin else math.nan
            hrel = (htails[dt] - htails["fp32"]) / htails["fp32"] if "fp32" in fin else math.nan
            band = BANDS.get(dt)
            verdict = "" if band is None else (
                f"within {band:.1%}" if rel <= band else f"**outside {band:.1%}**")
            print(f"| {m} | {step} | {dt} | {fin[dt]:.4f} | "
                  f"{'' if dt == 'fp32' else f'{rel:+.2%}'} | {verdict} | {htails[dt]:.4f} | "
                  f"{'' if dt == 'fp32' else f'{hrel:+.2%}'} | {tails[dt]:.4f} | "
                  f"{'' if dt == 'fp32' else f'{trel:+.2%}'} |")
    if not args.png:
        return 0
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"fp32": "tab:blue", "bf16": "tab:orange", "bf16-sr": "tab:red", "int8": "tab:green",
              "w8": "tab:olive", "g8": "tab:cyan", "g4": "tab:pink", "g4-noef": "tab:gray",
              "w8g8": "tab:orange", "w8g4": "tab:green", "w8g4-noef": "tab:red",
              "fp32-seed2": "tab:purple", "fp32-eps": "tab:brown"}
    styles = {"fp32": "-", "bf16": "--", "bf16-sr": "-.", "int8": ":", "w8": "--", "g8": "--",
              "g4": ":", "g4-noef": "-.", "w8g8": "--", "w8g4": ":", "w8g4-noef": "-.",
              "fp32-seed2": "-", "fp32-eps": "-"}
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 4.2), squeeze=False)
    for ax, m in zip(axes[0], models):
        step, fin = summary[m]
        last = max(s for d in data[m].values() for s, _ in d["held"])
        seen = []  # what is drawn after 5% of the steps: the view's y range
        for dt in [d for d in DTYPES if d in data[m]]:
            d = data[m][dt]
            tr = moving_mean(d["train"], max(1, len(d["train"]) // 40))
            ax.plot([s for s, _ in tr], [v for _, v in tr], color=colors[dt], alpha=0.3,
                    linewidth=1, linestyle=styles[dt])
            name = LEGEND.get(dt, dt)
            label = f"{name}: held-out {fin[dt]:.4f}" if dt in fin else name
            if dt != "fp32" and dt in fin and "fp32" in fin:
                label += f" ({(fin[dt] - fin['fp32']) / fin['fp32']:+.2%})"
            ax.plot([s for s, _ in d["held"]], [v for _, v in d["held"]], color=colors[dt],
                    linestyle=styles[dt], marker="o", markersize=2.5, linewidth=1.5, label=label)
            seen += [v for s, v in tr + d["held"] if s >= 0.05 * last]
        # The first steps (from ln 256 down, for the LMs) would flatten the part where the
        # dtypes could differ.
        if seen:
            lo, hi = min(seen), max(seen)
            ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
        ax.set_title(TITLES.get(m, m), fontsize=10)
        ax.set_xlabel("step")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, title=f"at step {step}, vs fp32", title_fontsize=8)
    axes[0][0].set_ylabel("loss, nats per token or image\n(held-out: markers; train: moving mean, faint)")
    fig.suptitle(args.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(args.png, dpi=args.dpi)
    print(f"wrote {args.png} ({os.path.getsize(args.png)} bytes)")
    return 0


TITLES = {"zps-train-lm": "zps-train's default LM (--mode reference)",
          "zps-train-lm-quantized": "zps-train's default LM, quantized weights and gradients",
          "zps-train-small": "zps-train, small LM: state dtypes",
          "zps-train-small-quantized": "zps-train, small LM: quantized weights and gradients",
          "lm": "zps.torch: TransformerEncoder LM",
          "lm-quantized": "zps.torch: TransformerEncoder LM, quantized",
          "resnet18": "zps.torch: torchvision resnet18",
          "mobilenet_v3_small": "zps.torch: torchvision mobilenet_v3_small"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("torch", help="train through zps.torch in each state dtype")
    t.add_argument("--models", default="lm,mobilenet_v3_small", help="lm and/or a torchvision model name")
    t.add_argument("--state-dtypes", default="fp32,bf16,int8", help='"" runs none')
    t.add_argument("--quant-modes", default="",
                   help="quantized modes (fp32 state), e.g. w8g8,w8g4,w8g4-noef; fp32 = unquantized")
    t.add_argument("--schedule", default="warmup-decay", choices=["warmup-decay", "constant"])
    t.add_argument("--warmup-steps", type=int, default=0, help="0: 5%% of --steps")
    t.add_argument("--steps", type=int, default=200)
    t.add_argument("--eval-every", type=int, default=25)
    t.add_argument("--batch", type=int, default=16)
    t.add_argument("--seq-len", type=int, default=64)
    t.add_argument("--d-model", type=int, default=128)
    t.add_argument("--layers", type=int, default=2)
    t.add_argument("--size", type=int, default=32, help="vision: image side")
    t.add_argument("--noise", type=float, default=1.0, help="vision: noise std per pixel")
    t.add_argument("--label-noise", type=float, default=0.2,
                   help="vision: share of labels drawn at random")
    t.add_argument("--data-seed", type=int, default=1,
                   help="order of the training batches (1: the default; the held-out set and the "
                        "initial values stay)")
    t.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    t.add_argument("--csv", required=True, help="rows are appended")
    p = sub.add_parser("parse", help="zps-train's output to rows")
    p.add_argument("log")
    p.add_argument("--model", default="zps-train-lm")
    p.add_argument("--dtype", required=True, choices=DTYPES)
    p.add_argument("--csv", default="-", help="append here (default: print)")
    g = sub.add_parser("plot", help="the PNG and the table of final held-out losses")
    g.add_argument("csv")
    g.add_argument("--png", default="")
    g.add_argument("--dpi", type=int, default=80)
    g.add_argument("--order", default="zps-train-lm,zps-train-lm-quantized,lm,lm-quantized,"
                   "mobilenet_v3_small,resnet18")
    g.add_argument("--models", default="", help="draw only these models (default: every one)")
    g.add_argument("--exclude", default="", help="do not draw these models")
    g.add_argument("--title", default="Adam moments on the shards in fp32, bf16 and int8 (fp32 "
                   "master in all)")
    args = ap.parse_args()
    return {"torch": cmd_torch, "parse": cmd_parse, "plot": cmd_plot}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
