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
move, each taking the column's query heads c, c + n, ...; every other block leaves at once, and
splits past the length never arrive. A waiting block waits for blocks that hold a slot or get
one as finished blocks leave: it cannot wait forever while the device holds more blocks than
can be waiting at once ((n_merge - 1) a column; `n_merge` checks); where it does not, and in
the simulator (whose blocks run one after another), n_merge is 1: the last block merges alone.

Two earlier forms lost to the combine launch (README, "Tried and dropped: decode attention in
one launch"): the last block of a KV head merging all its heads alone, walking the splits (61.0
against 31.1 us at 32K), and every block merging after a barrier across the grid, where all
blocks, those without keys too, arrive at one counter (30.5 against 25.6). Here the counters
are a column's, the merge is spread over up to 8 blocks (one query head each, 32 KiB of
partials at 32K), and a warp loads several splits' outputs at once (BATCH).

The merge of one query head over the n used splits (s): M = max m_s, den = sum l_s e^(m_s - M),
out[d] = sum o_s[d] e^(m_s - M) / den; the statistics by the block's threads, the outputs by
its warps over the splits (warp w: splits w, w + WARPS, ..., a batch at a time, the first
loaded before the statistics; lane: dims lane + 32 j), summed in warp order. The result is
`_combine`'s up to float32 rounding (the sums in another order).
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
# KV formats whose pass 1 merges: f16 (96 registers, no spill). int8's pass 1 holds 128
# registers already; with the merge ptxas 13.0 spilled 80-96 bytes, 12 local loads inside its
# tile loop (`bench/probes/sass_loops.py`), with a batch of 8 or of 4 alike.
FORMATS = ("f16",)
BATCH = 8  # splits a warp loads at once (a lane: BATCH * head_dim / 32 outputs in registers)
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


def merger(head_dim: int, warps: int, batch: int = BATCH):
    """merge(part_o, part_ml, sync, out, col, q_first, n_heads, n_used, n_merge), called by a
    whole block of `warps` warps after it wrote its split's partials; returns once the block's
    part is done (see the module doc). sync: int32 [2 * columns], zero before the first launch;
    out: [n_head, head_dim] f32."""
    if head_dim % 32:
        raise ValueError(f"the split merge takes head_dim a multiple of 32, not {head_dim}")
    DPL = head_dim // 32      # dims a lane: lane + 32 j
    THREADS = 32 * warps
    N_RED, N_ACC = 2 * warps, warps * head_dim  # array sizes: constants for numba
    N_O = batch * DPL

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
    def load_batch(part_o, part_ml, h, s0, n_used, lane, o, ms):
        # the outputs (o) and maxima (ms) of splits s0 + warps * i, i < batch, all loads issued
        # before any is used (one memory latency a batch, not one a split); past n_used: 0, -inf
        for i in range(batch):
            s = s0 + warps * i
            ok = s < n_used
            ms[i] = part_ml[s, h, 0] if ok else NEG_INF
            for j in range(DPL):
                o[i * DPL + j] = part_o[s, h, lane + 32 * j] if ok else float32(0.0)

    @cuda.jit(device=True, inline="always")
    def merge_head(part_o, part_ml, out, h, n_used, s_red, s_acc, tid, warp, lane):
        o = cuda.local.array(N_O, float32)
        ms = cuda.local.array(batch, float32)
        load_batch(part_o, part_ml, h, warp, n_used, lane, o, ms)  # in flight: the statistics
        m = NEG_INF
        l = float32(0.0)
        s = tid
        while s < n_used:
            m_s = part_ml[s, h, 0]
            big = max(m, m_s)
            l = l * math.exp(m - big) + part_ml[s, h, 1] * math.exp(m_s - big)
            m = big
            s += THREADS
        big, den = block_stats(m, l, s_red, warp, lane)
        acc = cuda.local.array(DPL, float32)
        for j in range(DPL):
            acc[j] = float32(0.0)
        s0 = warp
        while True:
            for i in range(batch):
                wt = math.exp(ms[i] - big)  # 0 past the used splits
                for j in range(DPL):
                    acc[j] += wt * o[i * DPL + j]
            s0 += warps * batch
            if s0 >= n_used:
                break
            load_batch(part_o, part_ml, h, s0, n_used, lane, o, ms)
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
