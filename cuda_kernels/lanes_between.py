"""The one-pair 8-bit lane matvec's steps with x asked for between a step's two rows.

Stamps in the output projection (Q4_K 4096 -> 2048, `bench/probes/phase_stamps.py`) put x staged
at 2.4 us and the dot ending 1.5 us later: a block's loads return in the order they were issued,
so x, asked for after every weight, waits for all of them, and the dot (issue-bound: about 40
warp instructions a super-block row) starts only once the last weight is in. Asking for x before
the weights (tried, 2026-12-06) staged it sooner but left each warp waiting for both of its rows,
which every warp's interleaved loads complete at the end of the stream. Here a warp asks for its
first step's row a, then its octets of x (and of the format's table), then row b and the next
step: x is staged once row a is in, row a is dotted while row b still streams, and only row b's
dot is left after the last byte. The sums are `lanes.row_pair_steps`' in the same order.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .elementwise import silu
from .intrinsics import warp_sum
from .lanes import LaneFormat
from .xstage import stage_x8_preloaded, x8_preload

F0 = np.float32(0.0)
ZERO_OCTETS = ((F0,) * 8, (F0,) * 8)


def between_steps(lf: LaneFormat, n_threads: int):
    """Device function run(w, off_a, off_b, n_sb, x, xs, sums_off, tab, tab_s, s_first, s_stride)
    -> (dot_a, dot_b): the whole block stages lf's table (where it has one) and x (`stage_x8`'s
    words) and synchronises; each warp dots its steps of the rows at off_a and off_b of w as
    `lanes.row_pair_steps`' run does (the warp's sums, in every lane). For 8-bit decodings; the
    block has n_threads threads, which hold the table in two entries each at most."""
    if not lf.x8:
        raise ValueError(f"{lf.name}: x between the rows is for the 8-bit decodings")
    load, dot = lf.load, lf.dot
    lanes = lf.lanes
    sb_bytes, sb_padded, sb_sums, n_values = lf.sb_bytes, lf.padded_sb, lf.sb_sums, lf.sb_values
    n_tab, has_tab = lf.table.size, lf.has_table
    if has_tab and n_tab > 2 * n_threads:
        raise ValueError(f"{lf.name}: a table of {n_tab} entries past two a thread")

    @cuda.jit(device=True, inline="always")
    def run(w, off_a, off_b, n_sb, x, xs, sums_off, tab, tab_s, s_first, s_stride):
        lane = cuda.threadIdx.x & 31
        part = lane & (lanes - 1)
        grp = lane // lanes
        last_sb = n_sb - 1
        sb = min(s_first + grp, last_sb)
        cur_a = load(w, off_a + sb * sb_bytes, part)
        # Each group behind a branch taken wherever the kernel runs (n_sb, s_stride > 0): ptxas
        # hoists a block's unconditional loads to its top, which asked for x first or last, and
        # keeps loads in the order of the blocks they stand in.
        pre = ZERO_OCTETS
        t0 = cuda.threadIdx.x
        t1 = t0 + cuda.blockDim.x
        e0 = tab[0]
        e1 = e0
        if n_sb > 0:
            pre = x8_preload(x, n_sb * n_values)
            if has_tab:  # compile time
                e0 = tab[min(t0, n_tab - 1)]
                e1 = tab[min(t1, n_tab - 1)]
        s0 = s_first + s_stride
        cur_b = cur_a
        nxt_a = cur_a
        nxt_b = cur_a
        if s_stride > 0:
            cur_b = load(w, off_b + sb * sb_bytes, part)
            sb_next = min(s0 + grp, last_sb)
            nxt_a = load(w, off_a + sb_next * sb_bytes, part)
            nxt_b = load(w, off_b + sb_next * sb_bytes, part)
        if has_tab:
            if t0 < n_tab:
                tab_s[t0] = e0
            if t1 < n_tab:
                tab_s[t1] = e1
        stage_x8_preloaded(pre, x, n_sb * n_values, xs, sums_off)
        cuda.syncthreads()
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
        cur_a = nxt_a
        cur_b = nxt_b
        while s0 < n_sb:  # `row_pair_steps`' loop from the second step
            sb_next = min(s0 + s_stride + grp, last_sb)
            nxt_a = load(w, off_a + sb_next * sb_bytes, part)
            nxt_b = load(w, off_b + sb_next * sb_bytes, part)
            sb = min(s0 + grp, last_sb)
            xo = sb * sb_padded
            so = sums_off + sb * sb_sums
            da = dot(cur_a, part, xs, xo, so, tab_s)
            db = dot(cur_b, part, xs, xo, so, tab_s)
            if s0 + grp < n_sb:
                acc_a += da
                acc_b += db
            cur_a = nxt_a
            cur_b = nxt_b
            s0 += s_stride
        return warp_sum(acc_a), warp_sum(acc_b)
    return run


def between_first_item(lf: LaneFormat, n_threads: int, lane_warps: int):
    """Device function for the MoE's one-step gate/up items (`moe_lanes.gate_up_items`), the
    first item of each warp with x asked for between its gate and up rows:
      first(k, n_items, s_where, s_base, cache, host, row_bytes, up_off, n_sb, x, xs, sums_off,
            tab, tab_s, h, n_ff, step_row, step_kk) -> (it, row, kk, cur)
    The warp asks for its first item's gate row, then its octets of x (and the table's
    entries), then the up row and its second item's rows; the whole block stages the table and
    x and synchronises; the warp dots the first item (gate, then up, as `dot_pair`) and writes
    its h entry, and returns its second item and that item's loads for `run`, which goes on
    as from its first: the same items, dots and sums."""
    if not lf.x8:
        raise ValueError(f"{lf.name}: x between the rows is for the 8-bit decodings")
    load, dot = lf.load, lf.dot
    lanes = lf.lanes
    sb_bytes, sb_padded, sb_sums, n_values = lf.sb_bytes, lf.padded_sb, lf.sb_sums, lf.sb_values
    n_tab, has_tab = lf.table.size, lf.has_table
    if has_tab and n_tab > 2 * n_threads:
        raise ValueError(f"{lf.name}: a table of {n_tab} entries past two a thread")

    @cuda.jit(device=True, inline="always")
    def first(k, n_items, s_where, s_base, cache, host, row_bytes, up_off, n_sb, x, xs, sums_off,
              tab, tab_s, h, n_ff, step_row, step_kk):
        lane = cuda.threadIdx.x & 31
        part = lane & (lanes - 1)
        grp = lane // lanes
        sb = min(grp, n_sb - 1)
        it = cuda.blockIdx.x * lane_warps + (cuda.threadIdx.x >> 5)
        row = it // k
        kk = it - row * k
        where = s_where[kk] if it < n_items else -1  # the same in the whole warp
        off_g = s_base[kk] + row * row_bytes
        src = cache if where == 0 else host
        if where < 0:  # as gate_up_items' first: a dummy load of a cache row, never used
            off_g = 0
            src = cache if cache.shape[0] >= up_off + row_bytes else host
        cur_g = load(src, off_g + sb * sb_bytes, part)
        # each group behind a branch taken wherever the kernel runs (`between_steps`)
        pre = ZERO_OCTETS
        t0 = cuda.threadIdx.x
        t1 = t0 + cuda.blockDim.x
        e0 = tab[0]
        e1 = e0
        if n_sb > 0:
            pre = x8_preload(x, n_sb * n_values)
            if has_tab:  # compile time
                e0 = tab[min(t0, n_tab - 1)]
                e1 = tab[min(t1, n_tab - 1)]
        # the second item: (row, kk) + the grid's warps by one carry, as `run` steps
        it1 = it + cuda.gridDim.x * lane_warps
        row1 = row + step_row
        kk1 = kk + step_kk
        if kk1 >= k:
            kk1 -= k
            row1 += 1
        cur_u = cur_g
        nxt = (cur_g, cur_g)
        if row_bytes > 0:
            cur_u = load(src, off_g + up_off + sb * sb_bytes, part)
            if it1 < n_items:
                where1 = s_where[kk1]
                if where1 >= 0:  # never a read for an expert left to the CPU
                    off1 = s_base[kk1] + row1 * row_bytes
                    src1 = cache if where1 == 0 else host
                    nxt = (load(src1, off1 + sb * sb_bytes, part),
                           load(src1, off1 + up_off + sb * sb_bytes, part))
        if has_tab:
            if t0 < n_tab:
                tab_s[t0] = e0
            if t1 < n_tab:
                tab_s[t1] = e1
        stage_x8_preloaded(pre, x, n_sb * n_values, xs, sums_off)
        cuda.syncthreads()
        xo = sb * sb_padded
        so = sums_off + sb * sb_sums
        g = F0
        u = F0
        if where >= 0:
            g = dot(cur_g, part, xs, xo, so, tab_s)
            if row_bytes > 0:  # a block of its own: ptxas would interleave the two dots
                u = dot(cur_u, part, xs, xo, so, tab_s)
            if grp >= n_sb:  # `dot_pair`: a group past the row adds nothing
                g = F0
                u = F0
        g = warp_sum(g)
        u = warp_sum(u)
        if it < n_items and (cuda.threadIdx.x & 31) == 0:
            h[kk * n_ff + row] = silu(g) * u if where >= 0 else F0
        return it1, row1, kk1, nxt
    return first
