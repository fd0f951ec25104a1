"""A zps.torch rank SIGKILLed mid-step under torchrun (docs/operations.md, "Faults"; the flags
are spelled with underscores, which torch 1.13 needs and 2.x accepts).

- With --max_restarts 1, torchrun's elastic agent stops the other rank and restarts the whole
  worker group; both ranks re-join the servers' job at the servers' step (zt.initialize takes
  the servers' step and values) and the job ends bit-identical (every shard's chunk CRCs) to an
  uninterrupted torchrun run on servers of their own. In server-sum and in pre-reduced mode
  (Gloo among the ranks: the restarted group builds a new communicator, a new worker
  generation on the coordinator).
- With --max_restarts 0, the rank never comes back: torchrun stops the job at once with an error
  naming the rank; the servers keep the job at the step that did not commit, and a new torchrun
  resumes it there, bit-identical.

- Ranks that issue different collectives (pre-reduced; rank 1 skips one bucket's reduce-scatter
  through a test hook) take the same path: every rank fails the step with FAILED_PRECONDITION
  naming the collective, the process exits with it, and the restarted group re-joins and redoes
  the step. Once (the first attempt only), the job ends bit-identical to the uninterrupted run;
  in every attempt, each attempt ends that way on every rank until --max_restarts is spent, and
  torchrun stops the job, with no abort and no hang.

Each torchrun run trains 16 steps of a small MLP on 2 shards (tests/torch/torchrun_restart_script.py).
"""

import json
import os
import pathlib
import re
import subprocess
import time

import pytest

from torchrun_args import torchrun_command
from zps.cluster import LocalCluster

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STEPS = 16
KILL_STEP = 9


def torchrun(cluster, max_restarts, *args, timeout=300):
    # pre-reduced: small buckets (a test hook), so that the later layers' slices have landed
    # on the shards when the victim dies in the backward pass (one 16 MiB bucket would hold the
    # whole gradient of this model until the backward ends).
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), ZPS_ENDPOINT=cluster.endpoint,
               ZPS_TOKEN_FILE=str(cluster.token_file), ZPS_TEST_BUCKET_BYTES="4096")
    env.pop("ZPS_TOKEN", None)
    cmd = [*torchrun_command(2, f"--max_restarts={max_restarts}", "--monitor_interval=1"),
           str(HERE / "torchrun_restart_script.py"), "--steps", str(STEPS), *args]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


def json_objects(out):
    """Every JSON object in the ranks' shared stdout, in order. Each rank writes its lines in one
    write, but a line can still follow other output (torch's or a library's) on the same line."""
    decoder = json.JSONDecoder()
    for line in out.splitlines():
        pos = line.find("{")
        while pos >= 0:
            try:
                obj, end = decoder.raw_decode(line, pos)
            except json.JSONDecodeError:
                pos = line.find("{", pos + 1)
                continue
            if isinstance(obj, dict):
                yield obj
            pos = line.find("{", end)


def result_of(p):
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    results = [o for o in json_objects(p.stdout) if "result" in o]
    assert len(results) == 1, out[-4000:]
    return results[0], out


_REFERENCE = {}


def reference(reduction):
    """The uninterrupted run's result, on servers of its own (once per reduction mode)."""
    if reduction not in _REFERENCE:
        with LocalCluster(shards=2, ucx_tls="tcp") as ref_cluster:
            ref, _ = result_of(torchrun(ref_cluster, 0, "--reduction", reduction)[0])
        assert ref["result"]["start"] == 0 and ref["result"]["attempt"] == 0, ref
        assert len(ref["crcs"]) > 0, ref
        _REFERENCE[reduction] = ref
    return _REFERENCE[reduction]


@pytest.mark.parametrize("reduction", ["server-sum", "pre-reduced"])
def test_rank_killed_mid_step_restarts_and_ends_bit_identical(reduction):
    ref = reference(reduction)
    with LocalCluster(shards=2, ucx_tls="tcp") as cluster:
        # Rank 0 of the new group joins 3 s late: rank 1 may then finish step 9 with the pushes
        # of rank 0's old process (the same bits), and its own copies are refused as stale
        # (zps.torch takes the servers' decision), or rank 0 joins the step still in progress.
        p, _ = torchrun(cluster, 1, "--reduction", reduction, "--kill-step", str(KILL_STEP),
                        "--late-rank0", "3")
        got, out = result_of(p)
        logs = [cluster.log_tail(i, 200) for i in range(2)]
    # The victim died where the test put it, the agent restarted the group once, and both ranks
    # of the new group re-joined at the step in progress (or the next, had it been decided).
    assert f"killing this process in the backward pass of step {KILL_STEP}" in out, out[-4000:]
    joined = {int(r): int(s) for r, s in
              re.findall(r"zps\.torch rank (\d): joined the job at step (\d+) \(attempt 1\)", out)}
    assert sorted(joined) == [0, 1], out[-4000:]
    assert all(s in (KILL_STEP, KILL_STEP + 1) for s in joined.values()), joined
    assert got["result"]["attempt"] == 1 and got["result"]["steps"] == STEPS, got
    assert any("connected again" in log for log in logs), logs
    if reduction == "pre-reduced":  # the new group's communicator: a new worker generation
        assert re.search(r"rank \d re-joined the job at step \d+: worker generation", logs[0]), logs
    assert got["crcs"] == ref["crcs"], "not bit-identical to the uninterrupted run"


def test_rank_that_never_comes_back_stops_the_job_naming_it():
    ref = reference("server-sum")
    with LocalCluster(shards=2, ucx_tls="tcp") as cluster:
        p, took = torchrun(cluster, 0, "--kill-step", str(KILL_STEP), "--kill-rank", "1")
        out = p.stdout + p.stderr
        assert p.returncode != 0, out[-4000:]
        assert f"killing this process in the backward pass of step {KILL_STEP}" in out
        # torchrun's summary names the failed rank and its signal.
        assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", out), out[-4000:]
        assert re.search(r"Signal 9|SIGKILL", out), out[-4000:]
        # The agent (monitoring every 1 s here) stops the group at once, well within the
        # ranks' op timeout (60 s), which nobody waits out.
        assert took < 60, took
        # The servers kept the job at the step that did not commit: a new torchrun resumes it
        # there and ends bit-identical to the uninterrupted run.
        again, out2 = result_of(torchrun(cluster, 0)[0])
        # The first rank to join finds step 9; the other joins at 9 too, or at 10 when the
        # first finished step 9 with the pushes rank 0's old process had made (the same bits).
        joined = [int(s) for s in
                  re.findall(r"zps\.torch rank \d: joined the job at step (\d+) \(attempt 0\)", out2)]
        assert len(joined) == 2 and min(joined) == KILL_STEP, out2[-4000:]
        assert max(joined) in (KILL_STEP, KILL_STEP + 1), joined
        assert again["crcs"] == ref["crcs"], "not bit-identical to the uninterrupted run"


MISMATCH_STEP = 5


def errors_of(out):
    """{(attempt, rank): error} from the script's error lines."""
    return {(e["attempt"], e["rank"]): e["error"] for e in json_objects(out)
            if "error" in e and "attempt" in e}


def assert_mismatch(error, rank):
    assert error.startswith("FAILED_PRECONDITION: "), error
    assert f"on rank {rank} of 2: rank {1 - rank} issued collective" in error, error
    assert "the ranks issued different collectives" in error, error


def test_ranks_that_issue_different_collectives_once_restart_and_end_bit_identical():
    ref = reference("pre-reduced")
    with LocalCluster(shards=2, ucx_tls="tcp") as cluster:
        p, _ = torchrun(cluster, 1, "--reduction", "pre-reduced",
                        "--mismatch", f"1@{MISMATCH_STEP}")
        got, out = result_of(p)
        logs = [cluster.log_tail(i, 200) for i in range(2)]
    assert "terminate called" not in out and "SIGABRT" not in out, out[-4000:]
    errors = errors_of(p.stdout)
    assert sorted(errors) == [(0, 0), (0, 1)], out[-4000:]
    for (_, rank), error in errors.items():
        assert_mismatch(error, rank)
    # The new group re-joined at the step that failed, in a new worker generation (a new
    # communicator), redid it, and ended with the uninterrupted run's bits.
    joined = {int(r): int(s) for r, s in
              re.findall(r"zps\.torch rank (\d): joined the job at step (\d+) \(attempt 1\)", out)}
    assert joined == {0: MISMATCH_STEP, 1: MISMATCH_STEP}, out[-4000:]
    assert re.search(rf"re-joined the job at step {MISMATCH_STEP}: worker generation", logs[0]), logs
    assert got["result"]["attempt"] == 1 and got["result"]["steps"] == STEPS, got
    assert got["crcs"] == ref["crcs"], "not bit-identical to the uninterrupted run"


def test_ranks_that_issue_different_collectives_every_time_end_the_job_with_the_error():
    with LocalCluster(shards=2, ucx_tls="tcp") as cluster:
        p, _ = torchrun(cluster, 1, "--reduction", "pre-reduced",
                        "--mismatch", f"1@{MISMATCH_STEP}", "--mismatch-every-attempt")
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-4000:]
    assert "terminate called" not in out and "SIGABRT" not in out, out[-4000:]
    # Both attempts (--max_restarts 1) failed the same step on both ranks with the mismatch,
    # and torchrun gave up.
    errors = errors_of(p.stdout)
    assert sorted(errors) == [(0, 0), (0, 1), (1, 0), (1, 1)], out[-4000:]
    for (_, rank), error in errors.items():
        assert_mismatch(error, rank)
    assert not re.search(r'"result"', p.stdout), out[-4000:]
