"""Run by test_shard_errors.py inside a private mount namespace whose TMPDIR is a 20 MB tmpfs: the
issue's laptop case. The embedded shards cannot preallocate their spill files there, and
initialize must raise the shard's own error. Prints what the test checks, as JSON."""

import json
import os
import sys

import torch
import torch.nn as nn

torch.set_num_threads(1)

import zps.torch as zt  # noqa: E402  (after torch, as zps.torch asks)

torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(8)])
config = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "zps": {"shards": 2, "memory_budget": 16 << 20, "chunk_elems": 262144,
                  "connect_timeout_s": 10}}
try:
    zt.initialize(model, config)
    print(json.dumps({"raised": None}))
    sys.exit(0)
except zt.ZpsError as e:
    print(json.dumps({
        "raised": type(e).__name__, "code": e.code, "message": str(e),
        "shard": getattr(e, "shard", None), "returncode": getattr(e, "returncode", None),
        "log_exists": os.path.exists(getattr(e, "log_path", "")),
        "log_in_tmpdir": getattr(e, "log_path", "").startswith(os.environ["TMPDIR"]),
        "dir_kept": os.path.isdir(getattr(e, "cluster_dir", ""))}))
