"""Decode attention in one launch: the streaming pass 1 (`attention_stream.split_body`), a barrier
across the grid (`gridsync`), then the blocks merge the splits' partial outputs themselves, in
place of the `attention._combine` launch.

Why: on the H200 the combine launch cost as much as a quarter of the layer's attention: 3.6 us at
32K keys (25.6 us against 22.0 for pass 1 alone) and 4.0 us at a full 4K cache (11.3 against
7.3), mostly the wait for pass 1's grid to drain and the next grid to start, which a barrier
inside the launch replaces (`2026-12-04_kernels_decode_attention_pass1.json`).

The merge: block b takes units u = b, b + grid, ... of (query head, 32 dims), as `_combine`'s
blocks do, with the kernel's four warps: warp w sums splits w, w + 4, ... for its lane's dim,
loading MERGE_EARLY of them at a time (the first batch before the softmax statistics' block
reductions), and warp 0 adds the four sums in warp order: the result does not depend on
scheduling, but it is not `_combine`'s bit for bit (eight warps there: another order of sums).

Every block of the grid must be resident at once: the launch is cooperative (the driver refuses a
grid it cannot hold) and `launch` returns False, launching nothing, where the grid is larger than
the device holds (a long cache's many splits) or the driver refused such a launch once; the
launcher then runs the two launches. The simulator runs blocks one after another, so a barrier
across blocks would never open there: it runs phase 0 (pass 1) and then phase 1 (the merge) as two
launches of the same kernel.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from numba import cuda, float32, uint32

from strata.plan import attn_split

from . import attention_stream as st
from .gridsync import grid_sync
from .intrinsics import SIMULATED, f2u, u2f
from .launch import factory_cache
from .mma import shfl_xor

# Read at launch, so a benchmark can compare one launch with two in one process.
ONE_LAUNCH = True
MERGE_EARLY = 16  # partial outputs a lane loads before it sums them (32K keys: 32 a warp)
NEG_INF = float32(-np.inf)
_split_len = cuda.jit(device=True, inline="always")(attn_split.split_len)

_RESIDENT: dict[int, int] = {}  # id(compiled kernel) -> blocks the GPU holds at once
_REFUSED: dict[int, str] = {}   # id(compiled kernel) -> why the driver refused it


@cuda.jit(device=True, inline="always")
def _block_reduce(v, is_max, s_red, at, warp, lane):
    """Max or sum of v over the block's WARPS warps (slots s_red[at:at + WARPS]), to every
    thread."""
    for sh in (16, 8, 4, 2, 1):
        o = shfl_xor(v, sh)
        v = max(v, o) if is_max else v + o
    if lane == 0:
        s_red[at + warp] = v
    cuda.syncthreads()
    v = s_red[at]
    for w in range(1, st.WARPS):
        v = max(v, s_red[at + w]) if is_max else v + s_red[at + w]
    cuda.syncthreads()
    return v


@factory_cache
def merged_kernel(fmt: str, head_dim: int, group: int, max_split: int,
                  min_split: int = attn_split.SPLIT_K_MIN, min_blocks: int | None = None):
    """The one-launch kernel: `stream_kernel`'s arguments, then out [n_head, head_dim] f32, the
    barrier's state bar (int32 [2], `gridsync`) and the phase (0 pass 1, 1 the merge, 2 both with
    the barrier between; the GPU runs 2)."""
    min_blocks = st.MIN_BLOCKS[fmt] if min_blocks is None else min_blocks
    body = st.split_body(fmt, head_dim, group, max_split, min_split)
    N_RING, N_P, N_ML, N_Q = st.shared_lens(head_dim)
    N_DS = head_dim // 32  # units of 32 dims a head
    MAX_SPLIT, MIN_SPLIT = max_split, min_split
    WARPS, THREADS, EARLY = st.WARPS, st.THREADS, MERGE_EARLY
    if N_RING < attention_max_splits() or N_P < THREADS + WARPS:
        raise ValueError(f"head_dim {head_dim}: the shared slots cannot hold the merge's weights")

    @cuda.jit(device=True, inline="always")
    def merge(part_o, part_ml, seq_len, n_new, n_ctx, n_target, out, s_w, s_acc):
        # s_w: the split weights (u32 bits of f32) [n_used]; s_acc: [THREADS] the warps' sums,
        # then [WARPS] the block reductions' slots
        tid = cuda.threadIdx.x
        warp, lane = tid >> 5, tid & 31
        length = min(seq_len[0] + n_new, n_ctx)
        split_len = _split_len(length, n_target, MAX_SPLIT, MIN_SPLIT)
        n_used = min((length + split_len - 1) // split_len, part_ml.shape[0])
        early = cuda.local.array(EARLY, float32)
        n_grid = cuda.gridDim.x * cuda.gridDim.y
        u = cuda.blockIdx.y * cuda.gridDim.x + cuda.blockIdx.x
        while u < out.shape[0] * N_DS:  # the same in the whole block
            h = u // N_DS
            d = (u - h * N_DS) * 32 + lane
            for i in range(EARLY):  # in flight through the statistics
                s = warp + WARPS * i
                early[i] = part_o[s, h, d] if s < n_used else float32(0.0)
            m = NEG_INF
            s = tid
            while s < n_used:
                m = max(m, part_ml[s, h, 0])
                s += THREADS
            m = _block_reduce(m, True, s_acc, THREADS, warp, lane)
            den = float32(0.0)
            s = tid
            while s < n_used:
                w = math.exp(part_ml[s, h, 0] - m)
                s_w[s] = f2u(w)
                den += w * part_ml[s, h, 1]
                s += THREADS
            den = _block_reduce(den, False, s_acc, THREADS, warp, lane)  # its barriers publish s_w
            acc = float32(0.0)
            s0 = warp
            while s0 < n_used:
                if s0 != warp:  # the next batch (the first is in flight already)
                    for i in range(EARLY):
                        s = s0 + WARPS * i
                        early[i] = part_o[s, h, d] if s < n_used else float32(0.0)
                for i in range(EARLY):
                    s = s0 + WARPS * i
                    if s < n_used:
                        acc += u2f(s_w[s]) * early[i]
                s0 += WARPS * EARLY
            s_acc[tid] = acc
            cuda.syncthreads()
            if warp == 0:
                for w in range(1, WARPS):
                    acc += s_acc[w * 32 + lane]
                out[h, d] = acc / den
            cuda.syncthreads()  # s_w and s_acc are free for the next unit
            u += n_grid

    @cuda.jit(**({} if SIMULATED else st.jit_options(min_blocks)))
    def kernel(q, kd, ks, vd, vs, seq_len, n_new, n_ctx, n_target, qk_scale, part_o, part_ml,
               out, bar, phase):
        ring = cuda.shared.array(N_RING, uint32)
        s_p = cuda.shared.array(N_P, float32)
        s_ml = cuda.shared.array(N_ML, float32)
        s_q = cuda.shared.array(N_Q, uint32)
        if phase != 1:
            body(q, kd, ks, vd, vs, seq_len, n_new, n_ctx, n_target, qk_scale, part_o, part_ml,
                 ring, s_p, s_ml, s_q)
        if phase == 2:
            grid_sync(bar)  # every split's partials written
        if phase != 0:
            merge(part_o, part_ml, seq_len, n_new, n_ctx, n_target, out, ring, s_p)

    return kernel


def attention_max_splits() -> int:
    """The most splits the merge weighs in shared memory (`attention.MAX_SPLITS`)."""
    from .attention import MAX_SPLITS
    return MAX_SPLITS


def launch(args: tuple, out, sync, *, grid: tuple[int, int], fmt: str, head_dim: int,
           group: int, max_split: int, min_split: int, stream) -> bool:
    """The one-launch attention of pass 1's arguments `args` (as `stream_kernel` takes them), or
    False (nothing launched) where the GPU cannot hold the whole grid at once or its driver
    refused the cooperative launch (once: a warning says why, and it is not tried again)."""
    kern = merged_kernel(fmt, head_dim, group, max_split, min_split)
    full = args + (out, sync)
    if SIMULATED:
        for phase in (0, 1):
            kern[grid, st.THREADS, stream](*full, phase)
        return True
    compiled = kern.compile(tuple(kern.typeof_pyval(a) for a in full + (2,)))
    compiled.cooperative = True  # the driver refuses a grid it cannot hold at once
    key = id(compiled)
    if key not in _RESIDENT:
        _RESIDENT[key] = compiled.max_cooperative_grid_blocks(st.THREADS, 0)
    if grid[0] * grid[1] > _RESIDENT[key] or key in _REFUSED:
        return False
    if isinstance(stream, int) and stream == 0:  # a launch past the dispatcher takes no 0
        stream = cuda.default_stream()
    try:
        compiled.launch(full + (2,), (grid[0], grid[1], 1), (st.THREADS, 1, 1), stream, 0)
    except Exception as e:  # noqa: BLE001 - a driver without cooperative launches: a plain run
        # comes before any graph capture, so the capture sees the two launches
        _REFUSED[key] = f"{type(e).__name__}: {e}"
        warnings.warn(f"decode attention: the one-launch kernel was refused ({_REFUSED[key]}); "
                      f"pass 1 and the combine run as two launches", RuntimeWarning,
                      stacklevel=3)
        return False
    return True
