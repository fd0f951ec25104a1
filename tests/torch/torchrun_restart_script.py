"""One rank of a zps.torch job under torchrun, for test_torchrun_restart.py (not a test itself).

The servers are already running (ZPS_ENDPOINT, ZPS_TOKEN_FILE). Each rank trains a small MLP
whose batches depend only on (step, rank), so a worker group that torchrun restarts resumes at
the servers' step (zt.initialize takes the servers' step and values) and ends with the same bits
as an uninterrupted run. With --kill-step, rank --kill-rank SIGKILLs itself in the middle of the
backward pass of that step (after the gradients of the later layers were pushed and landed),
in the first attempt only (TORCHELASTIC_RESTART_COUNT 0). With --mismatch BUCKET@STEP (pre-reduced)
rank --kill-rank instead skips its reduce-scatter of that bucket in that step (the test hook
ZPS_TEST_SKIP_BUCKET), in the first attempt only, or in every attempt with
--mismatch-every-attempt; a rank whose step fails prints {"rank", "attempt", "error"} and exits
with the error once every rank has. At the end rank 0 prints one JSON line: {"result": ...,
"crcs": [[chunk, crc32c], ...]} with the chunk CRCs of every shard. The model, its config and
its batches are torchrun_job.py's, as reshard_world_script.py's are.
"""

import argparse
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)

import zps.torch as zt  # noqa: E402  (after torch, as zps.torch asks)
from torchrun_job import batch, config, emit, mlp, shard_crcs  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--kill-step", type=int, default=-1)
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--reduction", default="server-sum")
    ap.add_argument("--late-rank0", type=float, default=0.0,
                    help="after a restart, rank 0 joins this many seconds late (the other rank "
                         "may then finish the step in progress with rank 0's earlier pushes)")
    ap.add_argument("--mismatch", default="", help="BUCKET@STEP: rank --kill-rank skips that "
                    "bucket's reduce-scatter in that step")
    ap.add_argument("--mismatch-every-attempt", action="store_true")
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.mismatch:
        # Every rank reports its error before any exits (the agent stops the group at the first
        # exit): a process group of the script's own for that one barrier.
        dist.init_process_group("gloo")
        if rank == args.kill_rank and (attempt == 0 or args.mismatch_every_attempt):
            os.environ["ZPS_TEST_SKIP_BUCKET"] = args.mismatch

    model = mlp()
    if rank == 0 and attempt > 0 and args.late_rank0 > 0:
        time.sleep(args.late_rank0)
    engine = zt.initialize(model, config(2, zps={"reduction": args.reduction}))
    start = engine.global_step
    print(f"zps.torch rank {rank}: joined the job at step {start} (attempt {attempt})",
          file=sys.stderr, flush=True)
    try:
        train(engine, model, args, rank, attempt, start)
    except zt.ZpsError as e:
        if not args.mismatch:
            raise
        emit({"rank": rank, "attempt": attempt, "error": str(e)})
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
        engine.close()
        sys.exit(3)
    if rank == 0:
        report(engine, args, start, attempt)
    engine.close()


def train(engine, model, args, rank, attempt, start):
    for step in range(start, args.steps):
        x, y = batch(step, rank)
        hidden = model[1](model[0](x))
        if (rank == args.kill_rank and step == args.kill_step and attempt == 0
                and not args.mismatch):
            def die(grad):
                engine.client.flush()  # the later layers' gradients have landed on the shards
                print(f"zps.torch rank {rank}: killing this process in the backward pass of "
                      f"step {step}", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
                return grad
            hidden.register_hook(die)
        out = model[4](model[3](model[2](hidden)))
        loss = torch.nn.functional.mse_loss(out, y)
        engine.backward(loss)
        engine.step()


def report(engine, args, start, attempt):
    emit({"result": {"start": start, "attempt": attempt, "steps": engine.global_step},
          "crcs": shard_crcs(engine, 2, args.steps)})


if __name__ == "__main__":
    main()
