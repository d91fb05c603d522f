"""The one-pair 8-bit lane matvec's steps with x asked for between a step's two rows.

Stamps in the output projection (Q4_K 4096 -> 2048, `bench/probes/phase_stamps.py`) put x staged
at 2.4 us and the dot ending 1.5 us later: a block's loads return in the order they were issued,
so x, asked for after every weight, waits for all of them, and the dot (issue-bound: about 40
warp instructions a super-block row) starts only once the last weight is in. Asking for x before
the weights (tried, 2026-12-06) staged it sooner but left each warp waiting for both of its rows,
which every warp's interleaved loads complete at the end of the stream. Here a warp asks for its
first step's row a, then its octets of x (and of the format's table), then row b and the next
step: x is staged once row a is in, row a is dotted while row b still streams, and only row b's
dot is left after the last byte. The sums are `lanes.row_pair_steps`' in the same order. The
MoE's gate/up does the same with each warp's first item (`moe_lanes.between_first_item`).

ptxas hoists the loads of a basic block to its top (x first, or every weight first), and keeps
blocks in order: so x's loads, and row b's, each stand behind a branch taken wherever the kernel
runs, and so does row b's dot (else interleaved with row a's, it would wait for row b first).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .intrinsics import warp_sum
from .lanes import LaneFormat, pair_steps_from
from .xstage import stage_x8_preloaded, x8_preload

F0 = np.float32(0.0)
ZERO_OCTETS = ((F0,) * 8, (F0,) * 8)


def x_and_table(lf: LaneFormat, n_threads: int):
    """Device functions (ask, put) for the block's x and lf's table, asked for between loads:
      ask(x, n_sb, tab) -> pre      the thread's first two rounds of x's octets and its two
                                    table entries, behind a branch taken wherever the kernel
                                    runs (n_sb > 0; see the module's doc)
      put(pre, x, n_sb, xs, sums_off, tab_s)   the table and x (`stage_x8`'s words) staged by
                                    the whole block, which then synchronises
    The block has n_threads threads, which hold the table in two entries each at most."""
    n_values = lf.sb_values
    n_tab, has_tab = lf.table.size, lf.has_table
    if has_tab and n_tab > 2 * n_threads:
        raise ValueError(f"{lf.name}: a table of {n_tab} entries past two a thread")

    @cuda.jit(device=True, inline="always")
    def ask(x, n_sb, tab):
        octets = ZERO_OCTETS
        e0 = tab[0]
        e1 = e0
        if n_sb > 0:
            octets = x8_preload(x, n_sb * n_values)
            if has_tab:  # compile time
                e0 = tab[min(cuda.threadIdx.x, n_tab - 1)]
                e1 = tab[min(cuda.threadIdx.x + cuda.blockDim.x, n_tab - 1)]
        return octets, e0, e1

    @cuda.jit(device=True, inline="always")
    def put(pre, x, n_sb, xs, sums_off, tab_s):
        octets, e0, e1 = pre
        if has_tab:  # compile time
            t0 = cuda.threadIdx.x
            t1 = t0 + cuda.blockDim.x
            if t0 < n_tab:
                tab_s[t0] = e0
            if t1 < n_tab:
                tab_s[t1] = e1
        stage_x8_preloaded(octets, x, n_sb * n_values, xs, sums_off)
        cuda.syncthreads()
    return ask, put


def between_steps(lf: LaneFormat, n_threads: int):
    """Device function run(w, off_a, off_b, n_sb, x, xs, sums_off, tab, tab_s, s_first, s_stride)
    -> (dot_a, dot_b): the whole block stages lf's table (where it has one) and x (`stage_x8`'s
    words) and synchronises; each warp dots its steps of the rows at off_a and off_b of w as
    `lanes.row_pair_steps`' run does (the warp's sums, in every lane). For 8-bit decodings; the
    block has n_threads threads."""
    if not lf.x8:
        raise ValueError(f"{lf.name}: x between the rows is for the 8-bit decodings")
    load, dot = lf.load, lf.dot
    lanes = lf.lanes
    sb_bytes, sb_padded, sb_sums = lf.sb_bytes, lf.padded_sb, lf.sb_sums
    ask, put = x_and_table(lf, n_threads)
    steps = pair_steps_from(lf)

    @cuda.jit(device=True, inline="always")
    def run(w, off_a, off_b, n_sb, x, xs, sums_off, tab, tab_s, s_first, s_stride):
        lane = cuda.threadIdx.x & 31
        part = lane & (lanes - 1)
        grp = lane // lanes
        sb = min(s_first + grp, n_sb - 1)
        cur_a = load(w, off_a + sb * sb_bytes, part)
        pre = ask(x, n_sb, tab)
        s1 = s_first + s_stride
        cur_b = cur_a
        nxt_a = cur_a
        nxt_b = cur_a
        if s_stride > 0:  # the third group, behind a branch of its own
            cur_b = load(w, off_b + sb * sb_bytes, part)
            sb_next = min(s1 + grp, n_sb - 1)
            nxt_a = load(w, off_a + sb_next * sb_bytes, part)
            nxt_b = load(w, off_b + sb_next * sb_bytes, part)
        put(pre, x, n_sb, xs, sums_off, tab_s)
        acc_a = F0
        acc_b = F0
        xo = sb * sb_padded
        so = sums_off + sb * sb_sums
        da = dot(cur_a, part, xs, xo, so, tab_s)
        db = F0
        if s_stride > 0:  # a block of its own: ptxas would interleave the dots, waiting for b
            db = dot(cur_b, part, xs, xo, so, tab_s)
        if s_first + grp < n_sb:
            acc_a += da
            acc_b += db
        acc_a, acc_b = steps(w, off_a, off_b, n_sb, nxt_a, nxt_b, acc_a, acc_b, xs, sums_off,
                             tab_s, s1, s_stride)
        return warp_sum(acc_a), warp_sum(acc_b)
    return run
