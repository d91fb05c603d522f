"""The dense weights' upload (`strata.engine.cuda.hostmem.upload`) under numba's CUDA simulator:
pieces of many sizes (empty, under and over a staging buffer, split over threads or not) land
byte for byte in their device views, whatever the thread count."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from strata.engine.cuda import hostmem


@pytest.mark.parametrize("n_threads", [1, 3])
def test_upload_copies_every_piece_exactly(monkeypatch, n_threads):
    monkeypatch.setattr(hostmem, "STAGE_BYTES", 1000)  # many stage turns
    monkeypatch.setattr(hostmem, "SPLIT_BYTES", 64)    # most chunks on several threads
    rng = np.random.default_rng(7)
    sizes = [0, 1, 63, 64, 999, 1000, 1001, 2500, 7]
    srcs = [rng.integers(1, 256, n, dtype=np.uint8) for n in sizes]  # [n] u8, never zero
    dsts = [cuda.to_device(np.zeros(n, np.uint8)) for n in sizes]
    stream = cuda.stream()
    total, secs = hostmem.upload(list(zip(dsts, srcs)), stream, progress=False,
                                 n_threads=n_threads)
    assert total == sum(sizes) and secs >= 0
    for d, s in zip(dsts, srcs):
        np.testing.assert_array_equal(d.copy_to_host(), s)


def test_a_failed_slice_is_raised(monkeypatch):
    """A slice's copy that fails on a worker thread is the upload's failure, not skipped."""
    monkeypatch.setattr(hostmem, "SPLIT_BYTES", 8)
    buf = np.zeros(100, np.uint8)
    src = np.ones(100, np.float64)  # unsafe cast: np.copyto refuses
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(4) as pool, pytest.raises(TypeError):
        hostmem._fill(buf, src, pool, 4)
