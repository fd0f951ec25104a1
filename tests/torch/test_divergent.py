"""Ranks that do different things (docs/pytorch.md, "Ranks that differ"), under torchrun at 2 and
4 ranks, in every mode: server-sum or pre-reduced, times direct or bandwidth-centric.

tests/torch/divergent_script.py trains a tiny model per scenario and mode, each on an embedded
cluster of its own, and reports the largest difference of its final weights from server-sum +
direct's: a top-1 mixture of experts whose routing differs per rank with an expert no rank uses
on some steps, an expert used by one rank only, a rank-0-only no_grad evaluation every other
step, a branch one rank skips on odd steps, a mixture of experts with a shared expert, and ranks
that run different numbers of forward calls (at 4 ranks also one model that does all of these at
once). Tolerance: bit-equal at 2 ranks (a sum of two terms
is the same in either order); at 4 ranks pre-reduced sums in Gloo's reduce-scatter order, not the
shards' rank order, so the weights may differ in the last bits (<= 1e-5 after 3 AdamW steps of
lr 1e-2).

A rank that skips a bucket on purpose (a test hook) gets, like every other rank, an error that
names the bucket, the ranks and the sizes, and no process aborts (Gloo's std::terminate before).
"""

import json
import os
import pathlib
import subprocess

import pytest

from torchrun_args import torchrun_command

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TOLERANCE = {2: 0.0, 4: 1e-5}


def torchrun(world, *args, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    cmd = [*torchrun_command(world), str(HERE / "divergent_script.py"), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


# Each scenario on its own, and at 4 ranks also one model that does all of them at once. One
# torchrun runs them all: its start (four processes importing torch) is most of the cost, and
# each scenario adds four small jobs (about 1.5 s each).
SINGLE = "moe,one_rank_expert,eval,skip,shared,forwards"
SCENARIOS = {2: SINGLE, 4: SINGLE + ",all"}


@pytest.mark.parametrize("world", [2, 4])
def test_divergent_ranks_end_with_the_weights_of_server_sum_direct_in_every_mode(world):
    p = torchrun(world, "--steps", "3", "--scenarios", SCENARIOS[world])
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    results = [json.loads(l[l.index("{"):]) for l in p.stdout.splitlines() if '{"result"' in l]
    assert len(results) == 1, out[-4000:]
    runs = results[0]["runs"]
    assert len(runs) == len(SCENARIOS[world].split(",")) * 4, runs
    for name, r in runs.items():
        assert r["max_diff"] <= TOLERANCE[world], (name, r)
    # The per-rank routing changed the acquire order, and each rank rebuilt its own trace.
    first = SCENARIOS[world].split(",")[0]
    assert runs[f"{first} pre-reduced bandwidth-centric"]["trace_rebuilds"] > 0, runs


def test_a_skipped_bucket_fails_on_every_rank_with_an_error_naming_it():
    p = torchrun(2, "--mismatch", "1:1", "--steps", "2")
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-4000:]
    assert "terminate called" not in out and "SIGABRT" not in out, out[-4000:]
    errors = {}
    for line in p.stdout.splitlines():
        if '"error"' in line:
            e = json.loads(line[line.index("{"):])
            errors[e["rank"]] = e["error"]
    assert sorted(errors) == [0, 1], out[-4000:]
    # Rank 1 skipped bucket 1: rank 0 is at bucket 1 where rank 1 is at bucket 2, and both say
    # so (not a timeout: the descriptors disagree at once).
    assert "FAILED_PRECONDITION" in errors[0] and "FAILED_PRECONDITION" in errors[1], errors
    assert "reduce-scatter of bucket 1 (params" in errors[0], errors
    assert "rank 1 issued collective" in errors[0], errors
    assert "reduce-scatter of bucket 2 (params" in errors[1], errors
    assert "rank 0 issued collective" in errors[1], errors
    assert "elements" in errors[0], errors
