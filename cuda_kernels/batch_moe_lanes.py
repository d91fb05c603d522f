"""The batched MoE decode's lane kernels (formats with a lane decoding, `lanes`); `batch_moe`
launches them and falls back to its generic kernels for other formats.

* gate_up, grouped by expert: block (row block, entry) where entry = (token, top-k position).
  The first entry that names an expert owns it: its block computes that expert's h rows for
  every token of the step that chose it, loading each weight super-block once and dotting it
  with each of those tokens' staged x (`lanes_batch.token_steps`, tokens in groups that fit the
  shared memory, only the tokens that chose it dotted); the other entries' blocks only count
  their hit or miss. So an expert's gate
  and up rows are read once per step however many tokens chose it. A warp computes `rpw` h rows
  in turn (`gate_up_rows_per_warp`: about GATE_UP_BLOCKS blocks a step), so a block stages its
  tokens' x once for rpw * LANE_WARPS rows.
* down, per token: block (row block, token), the one-token lane kernel's work (`moe`'s
  moe_down_lanes: two output rows per 1 << log warps, units of (expert, super-block) in the
  token's top-k order) for that token; tokens that share an expert read its rows side by side
  (L2).

A token's h and output are computed with the one-token lane kernels' steps and order, so they do
not depend on the other tokens of the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda, from_dtype, types

from .elementwise import silu
from .intrinsics import warp_sum
from .lanes import LaneFormat, combine_split, lane_format
from .lanes_batch import (BATCH_JIT_OPTIONS, batch_jit, stage_token, token_floats, token_steps,
                          tokens_fit, tokens_per_block)
from .launch import n_blocks, register_ptx
from .matvec import LANE_WARPS, PART_SLOTS, lane_split, lanes_fit, stage_table
from .moe import ExpertLayout
from .moe_lanes import _unit
from .moe_slots import MAX_K
from .qformats import BY_NAME, get_format
from .xstage import padded_bytes, padded_len, stage_padded

MAX_TOKENS = 8
MAX_ENTRIES = MAX_TOKENS * MAX_K  # (token, top-k position) entries of a step
F0 = np.float32(0.0)
# gate_up blocks a step aims at (owners and the entries that only count): enough row blocks per
# entry that the owners fill the SMs about twice at two blocks each, rows per warp past that so
# each owner stages its tokens' x once for many rows
GATE_UP_BLOCKS = 1024

_CACHE: dict[tuple, object] = {}


@cuda.jit(device=True, inline="always")
def _where(slot_table, layer, e, slot_off, host_off):
    """(0, byte offset in the cache) for a cached expert, (1, byte offset in host) for a miss."""
    slot = slot_table[layer, e]
    if slot >= 0:
        return 0, slot_off[slot]
    return 1, host_off[layer, e]


@cuda.jit(device=True, inline="always")
def claim_expert(ids, n_ent, slot_table, layer, slot_off, host_off, counters, s_ids, s_ent, s_n):
    """The grouped gate/up's block-wide start (every thread calls it): the block's entry
    (blockIdx.y) names expert e; the first entry naming e owns it. Returns (n_e, where, base):
    n_e the entries naming e, listed in s_ent (the owner's block; 0 elsewhere), and where e's
    blob is (`_where`). Each entry's hit or miss is counted once (row block 0). The step's ids
    are scanned from shared memory (s_ids [n_ent] i32), not L2."""
    entry = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    if tid < n_ent:
        s_ids[tid] = ids[tid]
    e = ids[entry]
    where, base = _where(slot_table, layer, e, slot_off, host_off)
    cuda.syncthreads()
    if tid == 0:
        if cuda.blockIdx.x == 0:
            cuda.atomic.add(counters, (layer, where), 1)
        owner = True
        for i in range(entry):
            if s_ids[i] == e:
                owner = False
        n = 0
        if owner:  # a token's top-k are distinct: at most one entry per token
            for i in range(entry, n_ent):
                if s_ids[i] == e and n < MAX_TOKENS:
                    s_ent[n] = i
                    n += 1
        s_n[0] = n
    cuda.syncthreads()
    return s_n[0], where, base


def _grouped_gate_up(lf: LaneFormat, tg: int):
    run = token_steps(lf, tg)
    n_values, per_step = lf.sb_values, lf.sbs_per_step
    pa_a, pa_pa, pa_b, pa_pb = lf.pad
    sums = lf.sums
    n_tab, tab_type, has_tab = lf.table.size, lf.table.dtype.type, lf.has_table

    @cuda.jit(**batch_jit())
    def batch_gate_up_lanes(x, ids, k, n_tok, slot_table, layer, cache, slot_off, host, host_off,
                            counters, row_bytes, n_sb, n_ff, up_off, tok_floats, sums_off, rpw,
                            h, tab):
        # x: [n_tok * n_embd] f32; ids: [n_tok * k] i32; h: [n_tok * k * n_ff] f32; one warp per
        # h row (its gate and up rows), rpw rows in turn; block x covers rows
        # [x * rpw * LANE_WARPS, (x + 1) * rpw * LANE_WARPS); dynamic shared: [tg, tok_floats]
        # f32, staged tokens
        s_ids = cuda.shared.array(MAX_ENTRIES, types.int32)
        s_ent = cuda.shared.array(MAX_TOKENS, types.int32)
        s_n = cuda.shared.array(1, types.int32)
        tab_s = cuda.shared.array(n_tab, tab_type)
        xs = cuda.shared.array(0, types.float32)
        tid = cuda.threadIdx.x
        n_e, where, base = claim_expert(ids, n_tok * k, slot_table, layer, slot_off, host_off,
                                        counters, s_ids, s_ent, s_n)
        if n_e == 0:  # the same in the whole block
            return
        src = cache if where == 0 else host
        row_first = cuda.blockIdx.x * rpw * LANE_WARPS + (tid >> 5)
        n_cols = n_sb * n_values
        if has_tab:
            stage_table(tab, tab_s, n_tab)
        acc_g = cuda.local.array(tg, types.float32)
        acc_u = cuda.local.array(tg, types.float32)
        for c0 in range(0, n_e, tg):
            n_valid = min(tg, n_e - c0)  # tokens of this group (the same in the whole block)
            for j in range(tg):
                if j < n_valid:
                    t = s_ent[c0 + j] // k
                    stage_token(x, t * n_cols, n_cols, xs, j * tok_floats, pa_a, pa_pa, pa_b,
                                pa_pb, sums, sums_off)
            cuda.syncthreads()
            for i in range(rpw):  # the staged tokens serve all the block's rows
                row = row_first + i * LANE_WARPS
                off_g = base + min(row, n_ff - 1) * row_bytes
                for j in range(tg):
                    acc_g[j] = F0
                    acc_u[j] = F0
                run(src, off_g, off_g + up_off, n_sb, xs, tok_floats, sums_off, tab_s, 0,
                    per_step, n_valid, acc_g, acc_u)
                for j in range(tg):
                    g = warp_sum(acc_g[j])
                    u = warp_sum(acc_u[j])
                    if (tid & 31) == 0 and row < n_ff and c0 + j < n_e:
                        h[s_ent[c0 + j] * n_ff + row] = silu(g) * u
            cuda.syncthreads()  # the next group restages xs
    return batch_gate_up_lanes


def _token_down(lf: LaneFormat):
    load, dot = lf.load, lf.dot
    lanes, per_step = lf.lanes, lf.sbs_per_step
    sb_bytes, sb_values, sb_padded, sb_sums = (lf.sb_bytes, lf.sb_values, lf.padded_sb,
                                               lf.sb_values // 16)
    pa_a, pa_pa, pa_b, pa_pb = lf.pad
    sums = lf.sums
    n_tab, tab_type, has_tab = lf.table.size, lf.table.dtype.type, lf.has_table

    @cuda.jit(**batch_jit())
    def batch_down_lanes(h, ids, weights, k, slot_table, layer, cache, slot_off, host, host_off,
                         down_off, row_bytes, n_sb, inv_n_sb, n_embd, accumulate, sums_off, log,
                         out, tab):
        # h: [n_tok * k * n_ff] f32; ids, weights: [n_tok * k]; out: [n_tok * n_embd] f32
        # (= or += sum_k w_k down_k h_k); block (row block, token); unit c * n_sb + sb is
        # super-block sb of the token's c-th expert; dynamic shared: the token's padded h
        # [sums_off] f32, then (sums) its 16-value sums
        s_where = cuda.shared.array(MAX_K, np.int32)
        s_base = cuda.shared.array(MAX_K, np.int64)
        s_wt = cuda.shared.array(MAX_K, np.float32)
        s_part = cuda.shared.array(PART_SLOTS, types.float32)
        tab_s = cuda.shared.array(n_tab, tab_type)
        xs = cuda.shared.array(0, types.float32)
        tok = cuda.blockIdx.y
        t = cuda.threadIdx.x
        if t < k:
            where, base = _where(slot_table, layer, ids[tok * k + t], slot_off, host_off)
            s_where[t] = where
            s_base[t] = base + down_off
            s_wt[t] = weights[tok * k + t]
        n_units = k * n_sb
        sub = (t >> 5) & ((1 << log) - 1)
        u_first = sub * per_step
        u_stride = per_step << log
        row0 = (cuda.blockIdx.x * (LANE_WARPS >> log) + ((t >> 5) >> log)) * 2
        off_a = min(row0, n_embd - 1) * row_bytes
        off_b = min(row0 + 1, n_embd - 1) * row_bytes
        part = t & (lanes - 1)
        grp = (t & 31) // lanes
        if has_tab:
            stage_table(tab, tab_s, n_tab)
        stage_padded(h, tok * n_units * sb_values, n_units * sb_values, xs, pa_a, pa_pa, pa_b,
                     pa_pb, sums, sums_off)
        cuda.syncthreads()
        last_u = n_units - 1
        c, sb = _unit(min(u_first + grp, last_u), n_sb, inv_n_sb)
        src = cache if s_where[c] == 0 else host
        off = s_base[c] + sb * sb_bytes
        cur_a = load(src, off + off_a, part)
        cur_b = load(src, off + off_b, part)
        acc_a = F0
        acc_b = F0
        for u0 in range(u_first, n_units, u_stride):
            cn, sbn = _unit(min(u0 + u_stride + grp, last_u), n_sb, inv_n_sb)
            src = cache if s_where[cn] == 0 else host
            off = s_base[cn] + sbn * sb_bytes
            nxt_a = load(src, off + off_a, part)
            nxt_b = load(src, off + off_b, part)
            q = c * n_sb + sb                   # position of the unit's h slice
            da = dot(cur_a, part, xs, q * sb_padded, sums_off + q * sb_sums, tab_s)
            db = dot(cur_b, part, xs, q * sb_padded, sums_off + q * sb_sums, tab_s)
            if u0 + grp < n_units:
                acc_a += s_wt[c] * da
                acc_b += s_wt[c] * db
            cur_a = nxt_a
            cur_b = nxt_b
            c = cn
            sb = sbn
        acc_a, acc_b = combine_split(warp_sum(acc_a), warp_sum(acc_b), s_part, log)
        if (t & 31) == 0 and sub == 0:
            o = tok * n_embd + row0
            if row0 < n_embd:
                out[o] = out[o] + acc_a if accumulate else acc_a
            if row0 + 1 < n_embd:
                out[o + 1] = out[o + 1] + acc_b if accumulate else acc_b
    return batch_down_lanes


def grouped_gate_up(lf: LaneFormat, tg: int):
    key = ("gate_up", lf.ggml_type, tg)
    if key not in _CACHE:
        _CACHE[key] = _grouped_gate_up(lf, tg)
    return _CACHE[key]


def token_down(lf: LaneFormat):
    key = ("down", lf.ggml_type)
    if key not in _CACHE:
        _CACHE[key] = _token_down(lf)
    return _CACHE[key]


@dataclass(frozen=True, slots=True)
class LanesPlan:
    """How `batch_moe` launches the lane kernels for one layout, k and batch size."""

    gu: LaneFormat
    dn: LaneFormat
    tg: int             # tokens staged per gate_up block
    log: int            # log2 of the warps sharing a down row pair
    rpw: int = 1        # h rows each gate_up warp computes in turn


def lanes_plan(layout: ExpertLayout, k: int, n_tok: int) -> LanesPlan | None:
    """The lane kernels' launch plan, or None where a format has no lane decoding or a token's
    x (gate_up) or k h vectors (down) do not fit one block's shared memory."""
    gu = lane_format(get_format(layout.gate_up_type).ggml_type)
    dn = lane_format(get_format(layout.down_type).ggml_type)
    if gu is None or dn is None or tokens_fit(gu, layout.n_embd) < 1:
        return None
    if not lanes_fit(dn, k * layout.n_ff) or layout.n_embd % gu.sb_values:
        return None
    if layout.n_ff % dn.sb_values:
        return None
    n_sb = layout.n_ff // dn.sb_values
    return LanesPlan(gu, dn, tokens_per_block(gu, layout.n_embd, n_tok),
                     lane_split(dn, layout.n_embd, k * n_sb),
                     gate_up_rows_per_warp(layout.n_ff, n_tok * k))


def gate_up_rows_per_warp(n_ff: int, n_entries: int) -> int:
    """h rows per gate_up warp: row blocks per entry for about GATE_UP_BLOCKS blocks in all,
    each warp taking the rows those blocks leave."""
    n_rb = n_blocks(n_ff, LANE_WARPS)  # row blocks at one row per warp
    want = max(1, -(-GATE_UP_BLOCKS // max(1, n_entries)))
    return -(-n_rb // min(n_rb, want))


def launch_lanes(p: LanesPlan, x, ids, weights, k: int, n_tok: int, *, layout: ExpertLayout,
                 where: tuple, counters, h1, out, accumulate: bool, stream, rows, tables) -> None:
    """Both lane kernels of one layer (arguments as `batch_moe.batch_moe_decode` checked them;
    `rows` caps the row blocks, `tables` = (gate_up table, down table) on the device)."""
    n_sb_gu = layout.n_embd // p.gu.sb_values
    tf = token_floats(p.gu, layout.n_embd)
    grouped_gate_up(p.gu, p.tg)[(rows(n_blocks(layout.n_ff, LANE_WARPS * p.rpw)), n_tok * k),
                                32 * LANE_WARPS, stream, 4 * p.tg * tf](
        x, ids, k, n_tok, *where, counters, layout.gate_row_bytes, n_sb_gu, layout.n_ff,
        layout.up_off, tf, padded_len(layout.n_embd, p.gu.pad), p.rpw, h1, tables[0])
    n_sb = layout.n_ff // p.dn.sb_values
    token_down(p.dn)[(rows(n_blocks(layout.n_embd, 2 * (LANE_WARPS >> p.log))), n_tok),
                     32 * LANE_WARPS, stream, padded_bytes(k * layout.n_ff, p.dn.pad, p.dn.sums)](
        h1, ids, weights, k, *where, layout.down_off, layout.down_row_bytes, n_sb,
        np.float32(1.0 / n_sb), layout.n_embd, bool(accumulate),
        padded_len(k * layout.n_ff, p.dn.pad), p.log, out, tables[1])


_U8, _I32, _I64, _F32 = types.uint8[::1], types.int32[::1], types.int64[::1], types.float32[::1]
_I32_2D, _I64_2D = types.int32[:, ::1], types.int64[:, ::1]
_WHERE = (_I32_2D, types.int64, _U8, _I64, _U8, _I64_2D)
_I = types.int64
_GU_SIG = (_F32, _I32, _I, _I) + _WHERE + (_I64_2D, _I, _I, _I, _I, _I, _I, _I, _F32)
_DN_SIG = (_F32, _I32, _F32, _I) + _WHERE + (_I, _I, _I, types.float32, _I, types.boolean, _I,
                                              _I, _F32)


def _tab_type(lf):
    return types.Array(from_dtype(lf.table.dtype), 1, "C")


def register_gate_up(family: str, lf: LaneFormat, tg: int) -> None:
    """Put the grouped gate/up kernel of (format, tokens per block) in the compile registry, with
    its launch bounds."""
    register_ptx(family, f"batch_gate_up_lanes_{lf.name}_t{tg}",
                 lambda: (_grouped_gate_up(lf, tg).py_func, _GU_SIG + (_tab_type(lf),)),
                 options=BATCH_JIT_OPTIONS)


def register_down(family: str, lf: LaneFormat) -> None:
    """Put the per-token down kernel of a format in the compile registry, with its launch
    bounds."""
    register_ptx(family, f"batch_down_lanes_{lf.name}",
                 lambda: (_token_down(lf).py_func, _DN_SIG + (_tab_type(lf),)),
                 options=BATCH_JIT_OPTIONS)


# The Q4_K_M mix at 2..8 sequences: Q4_K gate/up at 2..5 tokens a block (n_embd 2048), Q4_K and
# Q6_K down. Other formats compile on first use.
for _tg in (2, 3, 4, 5):
    register_gate_up("batch", lane_format(BY_NAME["Q4_K"].ggml_type), _tg)
for _name in ("Q4_K", "Q6_K"):
    register_down("batch", lane_format(BY_NAME[_name].ggml_type))
