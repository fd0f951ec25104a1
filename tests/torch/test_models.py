"""Unmodified models nobody here wrote train through zps, at 1 and 2 ranks (torchrun), with the
loss falling: torchvision's resnet18 and mobilenet_v3_small, and a TransformerEncoder LM."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from torchrun_args import torchrun_command

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(script, world, *args, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    if world == 1:
        cmd = [sys.executable, str(ROOT / "examples" / script), *args]
    else:
        cmd = [*torchrun_command(world), str(ROOT / "examples" / script), *args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    results = [json.loads(l) for l in p.stdout.splitlines() if l.startswith('{"result"')]
    assert len(results) == 1, p.stdout[-3000:]
    return results[0]


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("model", ["resnet18", "mobilenet_v3_small"])
def test_torchvision_model_trains(model, world):
    r = run("train_vision.py", world, "--model", model, "--steps", "16", "--batch", "8",
            "--threads", "1")
    assert r["world"] == world
    assert r["last_loss"] < 0.8 * r["first_loss"], r


@pytest.mark.parametrize("world", [1, 2])
def test_transformer_encoder_lm_trains(world):
    r = run("train_lm.py", world, "--steps", "40", "--batch", "8", "--d-model", "64",
            "--threads", "1")
    assert r["world"] == world
    assert r["last_loss"] < 0.8 * r["first_loss"], r


def test_lm_with_workers_that_reduce_and_gather_among_themselves():
    """2 ranks: pre-reduced (Gloo reduce-scatter, each rank pushes its slice) with
    bandwidth-centric fetches (slice from the shards, Gloo all-gather), against server-sum with
    direct fetches: the same training up to the order of the gradient sum."""
    args = ("--steps", "20", "--batch", "8", "--d-model", "64", "--threads", "1")
    base = run("train_lm.py", 2, *args)
    coll = run("train_lm.py", 2, *args, "--reduction", "pre-reduced",
               "--fetch-strategy", "bandwidth-centric")
    assert coll["last_loss"] < 0.8 * coll["first_loss"], coll
    assert abs(coll["last_loss"] - base["last_loss"]) <= 1e-3 * base["last_loss"], (coll, base)
