"""Bandwidth-centric fetches of quantized weights under torchrun at 2 ranks
(quantized_gather_script.py): the ranks all-gather their slices as int8 block records and
dequantize after the gather, so the job trains to exactly the weights of direct fetches (both
with the C library dequantizing and with the records kept for torch ops), and the all-gather
carries under 0.35x of the bytes of the same job's fp32 serving copy (what the gather of a
quantized job carried when it all-gathered the dequantized fp32 slices)."""

import json
import os
import pathlib
import subprocess

from torchrun_args import torchrun_command

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_bandwidth_centric_gathers_int8_records_to_the_bits_of_direct_fetches():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    cmd = [*torchrun_command(2), str(HERE / "quantized_gather_script.py"), "--steps", "4"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    lines = [json.loads(l[l.index("{"):]) for l in p.stdout.splitlines() if '{"result"' in l]
    assert len(lines) == 1, out[-4000:]
    runs = lines[0]["runs"]
    direct = runs["int8 direct"]
    for name in ("int8 bandwidth-centric", "int8 bandwidth-centric kept"):
        assert runs[name]["equal"], (name, runs[name])
        assert runs[name]["losses"] == direct["losses"], (name, runs)
    assert direct["gather_bytes_per_step"] == 0
    q = runs["int8 bandwidth-centric"]["gather_bytes_per_step"]
    assert q == runs["int8 bandwidth-centric kept"]["gather_bytes_per_step"]
    fp32 = runs["fp32 bandwidth-centric"]["gather_bytes_per_step"]
    assert 0 < q < 0.35 * fp32, runs
    print(json.dumps({k: v["gather_bytes_per_step"] for k, v in runs.items()}))
