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
Everything listens on 127.0.0.1; every process is stopped on any exit. Fails, never skips, when
something (a binary, a series) is missing.

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
    """(description, kind, expr) for every panel target and query variable of every dashboard."""
    out = []
    ddir = os.path.join(src, "helm", "zps", "dashboards")
    files = sorted(f for f in os.listdir(ddir) if f.endswith(".json"))
    if not files:
        fail("no dashboards in " + ddir)

    def walk(panels, fname):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((f"{fname}: panel '{p.get('title')}'", "expr", t["expr"]))
            walk(p.get("panels", []), fname)

    for f in files:
        d = json.load(open(os.path.join(ddir, f)))
        walk(d.get("panels", []), f)
        for v in d.get("templating", {}).get("list", []):
            if v.get("type") != "query":
                continue
            q = v.get("query")
            q = q.get("query") if isinstance(q, dict) else q
            out.append((f"{f}: variable '{v.get('name')}'", "variable", q))
    return out


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
           f"--shards={SHARDS}", f"--world-size={WORKERS}", f"--metrics-port={base}"]
    log("starting " + " ".join(cmd))
    procs.append(("zps-train", subprocess.Popen(
        cmd, stdout=open(os.path.join(tmp, "train.log"), "w"), stderr=subprocess.STDOUT)))

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
    time.sleep(5)  # several scrapes of live traffic inside the rate window

    for p in shard_ports + worker_ports:
        _, body = http_get(f"http://127.0.0.1:{p}/metrics")
        r = subprocess.run([promtool, "check", "metrics"], input=body, text=True,
                           capture_output=True)
        if r.returncode != 0 or r.stdout.strip() or r.stderr.strip():
            fail(f"promtool check metrics on port {p}:\n{r.stdout}{r.stderr}")
    log(f"promtool check metrics clean on {len(shard_ports + worker_ports)} endpoints")

    check_alive()
    missing = []
    queries = dashboard_queries(src)
    for desc, kind, q in queries:
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
    if missing:
        fail("queries without data:\n  " + "\n  ".join(missing))
    log(f"all {len(queries)} dashboard queries returned data")

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
        'count(zps_ucx_transport_info{job="zps-server"} == 1)': lambda v: v >= 1,
        'sum(zps_protocol_errors_total{job="zps-server"})': lambda v: v == 0,
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
