"""The kernels' constant tables come out of the plan's arena (`format_tables` in the decode
activations), so the engine's one allocation holds every device byte: the plan's region is
large enough for every format's table at its alignment, and install() refuses a short region."""

from __future__ import annotations

import numpy as np
import pytest

from strata.cuda_kernels import tables
from strata.cuda_kernels.qformats import FORMATS
from strata.plan.layout import FORMAT_TABLES_BYTES


def test_the_plans_region_holds_every_table():
    need = tables.tables_bytes()
    assert need <= FORMAT_TABLES_BYTES
    assert need >= sum(f.table.nbytes for f in FORMATS.values())  # every table is counted
    assert FORMAT_TABLES_BYTES - need < 16 * 1024  # and the region is not grossly oversized


def test_install_refuses_a_region_too_small():
    from numba import cuda

    short = cuda.to_device(np.zeros(tables.tables_bytes() - 1, np.uint8))
    with pytest.raises(ValueError, match="format tables need a uint8 region"):
        tables.install(short)
    wrong = cuda.to_device(np.zeros(tables.tables_bytes(), np.float32))
    with pytest.raises(ValueError, match="format tables need"):
        tables.install(wrong)


def test_install_lays_every_table_at_its_aligned_offset():
    from numba import cuda

    region = cuda.to_device(np.full(FORMAT_TABLES_BYTES, 0xAB, np.uint8))  # poisoned
    tables.install(region)
    got, off = region.copy_to_host(), 0
    for f in FORMATS.values():
        a = np.ascontiguousarray(f.table)
        np.testing.assert_array_equal(got[off:off + a.nbytes].view(a.dtype), a)
        off += -(-a.nbytes // tables.ALIGN) * tables.ALIGN
    assert got[off:off + 4].view(np.int32)[0] == 0  # the dummy


def test_uninstall_forgets_only_the_tables_in_the_region(monkeypatch):
    """What an engine's close() does before its arena is freed: entries whose memory lies in the
    region go, others stay (addresses stand in for device pointers here)."""
    from types import SimpleNamespace

    def at(addr, n=4):
        return SimpleNamespace(device_ctypes_pointer=SimpleNamespace(value=addr), nbytes=n)

    monkeypatch.setattr(tables, "SIMULATED", False)
    monkeypatch.setattr(tables, "_TABLES", {(1, 7): at(1000), (1, "dummy_i32"): at(1256),
                                            (2, 7): at(9000), (1, 8): at(5000)})
    tables.uninstall(at(1000, 512))  # [1000, 1512)
    assert sorted(tables._TABLES, key=str) == [(1, 8), (2, 7)]
