"""An embedded shard that stops tells the user why: the next engine call raises ShardStopped with
the shard's own status, its exit code or signal and its log, without waiting for a timeout; the
cluster directory is then kept. A budget too small for the spill pipeline is refused before any
shard starts, with the shard's own advice. A clean close() removes the directory unless
zps.keep_cluster_dir is set."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.nn as nn

import zps.torch as zt
from conftest import base_config

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    """TMPDIR (and tempfile's cached copy) pointed at an empty directory of the test's own."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return d


def _small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4))


def test_budget_too_small_for_the_pipeline_is_refused_before_any_shard_starts(tmpdir_env):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 1024))
    # One chunk of 2.1 M elements: a 25 MB AdamW state record, 5 of them for the pipeline.
    cfg = base_config(shards=2, memory_budget=1 << 20)
    with pytest.raises(zt.ZpsError) as e:
        zt.initialize(model, cfg)
    assert e.value.code == "RESOURCE_EXHAUSTED", e.value
    msg = str(e.value)
    # The shard's own advice (CheckSpillPipeline, zps/common/spill_budget.h), naming the shard.
    assert "shard 0: memory_budget 1048576 bytes cannot hold the spill pipeline's 5 buffers" in msg
    assert "raise the budget to at least" in msg and "or lower the chunk size" in msg
    assert not isinstance(e.value, zt.ShardStopped)
    assert list(tmpdir_env.iterdir()) == [], "no cluster directory: no shard was started"
    assert model[0].weight.numel() == 1024 * 1024  # the module is left as it was


def test_a_shard_killed_mid_step_is_named_with_its_signal(tmpdir_env):
    # Chunks of 64 elements spread the model over both shards, so the step's own pushes and
    # reports need shard 1. With the default 4 Mi-element chunk the whole model is one chunk on
    # shard 0: the steps then go on until the coordinator sees shard 1's control connection
    # close, which can take longer than the calls below.
    cfg = base_config(shards=2, op_timeout_s=120, chunk_elems=64)
    cfg["zero_optimization"] = {"stage3_param_persistence_threshold": 0}
    engine = zt.initialize(_small_model(), cfg)
    x = torch.randn(2, 16)
    engine.backward(engine(x).sum())
    engine.step()
    loss = engine(x).sum()
    cluster_dir = engine.cluster.dir
    # As the kernel's OOM killer would: not through the cluster.
    os.kill(engine.cluster.procs[1].pid, signal.SIGKILL)
    with pytest.raises(zt.ShardStopped) as e:
        engine.backward(loss)
        engine.step()
        engine.backward(engine(x).sum())
        engine.step()
    err = e.value
    assert err.shard == 1 and err.returncode == -signal.SIGKILL, err
    assert "embedded shard 1 was killed by signal SIGKILL" in str(err)
    assert err.log_path == str(cluster_dir / "shard-1.log") and os.path.exists(err.log_path)
    # The call that failed did not wait for op_timeout: its own error (the cause) is the lost
    # shard, not a deadline.
    assert err.__cause__ is None or err.__cause__.code != "DEADLINE_EXCEEDED", err.__cause__
    # Once the death is known, a call raises it before reaching the servers at all.
    with pytest.raises(zt.ShardStopped) as again:
        engine.state_dict()
    assert again.value.__cause__ is None and again.value.shard == 1
    engine.close()
    assert cluster_dir.is_dir(), "a cluster that lost a shard keeps its directory"
    shutil.rmtree(cluster_dir)


def test_a_shard_seen_dead_fails_the_next_call_before_it_is_made(tmpdir_env):
    cfg = base_config(shards=2, op_timeout_s=120)
    engine = zt.initialize(_small_model(), cfg)
    cluster_dir = engine.cluster.dir
    engine.cluster.procs[0].send_signal(signal.SIGKILL)
    # The death is known once the cluster has seen it (a lost-peer error waits for that).
    assert engine.cluster.stopped(zt.ZpsError("UNAVAILABLE", "probe")) is not None
    with pytest.raises(zt.ShardStopped) as e:
        engine(torch.randn(2, 16))
    assert e.value.__cause__ is None, "raised before any call reached the servers"
    assert e.value.shard == 0 and "SIGKILL" in str(e.value)
    assert f"the cluster directory {cluster_dir} is kept" in str(e.value)
    engine.close()
    assert cluster_dir.is_dir()
    shutil.rmtree(cluster_dir)


def test_clean_close_removes_the_directory_unless_asked_to_keep_it(tmpdir_env):
    for keep in (False, True):
        cfg = base_config(shards=1, keep_cluster_dir=keep)
        engine = zt.initialize(_small_model(), cfg)
        cluster_dir = engine.cluster.dir
        assert cluster_dir.parent == tmpdir_env, "the cluster directory follows TMPDIR"
        engine.backward(engine(torch.randn(2, 16)).sum())
        engine.step()
        engine.close()
        assert cluster_dir.is_dir() == keep
    shutil.rmtree(cluster_dir)


def _mount_namespace_available():
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs $d"],
                           capture_output=True)
    return probe.returncode == 0


def test_a_shard_that_cannot_preallocate_its_spill_file_says_disk_full(tmp_path):
    if shutil.which("unshare") is None or not _mount_namespace_available():
        pytest.skip("needs unshare -m and mount (root, or a user namespace) for a small tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    # The tmpfs lives in the child's private mount namespace and goes away with it.
    script = (f"mount -t tmpfs -o size=20m tmpfs {mnt} && "
              f"TMPDIR={mnt} exec {sys.executable} {HERE / 'disk_full_script.py'}")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["raised"] == "ShardStopped", out
    assert out["code"] == "RESOURCE_EXHAUSTED", out
    assert "fallocate" in out["message"] and "disk full" in out["message"], out
    assert out["returncode"] == 1 and "exited with code 1" in out["message"], out
    assert out["log_exists"] and out["log_in_tmpdir"] and out["dir_kept"], out
    assert "the cluster directory" in r.stderr and "is kept" in r.stderr, r.stderr
