"""The worker count changes at a resume (docs/checkpoints.md, "Changing the shard count"): a job
of 4 torchrun ranks (1 micro-batch each) on 2 shards stops after 6 steps (its shutdown
checkpoint), `zps-ckpt reshard --world-size 2 --accumulation-steps 2` writes its stores for 3
shards, and 2 ranks of 2 micro-batches each resume it at step 6 — the servers' step, the lr
schedule's position included — and run to step 12. The global batch is kept and each micro-batch
is the batch of the same contributor index (rank x accumulation + micro), which is the order the
shards sum contributions in (server-sum mode): the job ends bit-identical (every chunk's master,
m, v and serving CRC) to 12 uninterrupted steps of the 4 ranks.
"""

import json
import os
import pathlib
import subprocess

from torchrun_args import torchrun_command
from zps.cluster import LocalCluster

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STEPS = 12
HALF = 6


def zps_ckpt():
    return str(pathlib.Path(os.environ.get("ZPS_BUILD_DIR", ROOT / "build")) / "bin" / "zps-ckpt")


def train(cluster, nproc, accumulation, steps):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), ZPS_ENDPOINT=cluster.endpoint,
               ZPS_TOKEN_FILE=str(cluster.token_file))
    env.pop("ZPS_TOKEN", None)
    cmd = [*torchrun_command(nproc, "--max_restarts=0"), str(HERE / "reshard_world_script.py"),
           "--steps", str(steps), "--accumulation", str(accumulation),
           "--shards", str(cluster.shards)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    results = [json.loads(l[l.index("{"):]) for l in p.stdout.splitlines() if '{"result"' in l]
    assert len(results) == 1, out[-4000:]
    return results[0], out


def stores(cluster_dir, shards):
    return ",".join(str(cluster_dir / f"shard-{i}-data" / "checkpoints") for i in range(shards))


def test_four_ranks_then_two_with_doubled_accumulation_end_bit_identical(tmp_path):
    with LocalCluster(shards=2, ucx_tls="tcp") as ref_cluster:
        ref, _ = train(ref_cluster, 4, 1, STEPS)
    assert ref["result"]["start"] == 0 and len(ref["crcs"]) > 0, ref

    first = LocalCluster(shards=2, ucx_tls="tcp", data_dir=tmp_path / "a")
    try:
        half, _ = train(first, 4, 1, HALF)
    finally:
        first.close()  # SIGTERM: each shard writes its checkpoint of step 6
    assert half["result"]["steps"] == HALF, half

    p = subprocess.run([zps_ckpt(), "reshard", "--data-dir", stores(tmp_path / "a", 2),
                        "--out", stores(tmp_path / "b", 3), "--world-size", "2",
                        "--accumulation-steps", "2"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"resharded step {HALF} from 2 to 3 shards" in p.stdout, p.stdout

    with LocalCluster(shards=3, ucx_tls="tcp", data_dir=tmp_path / "b") as second:
        got, out = train(second, 2, 2, STEPS)
    assert got["result"]["start"] == HALF, out[-4000:]
    assert "joined the job at step 6" in out, out[-4000:]
    assert got["crcs"] == ref["crcs"], "not bit-identical to 12 steps of 4 ranks"
