"""One rank of a zps.torch job under torchrun, for test_init_from.py (not a test itself).

Builds a small model with a buffer, each rank from its own seed, and first tries
init_from=--bad, a file that does not fit: every rank must get the error by itself, with nothing
started. Then it starts a new job (an embedded cluster: rank 0 starts it) with
init_from=--good. Every rank prints one JSON line {"result": {...}}: its rank, the error of the
first attempt, its buffer after initialize, the servers' weights before its one step.
"""

import argparse
import os

import torch

import torchrun_job

torch.set_num_threads(1)

import zps.torch as zt  # noqa: E402  (after torch, as zps.torch asks)


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        return self.lin(x) * self.scale


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bad", required=True)
    ap.add_argument("--good", required=True)
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    torch.manual_seed(100 + rank)  # values the files must replace, different on each rank
    model = Small()
    config = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "zps": {"shards": 1, "serving_dtype": "fp32", "ucx_tls": "tcp",
                      "op_timeout_s": 60, "connect_timeout_s": 30}}
    try:
        zt.initialize(model, config, init_from=args.bad)
        error = None
    except zt.WeightsMismatch as e:
        error = str(e)
    with zt.initialize(model, config, init_from=args.good) as engine:
        start = {k: v.flatten().tolist() for k, v in engine.state_dict().items()}
        x = torch.ones(2, 8) * (rank + 1)
        engine.backward(engine(x).square().sum())
        info = engine.step()
        # One write: both ranks share torchrun's stdout (torchrun_job.emit).
        torchrun_job.emit({"result": {"rank": rank, "error": error, "scale": model.scale.tolist(),
                                      "start": start, "step": info["step"]}})


if __name__ == "__main__":
    main()
