#!/usr/bin/env python3
"""A torchvision model (resnet18 by default), unmodified, trained through zps on a small fixed
synthetic image set (each class a different pattern plus noise), so the loss must fall.

    PYTHONPATH=python /usr/bin/python3 examples/train_vision.py --model resnet18 --steps 30
    /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 \
        examples/train_vision.py --model mobilenet_v3_small
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import zps.torch as zt  # noqa: E402


def dataset(n, classes, size, seed=0):
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(classes, 3, size, size, generator=g)
    labels = torch.arange(n) % classes
    images = protos[labels] + 0.5 * torch.randn(n, 3, size, size, generator=g)
    return images, labels


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(num_classes=args.classes)
    engine = zt.initialize(model, {
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr}},
        "gradient_clipping": 5.0,
        "zps": {"shards": args.shards},
    })
    images, labels = dataset(4 * args.batch * world, args.classes, args.size)
    model.train()
    losses, t0 = [], time.monotonic()
    for step in range(args.steps):
        i = ((step % 4) * world + rank) * args.batch
        x, y = images[i:i + args.batch], labels[i:i + args.batch]
        loss = F.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        if rank == 0 and step % 10 == 0:
            print(f"step {step:4d} loss {losses[-1]:.4f}", flush=True)
    if rank == 0:
        k = 4
        print(json.dumps({"result": "train_vision", "model": args.model, "world": world,
                          "params": sum(zp.numel for zp in engine.zparams),
                          "first_loss": sum(losses[:k]) / k, "last_loss": sum(losses[-k:]) / k,
                          "seconds": time.monotonic() - t0}), flush=True)
    engine.close()


if __name__ == "__main__":
    main()
