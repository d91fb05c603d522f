"""Decode attention's split merge inside pass 1: the last blocks of a KV head's splits merge them,
so the step has no combine launch (`attention_stream.stream_kernel(..., merged=True)`).

Why: at 32K keys pass 1 alone ran at 3.09-3.14 TB/s on the H200 and pass 1 with `_combine` at
2.64-2.66 (`2026-12-04_kernels_decode_attention_layout.json`): the second launch, its gap and
its three dependent reads were about 3.8 us of 25.3, the rest of the way to 60% of the read.

Each block of a column (grid x: a KV head's block of up to 8 query heads) writes its split's
partials as before, then counts itself in the column's (arrivals, generation) pair in device
memory (`gridsync`'s two words and orders: the arrival an acq_rel add that publishes the block's
writes; the last arrival sets the count back to zero and bumps the generation with a release
store, so the same words serve every later launch and graph replay with no reset). The last
`n_merge` blocks to arrive merge: the last at once, the others once they see the generation
move, each taking the column's query heads c, c + n, ... A waiting block waits only for blocks
that already hold a slot or get one as finished blocks leave, so no wait can block forever when
the grid fits the device at once; where it does not (or in the simulator, whose blocks run one
after another) the launcher passes n_merge = 1 and the last block merges alone, without waiting.

The merge of one query head over the n used splits (s): M = max m_s, den = sum l_s e^(m_s - M),
out[d] = sum o_s[d] e^(m_s - M) / den; the statistics by the block's threads, the outputs by
its warps over the splits (warp w: splits w, w + WARPS, ...; lane: dims lane + 32 j), summed in
warp order. The result is `_combine`'s up to float32 rounding (the sums in another order).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32

from .direct_launch import current_context_handle
from .gridsync import POLL_NS
from .intrinsics import SIMULATED
from .mma import shfl_xor
from .ordered import add_acq_rel, ld_acquire, st_relaxed, st_release

NEG_INF = float32(-np.inf)
EARLY = 4  # a warp's first splits whose outputs a lane loads before the statistics are reduced
MERGE_BLOCKS = 8  # blocks merging a column at most: one a query head of a full block
_N_MERGE: dict[tuple, int] = {}  # (kernel, context, columns) -> the launches' n_merge


def shared_bytes(head_dim: int, warps: int) -> int:
    """Static shared memory `merger`'s merge adds to its kernel."""
    return 4 * (2 + 2 * warps + warps * head_dim)


def n_merge(kern, args, n_cols: int, threads: int) -> int:
    """Blocks merging each of n_cols columns in a launch of `kern` (a merged pass-1 kernel) with
    `args`: MERGE_BLOCKS where the device holds more blocks of it at once than can be waiting
    ((MERGE_BLOCKS - 1) a column), so every block waited for gets a slot; else 1, the last
    block alone (no waiting). 1 in the simulator, whose blocks run one after another."""
    if SIMULATED:
        return 1
    key = (id(kern), current_context_handle(), n_cols)
    n = _N_MERGE.get(key)
    if n is None:
        compiled = kern.compile(tuple(kern.typeof_pyval(a) for a in args))
        resident = compiled.max_cooperative_grid_blocks(threads, 0)
        n = _N_MERGE[key] = MERGE_BLOCKS if resident > (MERGE_BLOCKS - 1) * n_cols else 1
    return n


def merger(head_dim: int, warps: int):
    """merge(part_o, part_ml, sync, out, col, q_first, n_heads, n_used, n_merge), called by a
    whole block of `warps` warps after it wrote its split's partials; returns once the block's
    part is done (see the module doc). sync: int32 [2 * columns], zero before the first launch;
    out: [n_head, head_dim] f32."""
    if head_dim % 32:
        raise ValueError(f"the split merge takes head_dim a multiple of 32, not {head_dim}")
    DPL = head_dim // 32      # dims a lane: lane + 32 j
    THREADS = 32 * warps
    N_RED, N_ACC = 2 * warps, warps * head_dim  # array sizes: constants for numba
    N_EARLY = EARLY * DPL

    @cuda.jit(device=True, inline="always")
    def block_stats(m, l, s_red, warp, lane):
        # (M, den) over the block of every thread's running (m, l); -inf m with l = 0 is empty
        for sh in (16, 8, 4, 2, 1):
            mo = shfl_xor(m, sh)
            lo = shfl_xor(l, sh)
            big = max(m, mo)
            if big != NEG_INF:
                l = l * math.exp(m - big) + lo * math.exp(mo - big)
            m = big
        if lane == 0:
            s_red[2 * warp] = m
            s_red[2 * warp + 1] = l
        cuda.syncthreads()
        big = s_red[0]
        for w in range(1, warps):
            big = max(big, s_red[2 * w])
        den = float32(0.0)
        for w in range(warps):
            den += s_red[2 * w + 1] * math.exp(s_red[2 * w] - big)
        cuda.syncthreads()  # s_red is free for the next head
        return big, den

    @cuda.jit(device=True, inline="always")
    def merge_head(part_o, part_ml, out, h, n_used, s_red, s_acc, tid, warp, lane):
        early = cuda.local.array(N_EARLY, float32)
        for i in range(EARLY):  # in flight while the statistics are reduced
            s = warp + warps * i
            for j in range(DPL):
                early[i * DPL + j] = part_o[s, h, lane + 32 * j] if s < n_used else float32(0.0)
        m = NEG_INF
        l = float32(0.0)
        s = tid
        while s < n_used:
            ms = part_ml[s, h, 0]
            big = max(m, ms)
            l = l * math.exp(m - big) + part_ml[s, h, 1] * math.exp(ms - big)
            m = big
            s += THREADS
        big, den = block_stats(m, l, s_red, warp, lane)
        acc = cuda.local.array(DPL, float32)
        for j in range(DPL):
            acc[j] = float32(0.0)
        for i in range(EARLY):
            s = warp + warps * i
            if s < n_used:
                wt = math.exp(part_ml[s, h, 0] - big)
                for j in range(DPL):
                    acc[j] += wt * early[i * DPL + j]
        s = warp + warps * EARLY
        while s < n_used:
            wt = math.exp(part_ml[s, h, 0] - big)
            for j in range(DPL):
                acc[j] += wt * part_o[s, h, lane + 32 * j]
            s += warps
        for j in range(DPL):
            s_acc[warp * head_dim + lane + 32 * j] = acc[j]
        cuda.syncthreads()
        d = tid
        while d < head_dim:
            tot = s_acc[d]
            for w in range(1, warps):
                tot += s_acc[w * head_dim + d]
            out[h, d] = tot / den
            d += THREADS
        cuda.syncthreads()  # s_acc is free for the next head

    @cuda.jit(device=True, inline="always")
    def merge(part_o, part_ml, sync, out, col, q_first, n_heads, n_used, n_merge):
        s_flag = cuda.shared.array(2, int32)          # this block's arrival, its generation
        s_red = cuda.shared.array(N_RED, float32)  # [warps, (max, sum)]
        s_acc = cuda.shared.array(N_ACC, float32)  # [warps, head_dim] partial outputs
        tid = cuda.threadIdx.x
        warp, lane = tid >> 5, tid & 31
        cuda.syncthreads()  # every thread's partials are written before thread 0 arrives
        if tid == 0:
            gen = ld_acquire(sync, 2 * col + 1)  # before the arrival, as `gridsync` reads it
            a = add_acq_rel(sync, 2 * col, 1)
            if a == n_used - 1:
                st_relaxed(sync, 2 * col, 0)  # the release below orders it before later arrivals
                st_release(sync, 2 * col + 1, gen + 1)
            s_flag[0] = a
            s_flag[1] = gen
        cuda.syncthreads()
        a = s_flag[0]
        n_blocks = min(n_merge, n_used, n_heads)  # the same in every block of the column
        c = a - (n_used - n_blocks)  # this block's place among the merging blocks
        if c < 0:
            return
        if tid == 0 and a != n_used - 1:
            gen = s_flag[1]
            while ld_acquire(sync, 2 * col + 1) == gen:
                cuda.nanosleep(POLL_NS)
        cuda.syncthreads()  # thread 0 saw every split's partials: so does the block
        h = c
        while h < n_heads:
            merge_head(part_o, part_ml, out, q_first + h, n_used, s_red, s_acc, tid, warp,
                       lane)
            h += n_blocks

    return merge
