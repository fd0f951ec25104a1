"""zps.ports: the loopback ports an embedded cluster or a test script draws (no cluster needed).

A port is handed out once per RESERVE_S seconds, by any process of this user: separate draws,
as a test script makes them (one `python3 -m zps.ports` per port), never meet. Without the
reservation file, 1,000 separate draws from the 22,767 ports below the ephemeral range repeat one
almost surely (the birthday bound: 1 - exp(-1000^2 / (2 x 22767)) > 0.9999).
"""

import os
import subprocess
import sys
import tempfile
import time

import pytest

from zps import ports


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """A temporary directory of this test's own: the reservation file starts empty."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def test_separate_draws_never_hand_out_a_port_twice(own_tmp):
    drawn = [ports.free_port() for _ in range(1000)]
    assert len(set(drawn)) == len(drawn)


def test_another_process_does_not_draw_the_ports_this_one_holds(own_tmp):
    mine = set(ports.free_ports(400))
    out = subprocess.run([sys.executable, "-m", "zps.ports", "400"], check=True,
                         capture_output=True, text=True).stdout.split()
    theirs = {int(p) for p in out}
    assert len(theirs) == 400
    assert not mine & theirs


def test_old_and_damaged_lines_are_dropped(own_tmp):
    path = own_tmp / ("zps-ports-%d" % os.getuid())
    old = time.time() - ports.RESERVE_S - 1
    path.write_text("12345 %.3f\nnot a line\n23456 %.3f\n" % (old, time.time()))
    port = ports.free_port()
    held = {int(line.split()[0]) for line in path.read_text().splitlines()}
    assert held == {23456, port}
