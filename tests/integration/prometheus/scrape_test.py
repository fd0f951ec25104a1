#!/usr/bin/env python3
"""The real Prometheus scrape test (issue 5, item 3).

Starts `zps-train` in local mode (2 zps-server shards + 2 workers on 127.0.0.1) with metrics on,
runs Debian's `prometheus` against it (job zps-server for the shards, zps-worker for the workers,
scrape_interval 1s), and while the cluster trains:
  - runs `promtool check metrics` on every /metrics body (must be clean),
  - checks /healthz and /readyz on every process,
  - evaluates every panel query and template-variable query of helm/zps/dashboards/*.json through
    the Prometheus HTTP API (variables substituted as docs/metrics.md says) and requires data,
  - requires a few key series to carry live values (fetch and push traffic, steps committed).
The shards run with most of their state and serving copies spilled (--shard-memory-budget,
--shard-serving-budget: each shard gets a --data-dir with O_DIRECT spill files) and checkpoint
every CHECKPOINT_EVERY steps (ZPS_CHECKPOINT_EVERY, which every zps-server reads), so the NVMe,
spill and checkpoint panels must show non-zero, finite values on every shard (NONZERO_PANELS),
not only present series: a panel fed only zeros (or a 0/0 = NaN mean) fails the test. The job
updates speculatively (--update speculative), so the speculation counter must show chunks both
published from a speculation and updated at the commit on every shard.
Everything listens on 127.0.0.1; every process is stopped on any exit. Fails, never skips, when
something (a binary, a series, a panel named below) is missing.

usage: scrape_test.py BINDIR SOURCE_DIR
"""
import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

DEADLINE = time.monotonic() + 110  # hard bound on the whole test (ctest TIMEOUT is 150)
SHARDS, WORKERS = 2, 2
RATE_INTERVAL = "15s"
CHECKPOINT_EVERY = 4
# Spill as in integration.bit_identity.spill_serving (docs/nvme.md): 2048-element chunks; a
# 168 KiB state budget holds the pipeline's 5 buffers + 2 chunks, a 44 KiB serving budget the
# 4 fetch staging buffers + 5 pipeline buffers + 2 copies; every other chunk lives on disk.
# The job updates speculatively (zps_speculative_chunks_total): a quarter of the state budget
# goes to spare sets (docs/architecture.md), so 224 KiB leaves the store the 168 KiB above and
# 56 KiB for 2 spares of a 2048-element chunk (14 B an element): some chunks are speculated
# (published), the rest updated at the commit (sync).
SPILL_ARGS = ["--chunk-elems", "2048", "--shard-memory-budget", "224KiB",
              "--shard-serving-budget", "44KiB", "--update", "speculative"]
# Panels whose every series must be finite and non-zero, and which must have one series per
# shard where the panel is "by shard" (title ends so). Each title must exist in the dashboards.
NONZERO_PANELS = [
    "NVMe throughput by shard",
    "Spilled serving copies: NVMe throughput by shard",
    "Fetches of spilled serving copies",
    "Checkpoint age by shard",
    "Mean checkpoint duration by shard",
    "Last checkpoint age",
    "Memory by tier",
]
# A checkpoint age at least this large means a timestamp of 0 (the panels' "never" value).
NEVER_AGE_S = 1e9
procs = []  # (name, Popen)
tmp = tempfile.mkdtemp(prefix="zps-prom-")


def log(msg):
    print(f"[scrape-test {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def fail(msg):
    log("FAIL: " + msg)
    sys.exit(1)


def descendants(pid):
    """Every live process below `pid` (the local cluster's shards and workers)."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def cleanup():
    for name, p in reversed(procs):
        if p.poll() is not None:
            continue
        below = descendants(p.pid)
        p.send_signal(signal.SIGTERM)  # zps-train stops its shards and workers itself
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        for pid in below:  # anything the parent did not reap in time
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    shutil.rmtree(tmp, ignore_errors=True)


atexit.register(cleanup)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, lambda s, f: sys.exit(128 + s))


def free_port_block(n):
    """A base port such that base..base+n-1 are all free on 127.0.0.1 right now."""
    for _ in range(200):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
        s.close()
        if base + n > 65535:
            continue
        held, ok = [], True
        for p in range(base, base + n):
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", p))
                held.append(t)
            except OSError:
                ok = False
                t.close()
                break
        for t in held:
            t.close()
        if ok:
            return base
    fail("no block of free ports")


def http_get(url, timeout=3):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def http_status(url):
    try:
        return http_get(url)[0]
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def wait_for(what, pred, timeout):
    end = min(time.monotonic() + timeout, DEADLINE)
    while time.monotonic() < end:
        check_alive()
        v = pred()
        if v:
            return v
        time.sleep(0.25)
    fail(f"timed out waiting for {what}")


def check_alive():
    for name, p in procs:
        if p.poll() is not None:
            out = ""
            if name == "zps-train":
                out = open(os.path.join(tmp, "train.log")).read()[-3000:]
            fail(f"{name} exited early with {p.returncode}\n{out}")


def prom_query(prom, expr):
    url = f"http://127.0.0.1:{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    _, body = http_get(url, timeout=5)
    r = json.loads(body)
    if r.get("status") != "success":
        fail(f"query failed: {expr}: {r}")
    return r["data"]["result"]


def substitute(expr):
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    return re.sub(r"\$\{?(namespace|instance)\}?", ".*", expr)


def dashboard_queries(src):
    """(description, kind, expr, panel title or None) for every panel target and query variable
    of every dashboard."""
    out = []
    ddir = os.path.join(src, "helm", "zps", "dashboards")
    files = sorted(f for f in os.listdir(ddir) if f.endswith(".json"))
    if not files:
        fail("no dashboards in " + ddir)

    def walk(panels, fname):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((f"{fname}: panel '{p.get('title')}'", "expr", t["expr"],
                                p.get("title")))
            walk(p.get("panels", []), fname)

    for f in files:
        d = json.load(open(os.path.join(ddir, f)))
        walk(d.get("panels", []), f)
        for v in d.get("templating", {}).get("list", []):
            if v.get("type") != "query":
                continue
            q = v.get("query")
            q = q.get("query") if isinstance(q, dict) else q
            out.append((f"{f}: variable '{v.get('name')}'", "variable", q, None))
    return out


def nonzero_problems(title, result):
    """Why a NONZERO_PANELS panel's query result is not live data ("" when it is)."""
    values = {}
    for r in result:
        labels = r["metric"]
        key = labels.get("instance") or labels.get("tier") or labels.get("source") or "value"
        values[key] = float(r["value"][1])
    if title.endswith("by shard") and len(values) != SHARDS:
        return f"{len(values)} series, expected one per shard ({SHARDS})"
    if title == "Memory by tier":
        want = {"master", "optimizer_state", "serving", "nvme"}
        if set(values) != want:
            return f"tiers {sorted(values)}, expected {sorted(want)}"
    if title == "Fetches of spilled serving copies" and values.get("nvme", 0) <= 0:
        return f"no fetches read from NVMe: {values}"
    for k, v in values.items():
        if v != v or v in (float("inf"), float("-inf")):
            return f"{k} = {v} (not finite)"
        # A fetch served from the cache needs two fetches of one chunk close together: by source,
        # only "nvme" (checked above) must be live.
        if title == "Fetches of spilled serving copies":
            continue
        if v <= 0:
            return f"{k} = {v} (expected > 0)"
        if "checkpoint age" in title.lower() and v >= NEVER_AGE_S:
            return f"{k} = {v} s: a zero timestamp (no checkpoint)"
    return ""


def main():
    if len(sys.argv) != 3:
        fail("usage: scrape_test.py BINDIR SOURCE_DIR")
    bindir, src = sys.argv[1], sys.argv[2]
    train = os.path.join(bindir, "zps-train")
    for exe in (train, os.path.join(bindir, "zps-server")):
        if not os.access(exe, os.X_OK):
            fail(f"{exe} is not built")
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prometheus or not promtool:
        fail("prometheus/promtool not installed (Debian package prometheus; scripts/install-deps.sh)")

    base = free_port_block(SHARDS + WORKERS)
    shard_ports = [base + i for i in range(SHARDS)]
    worker_ports = [base + SHARDS + r for r in range(WORKERS)]
    prom_port = free_port_block(1)

    # A small model, enough steps to outlast the checks; stopped (SIGTERM) once they pass.
    cmd = [train, "--steps", "100000", "--d-model", "64", "--n-layers", "2", "--log-every", "20",
           f"--shards={SHARDS}", f"--world-size={WORKERS}", f"--metrics-port={base}"] + SPILL_ARGS
    env = dict(os.environ, ZPS_CHECKPOINT_EVERY=str(CHECKPOINT_EVERY))
    log(f"starting ZPS_CHECKPOINT_EVERY={CHECKPOINT_EVERY} " + " ".join(cmd))
    procs.append(("zps-train", subprocess.Popen(
        cmd, env=env, stdout=open(os.path.join(tmp, "train.log"), "w"),
        stderr=subprocess.STDOUT)))

    cfg = os.path.join(tmp, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: zps-server
    static_configs:
      - targets: [{", ".join(f"'127.0.0.1:{p}'" for p in shard_ports)}]
        labels: {{namespace: zps-test}}
  - job_name: zps-worker
    static_configs:
      - targets: [{", ".join(f"'127.0.0.1:{p}'" for p in worker_ports)}]
        labels: {{namespace: zps-test}}
""")
    subprocess.run([promtool, "check", "config", cfg], check=True, stdout=subprocess.DEVNULL)
    procs.append(("prometheus", subprocess.Popen(
        [prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={tmp}/data",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        stdout=open(os.path.join(tmp, "prometheus.log"), "w"), stderr=subprocess.STDOUT)))

    # Every process serves /healthz; /readyz turns 200 once the layout is loaded / the job joined.
    for p in shard_ports + worker_ports:
        wait_for(f"/healthz on {p}", lambda: http_status(f"http://127.0.0.1:{p}/healthz") == 200, 60)
        wait_for(f"/readyz on {p}", lambda: http_status(f"http://127.0.0.1:{p}/readyz") == 200, 60)
        if http_status(f"http://127.0.0.1:{p}/nope") != 404:
            fail(f"port {p}: an unknown path is not 404")
    log("all /healthz and /readyz are 200")
    wait_for("prometheus ready", lambda: http_status(f"http://127.0.0.1:{prom_port}/-/ready") == 200, 30)

    # Training is under way: a few committed steps, seen by Prometheus.
    def steps_seen():
        r = prom_query(prom_port, 'min(zps_current_step{job="zps-server"})')
        return r and float(r[0]["value"][1]) >= 3
    wait_for("3 committed steps scraped", steps_seen, 60)

    # Every shard has finished a checkpoint (the checkpoint panels' source), seen by Prometheus.
    def checkpoints_seen():
        r = prom_query(prom_port, 'count(zps_checkpoint_last_success_timestamp_seconds'
                                  '{job="zps-server"} > 0)')
        return r and float(r[0]["value"][1]) == SHARDS
    wait_for("a checkpoint on every shard scraped", checkpoints_seen, 60)
    time.sleep(5)  # several scrapes of live traffic inside the rate window

    for p in shard_ports + worker_ports:
        _, body = http_get(f"http://127.0.0.1:{p}/metrics")
        r = subprocess.run([promtool, "check", "metrics"], input=body, text=True,
                           capture_output=True)
        if r.returncode != 0 or r.stdout.strip() or r.stderr.strip():
            fail(f"promtool check metrics on port {p}:\n{r.stdout}{r.stderr}")
    log(f"promtool check metrics clean on {len(shard_ports + worker_ports)} endpoints")

    check_alive()
    missing, zero = [], []
    queries = dashboard_queries(src)
    titles = {t for _, _, _, t in queries if t}
    for t in NONZERO_PANELS:
        if t not in titles:
            fail(f"panel '{t}' (NONZERO_PANELS) is not in the dashboards: update this test")
    for desc, kind, q, title in queries:
        if kind == "variable":
            m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", q)
            if not m:
                fail(f"{desc}: unsupported variable query {q}")
            match, label = substitute(m.group(1)), m.group(2)
            url = (f"http://127.0.0.1:{prom_port}/api/v1/label/{label}/values?" +
                   urllib.parse.urlencode({"match[]": match}))
            data = json.loads(http_get(url)[1])["data"]
        else:
            data = prom_query(prom_port, substitute(q))
        if not data:
            missing.append(f"{desc}: {q}")
        elif title in NONZERO_PANELS:
            bad = nonzero_problems(title, data)
            if bad:
                zero.append(f"{desc}: {q}: {bad}")
    if missing:
        fail("queries without data:\n  " + "\n  ".join(missing))
    if zero:
        fail("spill/checkpoint panels without live values:\n  " + "\n  ".join(zero))
    log(f"all {len(queries)} dashboard queries returned data; "
        f"{len(NONZERO_PANELS)} spill/checkpoint panels non-zero on every shard")

    # Live values, not just registered series.
    live = {
        'sum(up{job="zps-server"})': lambda v: v == SHARDS,
        'sum(up{job="zps-worker"})': lambda v: v == WORKERS,
        'sum(rate(zps_fetch_bytes_total{job="zps-server"}[15s]))': lambda v: v > 0,
        'sum(rate(zps_push_bytes_total{job="zps-server"}[15s]))': lambda v: v > 0,
        'sum(rate(zps_fetch_bytes_total{job="zps-worker"}[15s]))': lambda v: v > 0,
        'max(rate(zps_current_step{job="zps-server"}[15s]))': lambda v: v > 0,
        'max(zps_connected_workers{job="zps-server"})': lambda v: v == WORKERS,
        'sum(zps_optimizer_bytes_total{job="zps-server"})': lambda v: v > 0,
        'sum(zps_step_duration_seconds_count{job="zps-server"})': lambda v: v > 0,
        'sum(zps_request_duration_seconds_count{job="zps-server", op="fetch"})': lambda v: v > 0,
        'sum(zps_request_duration_seconds_count{job="zps-server", op="control"})': lambda v: v > 0,
        'sum(zps_memory_bytes{job="zps-server", tier="master"})': lambda v: v > 0,
        # State bytes per element held (fp32 Adam moments, bf16 serving copies): 14.
        'sum(zps_shard_state_bytes{job="zps-server", kind=~"master|m|v|scales|serving"}) / '
        '(sum(zps_shard_state_bytes{job="zps-server", kind="master"}) / 4)': lambda v: v == 14,
        'min(zps_shard_state_bytes{job="zps-server", kind="grad"})': lambda v: v > 0,
        'count(zps_ucx_transport_info{job="zps-server"} == 1)': lambda v: v >= 1,
        'sum(zps_protocol_errors_total{job="zps-server"})': lambda v: v == 0,
        # Spill and checkpoints, per shard (min over the shards).
        'min(rate(zps_nvme_read_bytes_total{job="zps-server"}[15s]))': lambda v: v > 0,
        'min(rate(zps_nvme_write_bytes_total{job="zps-server"}[15s]))': lambda v: v > 0,
        'min(rate(zps_nvme_serving_read_bytes_total{job="zps-server"}[15s]))': lambda v: v > 0,
        'min(rate(zps_nvme_serving_write_bytes_total{job="zps-server"}[15s]))': lambda v: v > 0,
        'min(zps_memory_bytes{job="zps-server", tier="nvme"})': lambda v: v > 0,
        'sum(zps_nvme_io_errors_total{job="zps-server"})': lambda v: v == 0,
        'sum(zps_spilled_fetches_total{job="zps-server", source="nvme"})': lambda v: v > 0,
        'min(zps_checkpoint_duration_seconds_count{job="zps-server"})': lambda v: v >= 1,
        'min(zps_checkpoint_last_success_timestamp_seconds{job="zps-server"})': lambda v: v > 0,
        # Speculation, per shard: spares in use, and chunks beyond them updated at the commit.
        'min(zps_speculative_chunks_total{job="zps-server", outcome="published"})': lambda v: v > 0,
        'min(zps_speculative_chunks_total{job="zps-server", outcome="sync"})': lambda v: v > 0,
        'sum(zps_speculative_chunks_total{job="zps-server", outcome="dropped"})': lambda v: v == 0,
        f'max(zps_current_step{{job="zps-server"}}) >= {CHECKPOINT_EVERY}': lambda v: v > 0,
    }
    for q, ok in live.items():
        r = prom_query(prom_port, q)
        if not r or not ok(float(r[0]["value"][1])):
            fail(f"{q} = {r}")
    log("live values OK; stopping the cluster")

    train_proc = procs[0][1]
    below = descendants(train_proc.pid)
    train_proc.send_signal(signal.SIGTERM)
    try:
        train_proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        fail("zps-train did not stop within 20 s of SIGTERM")
    time.sleep(0.5)
    left = [p for p in below if os.path.exists(f"/proc/{p}")]
    if left:
        fail(f"processes left after zps-train stopped: {left}")
    log("PASS")


if __name__ == "__main__":
    main()
