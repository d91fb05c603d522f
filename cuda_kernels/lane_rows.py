"""The lane matvecs' row space (`matvec.lane_body`): which matrix a row pair belongs to, a pair's
sums written out, a rounds kernel's end of a pair and the next unit its loads go to. Device
functions only; the kernels inline them.
"""

from __future__ import annotations

from numba import cuda

from .intrinsics import warp_sum
from .lanes import combine_split


@cuda.jit(device=True, inline="always")
def pair_at(row0, n_rows, n_first, b3, n1, n3, normed):
    """(which matrix 0/1/2, its first row of the pair at row space row0, its row count) of the
    lane kernels' row space (see matvec_lanes); rows past the end land on the last matrix, past
    its rows (read clamped, never written)."""
    third = normed and row0 >= b3 and n3 > 0
    if third:
        return 2, row0 - b3, n3
    if row0 >= n_first and n_first < n_rows:
        return 1, row0 - n_first, n_rows - n_first
    return 0, row0, (n1 if normed else n_first)


@cuda.jit(device=True, inline="always")
def put_pair(out, row0, n_here, acc_a, acc_b, accumulate):
    """A row pair's sums into out (rows past n_here left out)."""
    if row0 < n_here:
        out[row0] = out[row0] + acc_a if accumulate else acc_a
    if row0 + 1 < n_here:
        out[row0 + 1] = out[row0 + 1] + acc_b if accumulate else acc_b


@cuda.jit(device=True, inline="always")
def finish_pair(acc_a, acc_b, s_part, log, sub, y, y2, y3, m, row0, n_here, accumulate):
    """A rounds kernel's end of a row pair: the warps' partial dots summed, written by the
    pair's first lane (the whole block calls this at once)."""
    acc_a = warp_sum(acc_a)
    acc_b = warp_sum(acc_b)
    if log > 0:
        acc_a, acc_b = combine_split(acc_a, acc_b, s_part, log)
        cuda.syncthreads()  # s_part read before the next pair writes it
    if (cuda.threadIdx.x & 31) == 0 and sub == 0:
        put_pair(y3 if m == 2 else (y2 if m == 1 else y), row0, n_here, acc_a, acc_b,
                 accumulate)


@cuda.jit(device=True, inline="always")
def next_unit(lp, lj, lm, la, lb, spp, stride, n_pairs, row_bytes, n_rows, n_first, b3, n1,
              n3, normed):
    """The unit after (pair lp, unit lj) of a warp's stream and where it loads (matrix lm, row
    offsets la, lb): past the last pair, that pair's rows again (cached, never written)."""
    lj += 1
    if lj == spp:
        lj = 0
        lp += stride
        if lp < n_pairs:
            m1, r1, h1 = pair_at(2 * lp, n_rows, n_first, b3, n1, n3, normed)
            lm = m1
            la = min(r1, h1 - 1) * row_bytes
            lb = min(r1 + 1, h1 - 1) * row_bytes
    return lp, lj, lm, la, lb
