"""Staging of the activation vector in shared memory for the matvec-style kernels.

Each lane of a matvec warp dots its own 32-value group, so a warp's load of x at one position of
the group touches 32 groups at once. From global memory that is 32 cache lines per instruction;
from shared memory laid out with 32 values then 4 floats of padding per group (XPAD = 36), the 16-
byte reads of 8 consecutive lanes land in 8 distinct bank quads: conflict-free. The block loads a
tile of x once, coalesced, converting float16 to float32 on the way.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

XPAD = 36  # floats per staged 32-value group (16-byte aligned, bank-spreading)


@cuda.jit(device=True, inline="always")
def stage_x(x, x_base, n_vals, xs, xs_base):
    """xs[xs_base + (i // 32) * XPAD + i % 32] = x[x_base + i] for i < n_vals (whole block)."""
    for i in range(cuda.threadIdx.x, n_vals, cuda.blockDim.x):
        xs[xs_base + (i >> 5) * XPAD + (i & 31)] = np.float32(x[x_base + i])


def staged_bytes(n_groups: int) -> int:
    """Dynamic shared memory for n_groups staged groups."""
    return int(n_groups) * XPAD * 4
