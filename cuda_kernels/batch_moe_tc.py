"""The batched MoE decode (2..8 tokens) on the tensor cores, for gate/up and down in the K-quant
formats of `batch_tc` (Q4_K, Q6_K) with widths that are multiples of 256: both projections
grouped by expert, so each selected expert's weights are read and dequantized once per step
however many tokens chose it.

* gate_up: grid (16-row tile of h, entry), entry = (token, top-k position). The first entry that
  names an expert owns it (as in `batch_moe_lanes`); its block multiplies the expert's gate and up
  tiles by the x of every token that chose it (MMA columns: those tokens), its warps taking the
  (gate or up, super-block) units in turn, and writes h[entry] = silu(gate x) * (up x) for each.
  The other entries' blocks only count their hit or miss.
* down: grid (16-row tile of the output); the block lists the step's distinct experts (first
  appearance in ids), and for each, the MMA columns are the tokens (column j = token j), B the
  h of (token, that expert) where the token chose it, each column scaled by the token's router
  weight for it (0 where it did not choose it); its warps take the (expert, super-block) units in
  turn and meet in shared memory in warp order: deterministic, and out is written once, with no
  atomics.

Measured on the H200 (serve_batch --profile-rows 8, 30B-A3B Q4_K_M, 8 random rows): 14.8 ms of
MoE a step against the lane kernels' 6.8, so the batched step does not launch these. Each warp
takes one unit at a time and waits out its loads (gate_up: one 512-thread block per SM; down:
~12 units a warp in turn): what they need next is the next unit's loads issued before the
current unit's math.

Precision as `batch_tc` (f16 weights exact, x and h split into two f16 parts: about 2^-22
relative): a token's values match the one-token kernels' to float32 rounding, not bit for bit;
the down sum's order follows the step's expert list, so it is not batch invariant in the last
bits.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, types

from .batch_moe_lanes import _where, claim_expert
from .batch_tc import SB_FUNCS, SB_VALUES, TILE_ROWS, store_partials, warp_order_sum
from .elementwise import silu
from .launch import n_blocks, register_ptx
from .moe import ExpertLayout
from .moe_slots import MAX_K
from .qformats import get_format

MAX_TOKENS = 8
MAX_ENTRIES = MAX_TOKENS * MAX_K
COL_SLOTS = MAX_ENTRIES * MAX_TOKENS  # [distinct expert, token] tables of the down kernel
DOWN_WARPS = 16          # the down block's warps: ~40 experts x 3 super-blocks of units a tile
DOWN_RED = DOWN_WARPS * 128
F0 = np.float32(0.0)

# gate_up's warps take (matrix, super-block) units with one call site: inlining a gate and an up
# super-block together took 177 registers (ptxas 13.0, Q4_K), and bounding that to 128 spilled
GATE_UP_WARPS = 16
GATE_UP_RED = GATE_UP_WARPS * 128
_CACHE: dict[tuple, object] = {}


def tc_moe_fits(layout: ExpertLayout) -> bool:
    """Whether both projections of this layout run on the tensor-core kernels."""
    return (get_format(layout.gate_up_type).name in SB_FUNCS
            and get_format(layout.down_type).name in SB_FUNCS
            and layout.n_embd % SB_VALUES == 0 and layout.n_ff % SB_VALUES == 0)


def _gate_up(name: str):
    sb_fn, sb_bytes = SB_FUNCS[name]

    @cuda.jit
    def batch_gate_up_tc(x, ids, k, n_tok, slot_table, layer, cache, slot_off, host, host_off,
                         counters, row_bytes, n_sb, n_ff, up_off, h):
        # x: [n_tok * n_embd] f32; ids: [n_tok * k] i32; h: [n_tok * k * n_ff] f32;
        # grid (16-row tiles of h, entries); block: warps over the units (gate or up, super-block)
        s_ids = cuda.shared.array(MAX_ENTRIES, types.int32)
        s_ent = cuda.shared.array(MAX_TOKENS, types.int32)
        s_n = cuda.shared.array(1, types.int32)
        red_g = cuda.shared.array(GATE_UP_RED, types.float32)  # [warp, lane, 4] partial sums
        red_u = cuda.shared.array(GATE_UP_RED, types.float32)
        tid = cuda.threadIdx.x
        n_e, where, base = claim_expert(ids, n_tok * k, slot_table, layer, slot_off, host_off,
                                        counters, s_ids, s_ent, s_n)
        if n_e == 0:  # the same in the whole block
            return
        src = cache if where == 0 else host
        lane = tid & 31
        warp = tid >> 5
        n_warps = cuda.blockDim.x >> 5
        g = lane >> 2
        t = lane & 3
        row_a = cuda.blockIdx.x * TILE_ROWS + g
        row_b = row_a + 8
        off_a = base + min(row_a, n_ff - 1) * row_bytes
        off_b = base + min(row_b, n_ff - 1) * row_bytes
        n_cols = n_sb * SB_VALUES
        xb = (s_ent[min(g, n_e - 1)] // k) * n_cols  # column g: the g-th token that chose e
        g0 = F0
        g1 = F0
        g2 = F0
        g3 = F0
        u0 = F0
        u1 = F0
        u2 = F0
        u3 = F0
        for unit in range(warp, 2 * n_sb, n_warps):
            is_up = unit >= n_sb
            sb = unit - n_sb if is_up else unit
            o = sb * sb_bytes + (up_off if is_up else 0)
            c0, c1, c2, c3 = sb_fn(src, off_a + o, off_b + o, x, xb + sb * SB_VALUES, t, F0, F0,
                                   F0, F0)
            if is_up:
                u0 += c0
                u1 += c1
                u2 += c2
                u3 += c3
            else:
                g0 += c0
                g1 += c1
                g2 += c2
                g3 += c3
        store_partials(red_g, warp, lane, g0, g1, g2, g3)
        store_partials(red_u, warp, lane, u0, u1, u2, u3)
        cuda.syncthreads()
        if warp == 0:
            for c in range(4):
                sg = warp_order_sum(red_g, lane, c, n_warps)
                su = warp_order_sum(red_u, lane, c, n_warps)
                col = 2 * t + (c & 1)    # accumulators: (row a, 2t), (a, 2t+1), (b, 2t), (b, 2t+1)
                row = row_a if c < 2 else row_b
                if col < n_e and row < n_ff:
                    h[s_ent[col] * n_ff + row] = silu(sg) * su
    return batch_gate_up_tc


def _down(name: str):
    sb_fn, sb_bytes = SB_FUNCS[name]

    @cuda.jit
    def batch_down_tc(h, ids, weights, k, n_tok, slot_table, layer, cache, slot_off, host,
                      host_off, down_off, row_bytes, n_sb, n_ff, n_embd, accumulate, out):
        # h: [n_tok * k * n_ff] f32; ids, weights: [n_tok * k]; out: [n_tok * n_embd] f32
        # (= or += sum_k w_k down_k h_k); grid: 16-row tiles of out; block: warps over the units
        # (distinct expert u, super-block sb), u-major
        s_ids = cuda.shared.array(MAX_ENTRIES, types.int32)
        s_exp = cuda.shared.array(MAX_ENTRIES, types.int32)  # [u] the u-th distinct expert
        s_where = cuda.shared.array(MAX_ENTRIES, types.int32)
        s_base = cuda.shared.array(MAX_ENTRIES, types.int64)
        s_col = cuda.shared.array(COL_SLOTS, types.int32)  # [u, token] entry
        s_wt = cuda.shared.array(COL_SLOTS, types.float32)  # [u, token] weight
        s_n = cuda.shared.array(1, types.int32)
        red = cuda.shared.array(DOWN_RED, types.float32)
        n_ent = n_tok * k
        tid = cuda.threadIdx.x
        if tid < n_ent:
            s_ids[tid] = ids[tid]
        for i in range(tid, COL_SLOTS, cuda.blockDim.x):
            s_col[i] = 0
            s_wt[i] = F0
        cuda.syncthreads()
        if tid == 0:
            n_u = 0
            for i in range(n_ent):
                e = s_ids[i]
                u = 0
                while u < n_u and s_exp[u] != e:
                    u += 1
                if u == n_u:  # a new expert: where its blob is
                    n_u += 1
                    where, base = _where(slot_table, layer, e, slot_off, host_off)
                    s_exp[u] = e
                    s_where[u] = where
                    s_base[u] = base + down_off
                tok = i // k
                s_col[u * MAX_TOKENS + tok] = i
                s_wt[u * MAX_TOKENS + tok] = weights[i]
            s_n[0] = n_u
        cuda.syncthreads()
        n_u = s_n[0]
        lane = tid & 31
        warp = tid >> 5
        n_warps = cuda.blockDim.x >> 5
        g = lane >> 2
        t = lane & 3
        row_a = cuda.blockIdx.x * TILE_ROWS + g
        row_b = row_a + 8
        ra = min(row_a, n_embd - 1) * row_bytes
        rb = min(row_b, n_embd - 1) * row_bytes
        tok_g = min(g, n_tok - 1)
        acc0 = F0
        acc1 = F0
        acc2 = F0
        acc3 = F0
        for unit in range(warp, n_u * n_sb, n_warps):
            u = unit // n_sb
            sb = unit - u * n_sb
            src = cache if s_where[u] == 0 else host
            o = s_base[u] + sb * sb_bytes
            # column g's h: (token g, expert u)'s entry; a token that did not choose u reads
            # some entry of the step (finite) and its column is weighted 0
            hb = s_col[u * MAX_TOKENS + tok_g] * n_ff + sb * SB_VALUES
            c0, c1, c2, c3 = sb_fn(src, o + ra, o + rb, h, hb, t, F0, F0, F0, F0)
            w0 = s_wt[u * MAX_TOKENS + 2 * t]
            w1 = s_wt[u * MAX_TOKENS + 2 * t + 1]
            acc0 += w0 * c0
            acc1 += w1 * c1
            acc2 += w0 * c2
            acc3 += w1 * c3
        store_partials(red, warp, lane, acc0, acc1, acc2, acc3)
        cuda.syncthreads()
        if warp == 0:
            for c in range(4):
                s = warp_order_sum(red, lane, c, n_warps)
                tok = 2 * t + (c & 1)
                row = row_a if c < 2 else row_b
                if tok < n_tok and row < n_embd:
                    o = tok * n_embd + row
                    out[o] = out[o] + s if accumulate else s
    return batch_down_tc


def gate_up_kernel(name: str):
    key = ("gate_up", name)
    if key not in _CACHE:
        _CACHE[key] = _gate_up(name)
    return _CACHE[key]


def down_kernel(name: str):
    key = ("down", name)
    if key not in _CACHE:
        _CACHE[key] = _down(name)
    return _CACHE[key]


def launch_tc(x1, ids1, w1, k: int, n_tok: int, *, layout: ExpertLayout, where: tuple,
              counters, h1, out1, accumulate: bool, stream, rows) -> None:
    """Both tensor-core kernels of one layer (arguments as `batch_moe.batch_moe_decode` checked
    them, flattened; `rows` caps the row tiles)."""
    gu, dn = get_format(layout.gate_up_type).name, get_format(layout.down_type).name
    n_sb_gu = layout.n_embd // SB_VALUES
    gate_up_kernel(gu)[(rows(n_blocks(layout.n_ff, TILE_ROWS)), n_tok * k),
                       32 * min(GATE_UP_WARPS, 2 * n_sb_gu), stream](
        x1, ids1, k, n_tok, *where, counters, layout.gate_row_bytes, n_sb_gu, layout.n_ff,
        layout.up_off, h1)
    n_sb_dn = layout.n_ff // SB_VALUES
    down_kernel(dn)[rows(n_blocks(layout.n_embd, TILE_ROWS)), 32 * DOWN_WARPS, stream](
        h1, ids1, w1, k, n_tok, *where, layout.down_off, layout.down_row_bytes, n_sb_dn,
        layout.n_ff, layout.n_embd, bool(accumulate), out1)


_U8, _I32, _F32 = types.uint8[::1], types.int32[::1], types.float32[::1]
_I32_2D, _I64_2D = types.int32[:, ::1], types.int64[:, ::1]
_I = types.int64
_WHERE = (_I32_2D, _I, _U8, types.int64[::1], _U8, _I64_2D)
_GU_SIG = (_F32, _I32, _I, _I) + _WHERE + (_I64_2D, _I, _I, _I, _I, _F32)
_DN_SIG = (_F32, _I32, _F32, _I, _I) + _WHERE + (_I, _I, _I, _I, _I, types.boolean, _F32)


def register_tc_moe(family: str, name: str) -> None:
    """Put a format's tensor-core gate/up and down kernels in the compile registry."""
    register_ptx(family, f"batch_gate_up_tc_{name}",
                 lambda: (gate_up_kernel(name).py_func, _GU_SIG))
    register_ptx(family, f"batch_down_tc_{name}", lambda: (down_kernel(name).py_func, _DN_SIG))


for _name in SB_FUNCS:
    register_tc_moe("batch", _name)
