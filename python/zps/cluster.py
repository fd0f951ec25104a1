"""An embedded local zps cluster: N `zps-server` shard processes on loopback, started by the
training script itself when its config names no endpoint (as `zps-train` does with none).

    with LocalCluster(shards=2) as cluster:
        cluster.endpoint, cluster.token   # what a worker connects with

The server binary is, in order: $ZPS_SERVER, the copy an installed package carries
(`zps/bin/zps-server`, setup.py), the build tree's (`$ZPS_BUILD_DIR/bin/zps-server`, by default
`build/` beside `python/`), or `zps-server` on PATH. Their logs and data (spill files,
checkpoints) live in `data_dir`, or else in a new directory under the temporary directory
(TMPDIR, as tempfile has it), which close() removes unless `keep_dir` is set or a shard stopped
on its own: then it is kept, and its path logged, for the user to read the shards' logs. The
cluster stops its shards on close(), at interpreter exit, and when the owning process dies
(each shard gets PR_SET_PDEATHSIG), so a crashed script leaves no servers behind.

A shard that exits while the cluster runs is reported by stopped(): a ShardStopped error with
the shard's own status (the last line zps-server printed), its exit code or signal, and its log
(zps._native.Client asks before and after each call, so the next call raises it).
"""

import atexit
import ctypes
import logging
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

from zps._errors import ShardStopped, ZpsError
from zps.ports import free_ports

_log = logging.getLogger(__name__)

# What zps-server prints before it exits with a failure (server/programs/zps_server.cc).
_STATUS_LINE = re.compile(r"^zps-server: ([A-Z_]+): (.*)$")
# Errors of a call that can be the first sign of a shard's exit: the shards then get a moment to
# be seen exiting before the call's own error is raised instead.
_LOST_PEER_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "ABORTED",
                              "INTERNAL", "UNKNOWN", "DATA_LOSS"})


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
                 threads=0, serving_copies="stored"):
        if shards < 1:
            raise ZpsError("INVALID_ARGUMENT", f"zps.shards must be >= 1, got {shards}")
        self.shards = shards
        self._owned_dir = data_dir is None
        self.dir = pathlib.Path(data_dir or tempfile.mkdtemp(prefix="zps-cluster-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self._keep = keep_dir
        self._failed = False     # a shard stopped on its own: close() keeps the directory
        self._killed = set()     # shards stopped by kill_shard (a test's own doing)
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
            if serving_copies != "stored":
                args.append(f"--serving-copies={serving_copies}")
            if checkpoint_every:
                args.append(f"--checkpoint-every={checkpoint_every}")
            log = open(self.dir / f"shard-{i}.log", "wb")
            self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL,
                                               preexec_fn=_die_with_parent))
            log.close()
        # One thread per shard waits for its exit, so that stopped(), asked before every call
        # into the library, costs a flag read while every shard runs (a waitpid per shard per
        # call would cost tens of microseconds).
        self._exited = threading.Event()
        for i, p in enumerate(self.procs):
            threading.Thread(target=self._await_exit, args=(p,), name=f"zps-shard-{i}-exit",
                             daemon=True).start()
        atexit.register(self.close)
        try:
            self._wait_listening(ports)
        except BaseException:
            self.close()  # a shard that stopped keeps the directory
            raise

    def _await_exit(self, proc):
        proc.wait()
        self._exited.set()

    def data_dirs(self):
        return [self.dir / f"shard-{i}-data" for i in range(self.shards)]

    def _wait_listening(self, ports, timeout=30.0):
        deadline = time.monotonic() + timeout
        for i, port in enumerate(ports):
            while True:
                if self.procs[i].poll() is not None:
                    self._exited.wait(5.0)  # its exit thread has reaped it, or is about to
                    raise self.stopped() or ZpsError(
                        "UNAVAILABLE", f"embedded shard {i} exited with "
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

    def log_path(self, i):
        return self.dir / f"shard-{i}.log"

    def shard_status(self, i):
        """Shard i's own "CODE: message", the last one zps-server printed in its log ("" if
        none)."""
        try:
            lines = self.log_path(i).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        for line in reversed(lines):
            m = _STATUS_LINE.match(line.strip())
            if m:
                return f"{m.group(1)}: {m.group(2)}"
        return ""

    def stopped(self, error=None, grace_s=5.0):
        """None while every shard runs (or after close()). Once one has exited: the ShardStopped
        error that says why, for the shard that left a status (else the lowest ordinal), and the
        cluster keeps its directory at close(). `error`: the failed call that asks; when it may
        be the first sign of a shard's exit (UNAVAILABLE, DEADLINE_EXCEEDED, ...), the shards
        get up to `grace_s` seconds to be seen exiting (a coordinator that fails stays up 2 s to
        tell the workers why). Cheap while every shard runs: a flag read."""
        procs = self.procs
        if not procs:
            return None
        if not self._exited.is_set():
            if error is None or getattr(error, "code", "") not in _LOST_PEER_CODES:
                return None
            if not self._exited.wait(grace_s):
                return None
        # A shard's exit thread sets its returncode before the flag.
        dead = [i for i, p in enumerate(procs) if p.returncode is not None]
        if not dead:
            return None
        if any(i not in self._killed for i in dead):
            self._failed = True
        statuses = {i: self.shard_status(i) for i in dead}
        i = next((i for i in dead if statuses[i]), dead[0])
        rc = procs[i].returncode
        if rc < 0:
            try:
                how = f"was killed by signal {signal.Signals(-rc).name}"
            except ValueError:
                how = f"was killed by signal {-rc}"
        else:
            how = f"exited with code {rc}"
        status = statuses[i]
        code = status.split(":", 1)[0] if status else "UNAVAILABLE"
        tail = self.log_tail(i)
        detail = status or ("it printed no status" + (f"; last lines: {tail}" if tail else ""))
        others = [j for j in dead if j != i]
        also = f" (shard {', '.join(map(str, others))} stopped too)" if others else ""
        keeping = self._failed or self._keep or not self._owned_dir
        where = f"the cluster directory {self.dir} is kept" if keeping else f"logs in {self.dir}"
        message = (f"{code}: embedded shard {i} {how}: {detail}{also}; its log: "
                   f"{self.log_path(i)}; {where}")
        return ShardStopped(code, message, shard=i, returncode=rc, status=status,
                            log_path=str(self.log_path(i)), cluster_dir=str(self.dir))

    def kill_shard(self, i, sig=signal.SIGKILL):
        """Tests: signals shard i (SIGKILL by default) and waits for it to exit. A shard stopped
        this way is reported by stopped() but is no reason to keep the directory."""
        self._killed.add(i)
        self.procs[i].send_signal(sig)
        self.procs[i].wait()

    def close(self):
        procs, self.procs = self.procs, []
        for i, p in enumerate(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            elif i not in self._killed:
                self._failed = True  # it stopped before it was asked to
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if not procs or not self._owned_dir:
            return
        if self._failed:
            _log.warning("zps: an embedded shard stopped on its own; the cluster directory %s "
                         "is kept (shard-N.log are the shards' logs)", self.dir)
        elif not self._keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
