"""The MoE decode kernels of formats with a lane decoding (`lanes`), launched by `moe.moe_decode`
(see its module doc for the data they read): gate/up as items of (h entry, expert) over one
wave of blocks, each block staging x once; gate/up for rows of several steps; down as
(expert, super-block) units of two output rows per warp."""

from __future__ import annotations

import numpy as np
from numba import cuda, types

from .elementwise import silu
from .intrinsics import warp_sum
from .lanes import LaneFormat, combine_split, pair_step, row_pair_steps
from .lanes_between import x_and_table
from .matvec import LANE_THREADS, LANE_WARPS, PART_SLOTS, lane_jit, stage_table
from .moe_slots import MAX_K, resolve_compact, route_resolve
from .lanes_x8 import stager
from .xstage import stage_padded_wide

F0 = np.float32(0.0)


@cuda.jit(device=True, inline="always")
def first_item(k, n_items, s_where, s_base, cache, host, row_bytes, up_off):
    """The calling warp's first gate/up item it = row * k + kk (the same in the whole warp):
    (it, row, kk, where, src, off_g), its gate row at off_g of src (the cache, or mapped host
    memory); where < 0 for nothing to read (an idle warp, an expert left to the CPU), and then
    a dummy row of the cache to load, never used (of mapped host memory only if the cache cannot
    hold one expert's gate and up rows: then every expert is a miss anyway)."""
    it = cuda.blockIdx.x * LANE_WARPS + (cuda.threadIdx.x >> 5)
    row = it // k
    kk = it - row * k
    where = s_where[kk] if it < n_items else -1
    off_g = s_base[kk] + row * row_bytes
    src = cache if where == 0 else host
    if where < 0:
        off_g = 0
        src = cache if cache.shape[0] >= up_off + row_bytes else host
    return it, row, kk, where, src, off_g


def gate_up_items(lf: LaneFormat):
    """Device functions of the one-step gate/up item loop (see moe_gate_up_lanes), shared with
    the fused kernel (`moe_fused`):
      first(k, n_items, s_where, s_base, cache, host, row_bytes, up_off, n_sb)
          -> (it, row, kk, cur)        this warp's first item and its loads (issue them early)
      run(it, row, kk, cur, k, n_items, s_where, s_base, cache, host, row_bytes, up_off, n_sb,
          xs, sums_off, tab_s, h, n_ff, step_row, step_kk)   the warp's items, each next one
                                        loaded before the current one is dotted; h entries
                                        written by lane 0; (step_row, step_kk): `item_step`"""
    load_pair, dot_pair = pair_step(lf)

    @cuda.jit(device=True, inline="always")
    def first(k, n_items, s_where, s_base, cache, host, row_bytes, up_off, n_sb):
        it, row, kk, where, src, off_g = first_item(k, n_items, s_where, s_base, cache, host,
                                                    row_bytes, up_off)
        return it, row, kk, load_pair(src, off_g, off_g + up_off, n_sb, 0)

    @cuda.jit(device=True, inline="always")
    def run(it, row, kk, cur, k, n_items, s_where, s_base, cache, host, row_bytes, up_off, n_sb,
            xs, sums_off, tab_s, h, n_ff, step_row, step_kk):
        n_warps = cuda.gridDim.x * LANE_WARPS
        # (row, kk) of the next item, it + n_warps, by adding (step_row, step_kk) (`item_step`)
        # with one carry: a 64-bit division by k per item was a tenth of the kernel's
        # instructions
        while it < n_items:
            nxt = cur
            it1 = it + n_warps
            row1 = row + step_row
            kk1 = kk + step_kk
            if kk1 >= k:
                kk1 -= k
                row1 += 1
            if it1 < n_items:
                where1 = s_where[kk1]
                if where1 >= 0:  # never a read for an expert left to the CPU
                    off1 = s_base[kk1] + row1 * row_bytes
                    src1 = cache if where1 == 0 else host
                    nxt = load_pair(src1, off1, off1 + up_off, n_sb, 0)
            where = s_where[kk]
            g = F0
            u = F0
            if where >= 0:
                g, u = dot_pair(cur, n_sb, 0, xs, sums_off, tab_s)
            g = warp_sum(g)
            u = warp_sum(u)
            if (cuda.threadIdx.x & 31) == 0:
                h[kk * n_ff + row] = silu(g) * u if where >= 0 else F0
            cur = nxt
            it = it1
            row = row1
            kk = kk1
    return first, run


@cuda.jit(device=True, inline="always")
def item_step(k):
    """(rows, experts) from a gate/up item to the same warp's next, the grid's warps later: the
    kernel's one division by k for them (`gate_up_items`' run and `between_first_item`)."""
    n_warps = cuda.gridDim.x * LANE_WARPS
    step_row = n_warps // k
    return step_row, n_warps - step_row * k


def between_first_item(lf: LaneFormat):
    """Device function for the one-step gate/up items (`gate_up_items`) on 8-bit x, each warp's
    first item with x asked for between its gate and up rows (`lanes_between`):
      first(k, n_items, s_where, s_base, cache, host, row_bytes, up_off, n_sb, x, xs, sums_off,
            tab, tab_s, h, n_ff, step_row, step_kk) -> (it, row, kk, cur)
    The warp asks for its first item's gate row, then its octets of x (and the table's
    entries), then the up row and its second item's rows; the whole block stages the table and
    x and synchronises; the warp dots the first item (gate, then up, as `dot_pair`) and writes
    its h entry, and returns its second item and that item's loads for `gate_up_items`' run,
    which goes on as from its first: the same items, dots and sums."""
    if not lf.x8:
        raise ValueError(f"{lf.name}: x between the rows is for the 8-bit decodings")
    load, dot = lf.load, lf.dot
    lanes = lf.lanes
    sb_bytes, sb_padded, sb_sums = lf.sb_bytes, lf.padded_sb, lf.sb_sums
    ask, put = x_and_table(lf, LANE_THREADS)

    @cuda.jit(device=True, inline="always")
    def first(k, n_items, s_where, s_base, cache, host, row_bytes, up_off, n_sb, x, xs, sums_off,
              tab, tab_s, h, n_ff, step_row, step_kk):
        lane = cuda.threadIdx.x & 31
        part = lane & (lanes - 1)
        grp = lane // lanes
        sb = min(grp, n_sb - 1)
        it, row, kk, where, src, off_g = first_item(k, n_items, s_where, s_base, cache, host,
                                                    row_bytes, up_off)
        cur_g = load(src, off_g + sb * sb_bytes, part)
        pre = ask(x, n_sb, tab)
        # the second item: (row, kk) + the grid's warps by one carry, as run steps
        it1 = it + cuda.gridDim.x * LANE_WARPS
        row1 = row + step_row
        kk1 = kk + step_kk
        if kk1 >= k:
            kk1 -= k
            row1 += 1
        cur_u = cur_g
        nxt = (cur_g, cur_g)
        if row_bytes > 0:  # the third group, behind a branch of its own
            cur_u = load(src, off_g + up_off + sb * sb_bytes, part)
            if it1 < n_items:
                where1 = s_where[kk1]
                if where1 >= 0:  # never a read for an expert left to the CPU
                    off1 = s_base[kk1] + row1 * row_bytes
                    src1 = cache if where1 == 0 else host
                    nxt = (load(src1, off1 + sb * sb_bytes, part),
                           load(src1, off1 + up_off + sb * sb_bytes, part))
        put(pre, x, n_sb, xs, sums_off, tab_s)
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


def _gate_up_lanes(lf: LaneFormat):
    first, run = gate_up_items(lf)
    n_values = lf.sb_values
    stage, xs_type = stager(lf)[0], lf.xs_type
    n_tab, tab_type, has_tab = lf.table.size, lf.table.dtype.type, lf.has_table

    @cuda.jit(**lane_jit(lf))
    def moe_gate_up_lanes(x, ids, k, n_items, slot_table, layer, cache, slot_off, host, host_off,
                          cpu_misses, miss_list, counters, row_bytes, n_sb, n_ff, up_off,
                          sums_off, h, tab, logits, n_route, norm_topk, weights):
        # Rows of one step (n_sb <= the format's super-blocks per step: 2048 columns of Q4_K).
        # x: [n_embd] f32; ids: [k] i32; h: [k * n_ff] f32 (silu(gate) * up per expert). Items
        # it = row * k + kk (h entry `row` of the kk-th expert: its gate and up rows) for
        # it < n_items, spread over every warp of the grid (a warp takes it, it + warps of the
        # grid, ...); x is staged once per block for all k experts. n_route > 0: every block
        # routes logits [1, n_route] f32 itself, block 0 writing ids and weights [k] f32 for
        # the down launch (`route_shared`); else ids is the router's. The next item's loads are
        # issued before the current one is dotted (the first item's before x is staged): a
        # warp taking its items in turn would wait a full memory latency for each. Dynamic
        # shared: x as lf stages it (`lanes_x8.stager`), its sums or scales from sums_off
        s_where = cuda.shared.array(MAX_K, np.int32)
        s_base = cuda.shared.array(MAX_K, np.int64)
        tab_s = cuda.shared.array(n_tab, tab_type)
        xs = cuda.shared.array(0, xs_type)
        route_resolve(logits, n_route, k, norm_topk, ids, weights, slot_table, layer, slot_off,
                      host_off, cpu_misses, miss_list, counters, s_where, s_base, True)
        cuda.syncthreads()
        it, row, kk, cur = first(k, n_items, s_where, s_base, cache, host, row_bytes, up_off,
                                 n_sb)  # in flight while x is staged
        if has_tab:
            stage_table(tab, tab_s, n_tab)
        stage(x, n_sb * n_values, xs, sums_off)
        cuda.syncthreads()
        step_row, step_kk = item_step(k)
        run(it, row, kk, cur, k, n_items, s_where, s_base, cache, host, row_bytes, up_off, n_sb,
            xs, sums_off, tab_s, h, n_ff, step_row, step_kk)
    return moe_gate_up_lanes


def _gate_up_lanes_rows(lf: LaneFormat):
    first, run = row_pair_steps(lf)
    n_values, per_step = lf.sb_values, lf.sbs_per_step
    stage, xs_type = stager(lf)[0], lf.xs_type
    n_tab, tab_type, has_tab = lf.table.size, lf.table.dtype.type, lf.has_table

    @cuda.jit(**lane_jit(lf))
    def moe_gate_up_lanes_rows(x, ids, k, n_items, slot_table, layer, cache, slot_off, host,
                               host_off, cpu_misses, miss_list, counters, row_bytes, n_sb, n_ff,
                               up_off, sums_off, h, tab, logits, n_route, norm_topk, weights):
        # Rows of several steps (see moe_gate_up_lanes for one, and for n_route): a warp's
        # steps of one item pipelined (`run`), items in turn.
        # x: [n_embd] f32; ids: [k] i32; h: [k * n_ff] f32 (silu(gate) * up per expert). Items
        # it = row * k + kk (h entry `row` of the kk-th expert: its gate and up rows) for
        # it < n_items, spread over every warp of the grid (a warp takes it, it + warps of the
        # grid, ...): x is staged once per block for all k experts, and a block's warps keep
        # loading rows instead of waiting on a fresh block's staging. Dynamic shared: x as lf
        # stages it (`lanes_x8.stager`), its sums or scales from sums_off
        s_where = cuda.shared.array(MAX_K, np.int32)
        s_base = cuda.shared.array(MAX_K, np.int64)
        tab_s = cuda.shared.array(n_tab, tab_type)
        xs = cuda.shared.array(0, xs_type)
        t = cuda.threadIdx.x
        route_resolve(logits, n_route, k, norm_topk, ids, weights, slot_table, layer, slot_off,
                      host_off, cpu_misses, miss_list, counters, s_where, s_base, True)
        if has_tab:
            stage_table(tab, tab_s, n_tab)
        stage(x, n_sb * n_values, xs, sums_off)
        cuda.syncthreads()
        n_warps = cuda.gridDim.x * LANE_WARPS
        for it in range(cuda.blockIdx.x * LANE_WARPS + (t >> 5), n_items, n_warps):
            row = it // k
            kk = it - row * k
            where = s_where[kk]  # the same in the whole warp
            g = F0
            u = F0
            if where >= 0:
                src = cache if where == 0 else host
                off_g = s_base[kk] + row * row_bytes
                cur = first(src, off_g, off_g + up_off, n_sb, 0)
                g, u = run(src, off_g, off_g + up_off, n_sb, cur, xs, sums_off, tab_s, 0,
                           per_step)
            if (t & 31) == 0:
                h[kk * n_ff + row] = silu(g) * u if where >= 0 else F0
    return moe_gate_up_lanes_rows




@cuda.jit(device=True, inline="always")
def _unit(u, n_sb, inv_n_sb):
    """(expert position c, super-block sb) of unit u = c * n_sb + sb (float division, then
    corrected: u stays far below 2^24)."""
    c = int((np.float32(u) + np.float32(0.5)) * inv_n_sb)
    sb = u - c * n_sb
    if sb < 0:
        c -= 1
        sb += n_sb
    if sb >= n_sb:
        c += 1
        sb -= n_sb
    return c, sb


def down_units(lf: LaneFormat):
    """Device functions of the down kernel's unit loop (see moe_down_lanes), shared with the
    fused kernel (`moe_fused`):
      geometry(log) -> (sub, u_first, u_stride, part, grp)   this thread's place in its row pair
      rows(rb, log, n_embd, row_bytes) -> (row0, off_a, off_b)   row block rb's pair (clamped)
      first(cache, host, s_where, s_base, u, last_u, n_sb, inv_n_sb, off_a, off_b, part)
          -> (c, sb, cur_a, cur_b)     unit min(u, last_u) and its loads (issue them early)
      run(c, sb, cur_a, cur_b, n_units, u_first, u_stride, grp, cache, host, s_where, s_base,
          s_kk, s_wt, n_sb, inv_n_sb, off_a, off_b, part, xs, sums_off, tab_s) -> (acc_a, acc_b)
                                       this lane's weighted dots of the pair's units
      finish(acc_a, acc_b, s_part, log, sub, row0, n_embd, accumulate, out)   the pair's sums
                                       over its lanes and warps, into out (= or +=); the whole
                                       block calls it (it synchronises)"""
    load, dot = lf.load, lf.dot
    lanes, per_step = lf.lanes, lf.sbs_per_step
    sb_bytes, sb_padded, sb_sums = lf.sb_bytes, lf.padded_sb, lf.sb_sums

    @cuda.jit(device=True, inline="always")
    def geometry(log):
        t = cuda.threadIdx.x
        sub = (t >> 5) & ((1 << log) - 1)
        return sub, sub * per_step, per_step << log, t & (lanes - 1), (t & 31) // lanes

    @cuda.jit(device=True, inline="always")
    def rows(rb, log, n_embd, row_bytes):
        row0 = (rb * (LANE_WARPS >> log) + ((cuda.threadIdx.x >> 5) >> log)) * 2
        return row0, min(row0, n_embd - 1) * row_bytes, min(row0 + 1, n_embd - 1) * row_bytes

    @cuda.jit(device=True, inline="always")
    def first(cache, host, s_where, s_base, u, last_u, n_sb, inv_n_sb, off_a, off_b, part):
        c, sb = _unit(min(u, last_u), n_sb, inv_n_sb)
        src = cache if s_where[c] == 0 else host
        off = s_base[c] + sb * sb_bytes
        return c, sb, load(src, off + off_a, part), load(src, off + off_b, part)

    @cuda.jit(device=True, inline="always")
    def run(c, sb, cur_a, cur_b, n_units, u_first, u_stride, grp, cache, host, s_where, s_base,
            s_kk, s_wt, n_sb, inv_n_sb, off_a, off_b, part, xs, sums_off, tab_s):
        acc_a = F0
        acc_b = F0
        last_u = n_units - 1
        u0 = u_first
        while u0 < n_units:  # not a range: its trip count would divide by u_stride
            cn, sbn = _unit(min(u0 + u_stride + grp, last_u), n_sb, inv_n_sb)
            src = cache if s_where[cn] == 0 else host
            off = s_base[cn] + sbn * sb_bytes
            nxt_a = load(src, off + off_a, part)
            nxt_b = load(src, off + off_b, part)
            q = s_kk[c] * n_sb + sb             # position of the unit's h slice
            da = dot(cur_a, part, xs, q * sb_padded, sums_off + q * sb_sums, tab_s)
            db = dot(cur_b, part, xs, q * sb_padded, sums_off + q * sb_sums, tab_s)
            if u0 + grp < n_units:
                acc_a += s_wt[c] * da
                acc_b += s_wt[c] * db
            cur_a = nxt_a
            cur_b = nxt_b
            c = cn
            sb = sbn
            u0 += u_stride
        return acc_a, acc_b

    @cuda.jit(device=True, inline="always")
    def finish(acc_a, acc_b, s_part, log, sub, row0, n_embd, accumulate, out):
        acc_a, acc_b = combine_split(warp_sum(acc_a), warp_sum(acc_b), s_part, log)
        if (cuda.threadIdx.x & 31) == 0 and sub == 0:
            if row0 < n_embd:
                out[row0] = out[row0] + acc_a if accumulate else acc_a
            if row0 + 1 < n_embd:
                out[row0 + 1] = out[row0 + 1] + acc_b if accumulate else acc_b
    return geometry, rows, first, run, finish


def _down_lanes(lf: LaneFormat):
    geometry, rows, first, run, finish = down_units(lf)
    sb_values = lf.sb_values
    pa_a, pa_pa, pa_b, pa_pb = lf.pad
    sums = lf.sums
    n_tab, tab_type, has_tab = lf.table.size, lf.table.dtype.type, lf.has_table

    @cuda.jit(**lane_jit(lf))
    def moe_down_lanes(h, ids, weights, k, slot_table, layer, cache, slot_off, host, host_off,
                       cpu_misses, down_off, row_bytes, n_sb, inv_n_sb, n_embd, accumulate,
                       sums_off, log, out, tab):
        # h: [k * n_ff] f32; weights: [k] f32; out: [n_embd] f32 (= or += sum_k w_k down_k h_k);
        # two output rows per 1 << log warps (interleaved steps); unit c * n_sb + sb is
        # super-block sb of the c-th expert not left to the CPU; dynamic shared: padded h
        # [sums_off] f32, then (sums) its 16-value sums
        s_where = cuda.shared.array(MAX_K, np.int32)
        s_base = cuda.shared.array(MAX_K, np.int64)
        s_kk = cuda.shared.array(MAX_K, np.int32)
        s_wt = cuda.shared.array(MAX_K, np.float32)
        s_n = cuda.shared.array(1, np.int32)
        s_w0 = cuda.shared.array(MAX_K, np.int32)
        s_b0 = cuda.shared.array(MAX_K, np.int64)
        s_part = cuda.shared.array(PART_SLOTS, types.float32)
        tab_s = cuda.shared.array(n_tab, tab_type)
        xs = cuda.shared.array(0, types.float32)
        # h first, its loads four quads at a time: they go out before anything else and come
        # back first (loads return in issue order); resolve_compact's barriers publish it. Staged
        # after the first weight loads it waited behind them and then took a memory latency per
        # iteration: units done at 7.1 us of a 7.8 us kernel on the H200, now 6.4 of 7.0
        # (phase_stamps.py)
        if has_tab:
            stage_table(tab, tab_s, n_tab)
        stage_padded_wide(h, k * n_sb * sb_values, xs, pa_a, pa_pa, pa_b, pa_pb, sums, sums_off)
        resolve_compact(ids, weights, k, slot_table, layer, slot_off, host_off, cpu_misses,
                        down_off, s_w0, s_b0, s_where, s_base, s_kk, s_wt, s_n)
        n_units = s_n[0] * n_sb
        sub, u_first, u_stride, part, grp = geometry(log)
        row0, off_a, off_b = rows(cuda.blockIdx.x, log, n_embd, row_bytes)
        acc_a = F0
        acc_b = F0
        if n_units > 0:  # the same in the whole block
            c, sb, cur_a, cur_b = first(cache, host, s_where, s_base, u_first + grp,
                                        n_units - 1, n_sb, inv_n_sb, off_a, off_b, part)
            acc_a, acc_b = run(c, sb, cur_a, cur_b, n_units, u_first, u_stride, grp, cache,
                               host, s_where, s_base, s_kk, s_wt, n_sb, inv_n_sb, off_a, off_b,
                               part, xs, sums_off, tab_s)
        finish(acc_a, acc_b, s_part, log, sub, row0, n_embd, accumulate, out)
    return moe_down_lanes
