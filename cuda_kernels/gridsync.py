"""A barrier across every block of one launch, for kernels that run two dependent phases in one
launch (`moe_fused`: the MoE's gate/up, then its down, which reads every block's h).

Every block must be resident at once, or the blocks that arrived wait forever for blocks that
cannot start: such kernels are launched cooperatively (the driver refuses a grid the device
cannot hold at once) with no more blocks than `max_cooperative_grid_blocks` says fit.

The state is two int32 in device memory (8-byte aligned), zero before the first launch, in one
of two forms, with no reset between launches (or replays of a graph holding them):
* a count (`count_target`, `count_arrive`, `count_wait`; the MoE's): the two words one 64-bit
  count, to which a launch's arrivals add exactly 2^32 (1 a block, block 0 the rest), each a
  release add whose value nobody waits for. A block reads the count at its start and waits for
  the next multiple of 2^32: launches of any grid may share the state.
* (arrivals, generation) (`grid_arrive`, `grid_wait`, `grid_sync`): the last block to arrive
  (the add's value says which) sets arrivals back to zero before it bumps the generation.
The count took 0.6 us a layer less in the MoE on an H100 (Q4_K/Q6_K 17.72 against 18.33 us):
the generation's arrival waits two round trips (the generation read, then the add's value)
before the block's first down loads, the last block's a third (its release store).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .ordered import (add_acq_rel, ld_acquire, ld_acquire64, red_release_add64, st_relaxed,
                      st_release)

POLL_NS = np.uint32(32)  # a waiting block's pause between reads of the generation


@cuda.jit(device=True, inline="always")
def grid_arrive(bar):
    """This block's arrival at the barrier (`grid_wait` with what this returns waits for the
    others): the block's writes before it are visible to every block after the wait. bar: int32
    [2] (see the module doc). The whole block calls this; thread 0's return value is the one to
    wait with (the generation it arrived in).

    The order is in the instructions (`ordered`): the arrival an acq_rel add (it publishes the
    block's writes, which the block barrier before it ordered, and the last block sees every
    other's), the generation bumped by a release store and polled by acquire loads. With full
    fences and atomic reads of the generation instead, a barrier took 2.05 against 1.60 us at
    132 blocks, 10.3 against 6.3 at 2,112 (`bench/probes/grid_barrier.py`)."""
    cuda.syncthreads()
    gen = 0
    if cuda.threadIdx.x == 0:
        gen = ld_acquire(bar, 1)  # before the arrival: the acq_rel add cannot move above it
        n_blocks = cuda.gridDim.x * cuda.gridDim.y * cuda.gridDim.z
        if add_acq_rel(bar, 0, 1) == n_blocks - 1:
            st_relaxed(bar, 0, 0)  # the release below orders it before the next arrivals
            st_release(bar, 1, gen + 1)
    return gen


@cuda.jit(device=True, inline="always")
def grid_wait(bar, gen):
    """Wait until every block has arrived (`grid_arrive`, which gave thread 0 `gen`). The whole
    block calls this; between the two it may do work that no other block's writes feed."""
    if cuda.threadIdx.x == 0:
        while ld_acquire(bar, 1) == gen:
            cuda.nanosleep(POLL_NS)
    cuda.syncthreads()


@cuda.jit(device=True, inline="always")
def grid_sync(bar):
    """Wait until every block of the launch has called this; the writes of every block before
    it are visible to every block after it (`grid_arrive`, then `grid_wait`)."""
    grid_wait(bar, grid_arrive(bar))


@cuda.jit(device=True, inline="always")
def count_target(bar):
    """Thread 0: the count (bar as one 64-bit word, never reset) at which this launch's barrier
    opens. Every launch adds exactly 2^32 (`count_arrive`), so read before this block arrives,
    the count's high word is the launches before this one: the target is the next multiple of
    2^32, whatever the grid of this launch or of earlier ones. Other threads: 0."""
    if cuda.threadIdx.x != 0:
        return np.uint64(0)
    return ((ld_acquire64(bar, 0) >> np.uint64(32)) + np.uint64(1)) << np.uint64(32)


@cuda.jit(device=True, inline="always")
def count_arrive(bar):
    """This block's arrival: one release add, whose value nobody waits for, of 1, or for block
    0 of 2^32 - (blocks - 1): a launch's arrivals add up to 2^32."""
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        add = np.uint64(1)
        if cuda.blockIdx.x == 0 and cuda.blockIdx.y == 0 and cuda.blockIdx.z == 0:
            n_blocks = np.uint64(cuda.gridDim.x * cuda.gridDim.y * cuda.gridDim.z)
            add = (np.uint64(1) << np.uint64(32)) - (n_blocks - np.uint64(1))
        red_release_add64(bar, 0, add)


@cuda.jit(device=True, inline="always")
def count_wait(bar, target):
    """Wait until the count reaches `target` (`count_target`, thread 0's); compared as a signed
    difference, so the 64-bit count may wrap (after 2^32 launches)."""
    if cuda.threadIdx.x == 0:
        while np.int64(ld_acquire64(bar, 0) - target) < 0:
            cuda.nanosleep(POLL_NS)
    cuda.syncthreads()
