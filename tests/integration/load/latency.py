#!/usr/bin/env python3
"""Adds the workers' latency histograms (zps-train --print-latency lines on stdin:
"latency <rank> <fetch|push|step> <count> <sum_s> <le>:<n> ... +Inf:<n>", per-bucket counts) and
prints p50 and p99 of each, read off the summed buckets as Prometheus' histogram_quantile does
(linear within the bucket that holds the quantile; the buckets double, so a quantile is known
to within its bucket: [le/2, le]). Usage: latency.py RUN_NAME < outputs"""
import sys


def quantile(q, bounds, counts):
    total = sum(counts)
    if total == 0:
        return float("nan")
    rank = q * total
    seen = 0
    lower = 0.0
    for le, n in zip(bounds, counts):
        if n > 0 and seen + n >= rank:
            if le == float("inf"):
                return lower  # beyond the last bound: its lower edge, as histogram_quantile
            return lower + (le - lower) * (rank - seen) / n
        seen += n
        lower = le
    return lower


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "run"
    hist = {}
    for line in sys.stdin:
        f = line.split()
        if len(f) < 6 or f[0] != "latency":
            continue
        what, count, total = f[2], int(f[3]), float(f[4])
        bounds, counts = [], []
        for b in f[5:]:
            le, n = b.rsplit(":", 1)
            bounds.append(float("inf") if le == "+Inf" else float(le))
            counts.append(int(n))
        h = hist.setdefault(what, {"count": 0, "sum": 0.0, "bounds": bounds, "counts": [0] * len(counts), "ranks": 0})
        if h["bounds"] != bounds:
            sys.exit(f"latency.py: ranks disagree on the {what} buckets")
        h["count"] += count
        h["sum"] += total
        h["ranks"] += 1
        h["counts"] = [a + b for a, b in zip(h["counts"], counts)]
    for what in ("fetch", "push", "step"):
        h = hist.get(what)
        if not h or h["count"] == 0:
            sys.exit(f"latency.py: no {what} observations")
        p50 = quantile(0.50, h["bounds"], h["counts"])
        p99 = quantile(0.99, h["bounds"], h["counts"])
        mean = h["sum"] / h["count"]
        unit, scale = ("s", 1.0) if what == "step" else ("ms", 1e3)
        label = "step time" if what == "step" else f"{what} request"
        print(f"   {name:6s} {label:14s} p50 {p50 * scale:9.3f} {unit}  p99 {p99 * scale:9.3f} {unit}"
              f"  mean {mean * scale:9.3f} {unit}  ({h['count']} over {h['ranks']} ranks)")
        print(f"latency_summary {name} {what} {p50:.6g} {p99:.6g} {mean:.6g} {h['count']}")


if __name__ == "__main__":
    main()
