"""The count form of the grid barrier (`gridsync.count_*`, the fused MoE's): its 64-bit count
over the two int32 words, the target a block waits for, and the launcher's zeroing of a state
whose grid changes. One block only here: the simulator runs blocks one after another, so a
barrier across several never opens (tests/gpu/test_kernels_decode_gpu.py runs it on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from strata.cuda_kernels import moe_fused
from strata.cuda_kernels.gridsync import count_arrive, count_target, count_wait
from strata.cuda_kernels.ordered import ld_acquire64


@cuda.jit
def _one_block(bar, out):
    tgt = count_target(bar)
    if cuda.threadIdx.x == 0:
        out[0] = tgt
    count_arrive(bar)
    count_wait(bar, tgt)
    if cuda.threadIdx.x == 0:
        out[1] = ld_acquire64(bar, 0)


@pytest.mark.parametrize("count", [0, 6, (1 << 32) - 1, (1 << 40) + 3])
def test_one_block_waits_for_its_own_arrival_across_the_word_boundary(count):
    bar = np.array([count & 0xFFFFFFFF, count >> 32], np.uint32).view(np.int32)
    out = np.zeros(2, np.uint64)
    _one_block[1, 32](bar, out)
    assert out.tolist() == [count + 1, count + 1]
    assert int(bar.view(np.uint32)[0]) | int(bar.view(np.uint32)[1]) << 32 == count + 1


def test_a_state_whose_grid_changes_is_zeroed_first(monkeypatch):
    """Launches of one grid keep the count (a multiple of it); a launch of another grid would
    wait for the wrong multiple, so the launcher zeroes the state before it."""
    monkeypatch.setattr(moe_fused, "_STATE_GRIDS", {})
    monkeypatch.setattr(moe_fused, "BARRIER", "count")
    bar = np.array([264 * 5, 0], np.int32)
    moe_fused._count_state(bar, 264, 0)
    moe_fused._count_state(bar, 264, 0)
    assert bar.tolist() == [264 * 5, 0]
    moe_fused._count_state(bar, 132, 0)
    assert bar.tolist() == [0, 0]
    other = np.array([132 * 2, 0], np.int32)  # another sequence's state: its own grid
    moe_fused._count_state(other, 132, 0)
    assert other.tolist() == [132 * 2, 0]
    monkeypatch.setattr(moe_fused, "BARRIER", "generation")  # (arrivals, generation): no count
    gen = np.array([3, 9], np.int32)
    moe_fused._count_state(gen, 64, 0)
    moe_fused._count_state(gen, 32, 0)
    assert gen.tolist() == [3, 9]
