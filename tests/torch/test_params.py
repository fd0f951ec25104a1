"""A parameter's storage as zps.torch frees and regrows it (no cluster needed)."""

import os
import platform

import pytest
import torch

from zps.torch.params import ZParam, malloc_huge_pages_hint, storage_bytes


def _vm_flags(addr):
    """The VmFlags of the mapping of this process that holds `addr`."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


@pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"),
                    reason="no transparent huge pages in this kernel")
def test_a_regrown_large_storage_is_advised_huge_pages_and_a_small_one_is_not():
    big = torch.nn.Parameter(torch.zeros((16 << 20) // 4))  # 16 MiB
    small = torch.nn.Parameter(torch.zeros(1024))
    for p in (big, small):
        zp = ZParam(0, p, ["w"])
        zp.free()
        assert storage_bytes(p.data) == 0
        zp.regrow()
        assert storage_bytes(p.data) == zp.nbytes
        p.data.fill_(2.0)  # the regrown storage is usable
        assert float(p.data.sum()) == 2.0 * p.numel()
    assert "hg" in _vm_flags(big.data.data_ptr() + (8 << 20))
    assert "hg" not in _vm_flags(small.data.data_ptr())


@pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled")
                    or "[never]" in open("/sys/kernel/mm/transparent_hugepage/enabled").read()
                    or platform.libc_ver()[0] != "glibc",
                    reason="no transparent huge pages, or not glibc")
def test_the_malloc_hint_names_the_tunable_only_for_large_trainable_cpu_parameters(monkeypatch):
    big = ZParam(0, torch.nn.Parameter(torch.zeros((4 << 20) // 4)), ["big"])
    small = ZParam(1, torch.nn.Parameter(torch.zeros(1024)), ["small"])
    frozen = ZParam(2, torch.nn.Parameter(torch.zeros((4 << 20) // 4), requires_grad=False),
                    ["frozen"])
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert "GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in malloc_huge_pages_hint([small, big])
    assert malloc_huge_pages_hint([small, frozen]) is None
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
    assert malloc_huge_pages_hint([small, big]) is None
