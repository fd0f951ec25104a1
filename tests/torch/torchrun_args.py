"""torchrun's launch flags for the tests: a rendezvous of the test's own on a free loopback port
(not --standalone's fixed port 29400: another torchrun on the machine, e.g. a test running
beside this one, may hold it, and its agent would then be joined), and --redirects 2 --tee 2
(torch 1.13's torchrun on Python 3.11 cannot parse its default "0": IntFlag iteration skips
NONE; these values parse on every version, docs/pytorch.md)."""

import sys
import uuid

from zps.ports import free_port


def torchrun_command(nproc, *extra):
    """The command line up to the script: python -m torch.distributed.run with a fresh
    rendezvous for nproc local ranks, then the extra torchrun flags."""
    port = free_port()
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id=zps-{uuid.uuid4().hex}",
            f"--nproc_per_node={nproc}", "--redirects", "2", "--tee", "2", *extra]
