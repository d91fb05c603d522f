"""The count form of the grid barrier (`gridsync.count_*`, the fused MoE's): its 64-bit count over
the two int32 words, the 2^32 a launch adds whatever its grid, the target a block waits for, and
the count's wrap. A barrier over one block only here: the simulator runs blocks one after
another, so a barrier across several never opens (tests/gpu/test_kernels_decode_gpu.py runs it
on a GPU); arrivals alone run over several."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from strata.cuda_kernels.gridsync import count_arrive, count_target, count_wait
from strata.cuda_kernels.ordered import ld_acquire64

LAUNCH = 1 << 32  # what every launch adds to the count


def _words(count: int) -> np.ndarray:
    return np.array([count & 0xFFFFFFFF, count >> 32], np.uint32).view(np.int32)


def _count(words: np.ndarray) -> int:
    w = words.view(np.uint32)
    return int(w[0]) | int(w[1]) << 32


@cuda.jit
def _one_block(bar, out):
    tgt = count_target(bar)
    if cuda.threadIdx.x == 0:
        out[0] = tgt
    count_arrive(bar)
    count_wait(bar, tgt)
    if cuda.threadIdx.x == 0:
        out[1] = ld_acquire64(bar, 0)


@cuda.jit
def _arrivals(bar):
    count_arrive(bar)


@pytest.mark.parametrize("launches", [0, 1, 5, (1 << 32) - 1])  # the last: the count wraps
def test_one_block_waits_for_its_own_arrival(launches):
    count = launches * LAUNCH % (1 << 64)
    bar = _words(count)
    out = np.zeros(2, np.uint64)
    _one_block[1, 32](bar, out)
    after = (count + LAUNCH) % (1 << 64)
    assert out.tolist() == [after, after]
    assert _count(bar) == after


def test_a_launch_adds_two_to_the_32_whatever_its_grid():
    """Launches of 3, then 7 blocks, on one state: each adds 2^32 (block 0 the rest of what the
    others' ones leave), so a launch's target does not depend on the grids before it."""
    bar = _words(4 * LAUNCH)
    _arrivals[3, 32](bar)
    assert _count(bar) == 5 * LAUNCH
    _arrivals[7, 32](bar)
    assert _count(bar) == 6 * LAUNCH
    out = np.zeros(2, np.uint64)
    _one_block[1, 32](bar, out)
    assert out.tolist() == [7 * LAUNCH, 7 * LAUNCH]
