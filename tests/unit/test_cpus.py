"""`strata.cpus` on an OS without Linux's affinity mask and load average (Windows): the host
dequantization's thread pool and the CPU bench's record still work (they called
`os.sched_getaffinity` / `os.getloadavg`, which raised there)."""

from __future__ import annotations

import os

import numpy as np

from strata import cpus
from strata.quant import dequant
from strata.quant.random_blocks import random_blocks
from strata.quant.types import quant_type


def test_the_counts_where_linux_has_them():
    if hasattr(os, "sched_getaffinity"):
        assert cpus.usable_cpus() == len(os.sched_getaffinity(0))
    load = cpus.load_average()
    assert load is None or (len(load) == 3 and all(v >= 0 for v in load))


def test_without_the_linux_calls(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.delattr(os, "getloadavg", raising=False)
    assert cpus.usable_cpus() == max(1, os.cpu_count() or 1)
    assert cpus.load_average() is None
    monkeypatch.setattr(dequant, "_POOL", None)  # made afresh, as on a first call there
    q = quant_type("Q4_K")
    n_values = 4 * dequant._CHUNK_VALUES  # large enough for the pool
    raw = random_blocks(q.ggml_type, n_values // q.block_size, np.random.default_rng(3))
    out = dequant.dequantize(raw, q.ggml_type)
    assert out.size == n_values and np.isfinite(out).all()
    from gguf.quants import dequantize as reference
    np.testing.assert_array_equal(out.ravel(), reference(raw, q.ggml_type).ravel())
