"""The package as pip installs it: `pip install ./python` into a fresh virtual environment of
Debian's python3 (--system-site-packages, for its torch), offline (--no-index
--no-build-isolation), then a script run from a directory outside the repository, with no
PYTHONPATH and no build tree named in the environment, imports zps.torch from the environment and
trains a small model for a few steps on an embedded cluster. The libzps_c.so it loads and the
zps-server it starts are the copies the installed package carries (python/setup.py)."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = """
import json

import torch

import zps
import zps.torch as zt
from zps import _native, cluster

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
x = torch.randn(64, 8)
y = x.sum(1, keepdim=True)
config = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
          "zps": {"shards": 1, "op_timeout_s": 60, "connect_timeout_s": 30}}
losses = []
with zt.initialize(model, config) as engine:
    for _ in range(8):
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        info = engine.step()
        losses.append(loss.item())
print(json.dumps({"result": {"zps": zps.__file__, "library": str(_native.library_path()),
                             "server": cluster.server_binary(), "step": info["step"],
                             "losses": losses}}))
"""

# What would let the script find zps or its native files other than through the installation.
_LOOKUP_VARS = ("PYTHONPATH", "ZPS_BUILD_DIR", "ZPS_NATIVE_LIB", "ZPS_SERVER")


def _build_dir():
    build = os.environ.get("ZPS_BUILD_DIR")
    return pathlib.Path(build) if build else ROOT / "build"


def test_pip_installed_package_trains_from_outside_the_repository(tmp_path):
    build = _build_dir()
    for built in (build / "lib" / "libzps_c.so", build / "bin" / "zps-server"):
        assert built.is_file(), f"{built} is missing: build zps first (./scripts/build.sh)"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=300)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in _LOOKUP_VARS}
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-index", "--no-build-isolation",
         "--no-cache-dir", "--disable-pip-version-check", str(ROOT / "python")],
        env=dict(env, ZPS_BUILD_DIR=str(build.resolve())), cwd=tmp_path,
        capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    # The install wrote nothing into the source tree (setuptools' build dirs go elsewhere).
    assert not (ROOT / "python" / "build").exists()
    assert not list((ROOT / "python").glob("*.egg-info"))

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "train.py").write_text(SCRIPT)
    p = subprocess.run([str(python), "train.py"], env=env, cwd=outside, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    results = [json.loads(l) for l in p.stdout.splitlines() if l.startswith('{"result"')]
    assert len(results) == 1, p.stdout[-3000:]
    r = results[0]["result"]
    site = venv.resolve()
    for key in ("zps", "library", "server"):
        path = pathlib.Path(r[key]).resolve()
        assert site in path.parents, f"{key} {path} is not the installed package's"
    assert r["step"] == 7, r
    assert r["losses"][-1] < 0.8 * r["losses"][0], r
