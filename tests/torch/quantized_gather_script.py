"""A torchrun script for tests/torch/test_quantized_gather.py: the job of quantized_job.py
(zero_quantized_weights) trained by every rank on batches of its own, each run on an embedded
cluster of its own, with direct and bandwidth-centric fetches, and with the parameters
dequantized by the C library or (ZPS_TORCH_HOST_STAGING=1) kept quantized and dequantized by
torch ops; and the same job with an fp32 and a bf16 serving copy, bandwidth-centric, for the
all-gather's bytes. Rank 0 prints one JSON line: per run the losses, the largest difference of
the final weights from the int8 direct run's, and the parameter all-gather bytes per step
(zps_stats.gather_bytes, the steps after the first: the first agrees the plan)."""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import quantized_job
import torchrun_job

RUNS = [("int8", "direct", False), ("int8", "bandwidth-centric", False),
        ("int8", "bandwidth-centric", True), ("fp32", "bandwidth-centric", False),
        ("bf16", "bandwidth-centric", False)]


def train(serving, fetch, kept, rank, steps):
    os.environ["ZPS_TORCH_HOST_STAGING"] = "1" if kept else "0"
    if serving == "int8":
        cfg = quantized_job.config(fetch_strategy=fetch, ucx_tls="tcp")
        cfg["zero_optimization"] = {"stage": 3, "zero_quantized_weights": True,
                                    "stage3_param_persistence_threshold": 0}
    else:
        cfg = quantized_job.config(fetch_strategy=fetch, ucx_tls="tcp", serving_dtype=serving)
        cfg["zero_optimization"] = {"stage": 3, "stage3_param_persistence_threshold": 0}
    torch.manual_seed(0)
    with torchrun_job.embedded_engine(quantized_job.Net(), cfg) as engine:
        g = torch.Generator().manual_seed(rank)
        losses = []
        for step in range(steps):
            if step == 1:
                gathered0 = engine.stats()["gather_bytes"]
            x = torch.randn(16, 64, generator=g)
            loss = F.mse_loss(engine(x), torch.tanh(x))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        stats = engine.stats()
        weights = {k: v.clone() for k, v in engine.state_dict().items()}
    return losses, weights, (stats["gather_bytes"] - gathered0) / (steps - 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    rank, _ = torchrun_job.join_gloo()
    result, ref = {}, None
    for serving, fetch, kept in RUNS:
        losses, weights, gathered = train(serving, fetch, kept, rank, args.steps)
        if ref is None:
            ref = weights
        result[f"{serving} {fetch}{' kept' if kept else ''}"] = {
            "losses": losses, "gather_bytes_per_step": gathered,
            "max_diff": max((weights[k] - ref[k]).abs().max().item() for k in ref),
            "equal": all(torch.equal(weights[k], ref[k]) for k in ref)}
    if rank == 0:
        print(json.dumps({"result": "quantized_gather", "runs": result}), flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
