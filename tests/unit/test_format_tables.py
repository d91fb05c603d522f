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
