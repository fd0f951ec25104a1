#!/usr/bin/env python3
"""torch.optim.Adam (foreach=True) over the same parameter count as zps-bench optimizer, for the
ratio a PyTorch CPU-offload user would see. Prints one JSON line, like the probe and zps-bench.

  python3 bench/torch_adam.py --threads 1 [--params 67108864] [--tensors 16] [--steps 8]

Method as the probe: the first 2 steps warm up, the best of the rest is reported.
"""
import argparse
import json
import sys
import time

try:
    import torch
except ImportError:
    print(json.dumps({"bench": "torch_adam", "skipped": "torch is not installed"}))
    sys.exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--params", type=int, default=64 << 20)
    ap.add_argument("--tensors", type=int, default=16, help="split the parameters over this many tensors")
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    sizes = [a.params // a.tensors] * a.tensors
    sizes[-1] += a.params - sum(sizes)
    params = []
    for s in sizes:
        p = torch.nn.Parameter(0.01 * (torch.arange(s, dtype=torch.float32) % 97))
        p.grad = 0.001 * (torch.arange(s, dtype=torch.float32) % 13) - 0.006
        params.append(p)
    opt = torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, foreach=True)
    times = []
    with torch.no_grad():
        for step in range(1, a.steps + 1):
            t0 = time.perf_counter()
            opt.step()
            t1 = time.perf_counter()
            if step > 2:
                times.append(t1 - t0)
    best = min(times)
    times.sort()
    print(json.dumps({"bench": "torch_adam", "torch": torch.__version__, "threads": a.threads,
                      "params": a.params, "foreach": True,
                      "mparams_per_s": round(a.params / best / 1e6),
                      "median_mparams_per_s": round(a.params / times[len(times) // 2] / 1e6)}))


if __name__ == "__main__":
    main()
