"""An embedded local zps cluster: N `zps-server` shard processes on loopback, started by the
training script itself when its config names no endpoint (as `zps-train` does with none).

    with LocalCluster(shards=2) as cluster:
        cluster.endpoint, cluster.token   # what a worker connects with

The server binary is, in order: $ZPS_SERVER, the copy an installed package carries
(`zps/bin/zps-server`, setup.py), the build tree's (`$ZPS_BUILD_DIR/bin/zps-server`, by default
`build/` beside `python/`), or `zps-server` on PATH. Their logs
and data live in a temporary directory that is removed at close unless `keep_dir` is set. The
cluster stops its shards on close(), at interpreter exit, and when the owning process dies
(each shard gets PR_SET_PDEATHSIG), so a crashed script leaves no servers behind.
"""

import atexit
import ctypes
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from zps._errors import ZpsError
from zps.ports import free_ports


def server_binary() -> str:
    """The zps-server the embedded cluster runs (the order is in the module doc)."""
    env = os.environ.get("ZPS_SERVER")
    if env:
        return env
    here = pathlib.Path(__file__).resolve().parent
    bundled = here / "bin" / "zps-server"
    if bundled.exists():
        return str(bundled)
    build = os.environ.get("ZPS_BUILD_DIR", str(here.parent.parent / "build"))
    candidate = pathlib.Path(build) / "bin" / "zps-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("zps-server")
    if found:
        return found
    raise ZpsError("NOT_FOUND", f"zps-server not found ({candidate}, $ZPS_SERVER, PATH): "
                   "build zps first (./scripts/build.sh), or set ZPS_SERVER or ZPS_BUILD_DIR")


def _die_with_parent():
    # Runs in the child between fork and exec: SIGTERM when the parent thread exits.
    libc = ctypes.CDLL(None)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setpgid(0, 0)


class LocalCluster:
    def __init__(self, shards=1, ucx_tls="", memory_budget=0, serving_budget=0,
                 checkpoint_every=0, data_dir=None, keep_dir=False, log_level="warning",
                 threads=0):
        if shards < 1:
            raise ZpsError("INVALID_ARGUMENT", f"zps.shards must be >= 1, got {shards}")
        self.shards = shards
        self._owned_dir = data_dir is None
        self.dir = pathlib.Path(data_dir or tempfile.mkdtemp(prefix="zps-cluster-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self._keep = keep_dir
        self.token = secrets.token_hex(16)
        self.token_file = self.dir / "token"
        self.token_file.write_text(self.token)
        self.token_file.chmod(0o600)
        ports = free_ports(shards)
        self.endpoint = f"127.0.0.1:{ports[0]}"
        self.procs = []
        binary = server_binary()
        durable = memory_budget or serving_budget or checkpoint_every or data_dir
        for i in range(shards):
            args = [binary, f"--ordinal={i}", f"--shards={shards}", f"--port={ports[i]}",
                    "--bind=127.0.0.1", f"--token-file={self.token_file}", "--metrics-port=0",
                    f"--log-level={log_level}", f"--threads={threads}"]
            if i > 0:
                args.append(f"--coordinator={self.endpoint}")
            if ucx_tls:
                args.append(f"--ucx-tls={ucx_tls}")
            if durable:
                args.append(f"--data-dir={self.dir / f'shard-{i}-data'}")
            if memory_budget:
                args.append(f"--memory-budget={memory_budget}")
            if serving_budget:
                args.append(f"--serving-budget={serving_budget}")
            if checkpoint_every:
                args.append(f"--checkpoint-every={checkpoint_every}")
            log = open(self.dir / f"shard-{i}.log", "wb")
            self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL,
                                               preexec_fn=_die_with_parent))
            log.close()
        atexit.register(self.close)
        self._wait_listening(ports)

    def data_dirs(self):
        return [self.dir / f"shard-{i}-data" for i in range(self.shards)]

    def _wait_listening(self, ports, timeout=30.0):
        deadline = time.monotonic() + timeout
        for i, port in enumerate(ports):
            while True:
                if self.procs[i].poll() is not None:
                    raise ZpsError("UNAVAILABLE", f"embedded shard {i} exited with "
                                   f"{self.procs[i].returncode}: {self.log_tail(i)}")
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise ZpsError("UNAVAILABLE", f"embedded shard {i} did not listen on "
                                       f"port {port} within {timeout:.0f} s")
                    time.sleep(0.05)

    def log_tail(self, i, lines=5):
        try:
            text = (self.dir / f"shard-{i}.log").read_text(errors="replace").splitlines()
            return " | ".join(text[-lines:])
        except OSError:
            return "(no log)"

    def kill_shard(self, i, sig=signal.SIGKILL):
        """Tests: signals shard i (SIGKILL by default) and waits for it to exit."""
        self.procs[i].send_signal(sig)
        self.procs[i].wait()

    def close(self):
        procs, self.procs = self.procs, []
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if procs and self._owned_dir and not self._keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
