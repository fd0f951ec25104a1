"""Checks on the losses zps-train prints, for the train scripts (collectives.sh,
quantized_grads.sh, quantized_weights.sh). Each run is NAME=PATH, PATH being the output of the
run's worker 0 (its "step N loss L" lines and its "held-out loss A -> B" line); the first run is
the baseline the others are held against. Prints one line a check; exits 1 if one fails.

  losses.py falls BASE RUN...
      The held-out loss of each RUN falls by at least half as much as BASE's: each run trains.
  losses.py agree TOL LABEL BASE RUN...
      Every logged training loss and both held-out losses of each RUN are within TOL of BASE's
      (runs whose summation orders differ).
"""

import re
import sys


def held_out(path):
    """(start, end) of the run's held-out loss."""
    for line in open(path):
        m = re.match(r"held-out loss (\S+) -> (\S+)", line)
        if m:
            return float(m.group(1)), float(m.group(2))
    raise SystemExit(f"{path}: no held-out loss")


def losses(path):
    """Every logged training loss, then the held-out loss at the start and at the end."""
    out = []
    for line in open(path):
        m = re.match(r"step\s+\d+\s+loss (\S+)", line)
        if m:
            out.append(float(m.group(1)))
        m = re.match(r"held-out loss (\S+) -> (\S+)", line)
        if m:
            out += [float(m.group(1)), float(m.group(2))]
    return out


def runs(args):
    return [tuple(a.split("=", 1)) for a in args]


def falls(base, *others):
    b0, b1 = held_out(base[1])
    ok = True
    for name, path in others:
        q0, q1 = held_out(path)
        r = (q0 - q1) / (b0 - b1)
        print(f"held-out loss: {name} {q0:.4f} -> {q1:.4f}, {base[0]} {b0:.4f} -> {b1:.4f}: "
              f"{r:.2f}x {base[0]}'s fall (at least 0.5)")
        ok &= r >= 0.5
    return ok


def agree(tol, label, base, *others):
    a = losses(base[1])
    worst = 0.0
    for name, path in others:
        b = losses(path)
        assert len(a) == len(b) and a, (base[0], a, name, b)
        worst = max(worst, max(abs(x - y) for x, y in zip(a, b)))
    print(f"{label}: {len(a)} losses, largest difference {worst:.2e} (tolerance {tol})")
    return worst <= float(tol)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "falls":
        ok = falls(*runs(sys.argv[2:]))
    elif what == "agree":
        ok = agree(sys.argv[2], sys.argv[3], *runs(sys.argv[4:]))
    else:
        raise SystemExit(f"unknown check {what!r}: falls or agree")
    sys.exit(0 if ok else 1)
