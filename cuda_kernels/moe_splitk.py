"""One token's MoE in one launch with no barrier: each block owns one slice of down's columns.

A block's unit is (expert c, down super-block sb, down lane part p): the h entries that lane part
p of super-block sb dots (`lanes_k`'s slices: 64 values of Q4_K, 32 of Q5_K/Q6_K/Q8_0). The block
computes those entries itself (their gate and up rows, over x staged once), then that part's
slice of every down row of 1/n_split of the rows (n_split blocks share a unit; each computes its
gate/up alike, the copies after the first read from L2), and adds each row's router-weighted
dot into an accumulator of the whole launch. No block waits for another's h: the one-launch
kernel before this (`moe_fused`) waited at a grid barrier, then staged every h in every block;
on an H100 (2026-12-06 stamps) ~3 us of a 15.5 us layer passed between its gate/up's end and
the barrier's opening, and 1.45 us in staging h after it.

The accumulator is int64 fixed point (2^-32; |sum| < 2^31): integer adds commute, so the sums do
not depend on which block adds first, and a token's output is the same bits every run. Each
contribution is the float32 dot times its weight, truncated to the fixed point. The block that
arrives last (a ticket after a fence) converts the sums into out (= or +=) and sets them and the
ticket back to zero for the next launch. State: `scratch` int64 [n_embd + 2] (the sums, the
ticket, a flag set by a contribution the sums cannot hold: NaN, or 2^18 or more, which makes
the launch's outputs NaN), zero before the first launch.

Routing inside (n_route > 0): every block ranks the logits and takes the k weights itself
(`router.rank_topk`, `topk_weights`); block 0 also writes ids and weights for the launches after.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, types

from .elementwise import silu
from .intrinsics import SIMULATED, warp_sum
from .lanes import LaneFormat, pair_step
from .lanes_x8 import stager
from .launch import device_table, register_ptx
from .matvec import LANE_THREADS, LANE_WARPS, stage_table
from .moe_slots import ALIGN16, MAX_K, ROUTE_MAX_CAND, ROUTE_MAX_EXPERTS, resolve_shared
from .qformats import is_planar
from .router import rank_topk, topk_weights

F0 = np.float32(0.0)
FIX = np.float32(2.0 ** 32)
UNFIX = np.float32(2.0 ** -32)
NAN = np.float32(np.nan)
# The largest contribution taken, fixed point: 2^18 in value. A row sums at most 2^13
# contributions up to n_ff = 16,384 (MAX_K experts x 512 parts of 32 values), so its sum stays
# below 2^31, what int64 holds at 2^-32. A larger one (or a NaN, which the integer
# conversion would turn into a number) makes the launch's outputs NaN, as float sums would.
LIMIT = np.float32(2.0 ** 50)
# Down formats by how a lane part's values lie in its super-block (`lanes_k`'s doc):
# 0 Q4_K: 64 in a row; 1 Q5_K: 16, then 16 more 32 further; 2 Q6_K: 16, then 16 more 64 further;
# 3 Q8_0: the whole 32-value block (one lane a block).
PART_KINDS = {int(T.Q4_K): 0, int(T.Q5_K): 1, int(T.Q6_K): 2, int(T.Q8_0): 3}
# Read at launch: the grid aimed at, blocks an SM (units x n_split, n_split whole), and the
# loads a warp keeps in flight ahead of its dots (read when a kernel is made).
BLOCKS_AN_SM = 2
AHEAD = 2
# Read at launch (`moe.moe_decode`; a benchmark times both kernels in one process). Off: the
# kernel has run only in the simulator (no GPU came on 2026-12-07); `moe_fused` stays the
# engine's one launch until a GPU times this one and runs its tests.
USE = False

_CACHE: dict[tuple, object] = {}
_SMS: dict[int, int] = {}  # device id -> SMs (a driver query, not one a launch)


# Down formats taken beside any gate/up format (else only gate/up's own): the K-quants the _M
# mixes put in down, and Q8_0, where a mix falls back for rows K-quants cannot block. The
# binary's kernel bundle holds every pair `supports` allows (`register`).
DOWN_WITH = (int(T.Q4_K), int(T.Q6_K), int(T.Q8_0))


def supports(gu: LaneFormat, dn: LaneFormat) -> bool:
    """Whether the pair (gate/up as launched, down) has this kernel (gate/up rows of one step of
    a warp are the caller's to check)."""
    return (dn.ggml_type in PART_KINDS and dn.ggml_type in (gu.ggml_type,) + DOWN_WITH
            and not dn.x8 and not is_planar(gu.ggml_type))


def scratch_len(n_embd: int) -> int:
    """int64 words of the launch's state: the sums, the ticket, the overflow flag."""
    return n_embd + 2


def n_split_for(n_units: int, n_embd: int, n_sm: int) -> int:
    """Blocks a unit: the grid nearest BLOCKS_AN_SM blocks an SM, each block 32 rows or more."""
    want = max(1, round(BLOCKS_AN_SM * n_sm / n_units))
    return max(1, min(want, n_embd // 32))


def _jit() -> dict:
    return {} if SIMULATED else {"launch_bounds": (LANE_THREADS, 2)}


def _splitk(gu: LaneFormat, dn: LaneFormat, ahead: int):
    load_pair, dot_pair = pair_step(gu)
    stage_x, xs_type = stager(gu)[0], gu.xs_type
    gu_values = gu.sb_values
    n_tg, tg_type, has_tg = gu.table.size, gu.table.dtype.type, gu.has_table
    n_td, td_type, has_td = dn.table.size, dn.table.dtype.type, dn.has_table
    dn_load, dn_dot = dn.load, dn.dot
    parts, sbv, sb_bytes = dn.lanes, dn.sb_values, dn.sb_bytes
    n_pv = sbv // parts        # h entries of one unit
    pa_a, pa_pa, pa_b, pa_pb = dn.pad
    pad_sb = dn.padded_sb      # the unit's super-block of h, padded as down's dot reads it,
    hs_len = pad_sb + sbv // 16  # then its 16-value sums
    kind = PART_KINDS[dn.ggml_type]
    two = ahead == 2

    @cuda.jit(device=True, inline="always")
    def part_value(p, j):
        """Value j < n_pv of lane part p of a super-block."""
        if kind == 0:
            return 64 * p + j
        if kind == 1:
            base = 64 * (p >> 1) + 16 * (p & 1)
            return base + j if j < 16 else base + 16 + j
        if kind == 2:
            base = 128 * (p >> 2) + 32 * ((p >> 1) & 1) + 16 * (p & 1)
            return base + j if j < 16 else base + 48 + j
        return j

    @cuda.jit(device=True, inline="always")
    def pad(v):
        return v + pa_pa * (v >> pa_a) + pa_pb * (v >> pa_b)

    @cuda.jit(**_jit())
    def moe_splitk(x, ids, weights, k, slot_table, layer, cache, slot_off, host, host_off,
                   cpu_misses, miss_list, counters, gu_row_bytes, gu_n_sb, up_off, gu_sums_off,
                   tab_gu, logits, n_route, norm_topk, down_off, dn_row_bytes, dn_n_sb, n_embd,
                   accumulate, n_split, scratch, out, tab_dn):
        # x: [n_embd] f32; ids [k] i32, weights [k] f32 (outputs where n_route > 0); out:
        # [n_embd] f32 (= or += the experts' sum); scratch: int64 [n_embd + 2] (module doc).
        # Block b: unit u = b // n_split (expert position c, down super-block sb, part p, p
        # fastest: a super-block's parts in neighbouring blocks), its rows' share b % n_split.
        # Dynamic shared: x as gate/up stages it
        s_val = cuda.shared.array(ROUTE_MAX_EXPERTS, types.float32)
        s_key = cuda.shared.array(ROUTE_MAX_EXPERTS, types.int64, alignment=ALIGN16)
        s_cand = cuda.shared.array(ROUTE_MAX_CAND, types.int64, alignment=ALIGN16)
        s_id = cuda.shared.array(MAX_K, types.int32)
        s_top = cuda.shared.array(MAX_K, types.float32)
        s_ids = cuda.shared.array(MAX_K, types.int32)  # topk_weights' ids (s_id's copy)
        s_wt = cuda.shared.array(MAX_K, types.float32)
        s_red = cuda.shared.array(32, types.float32)
        s_where = cuda.shared.array(MAX_K, np.int32)
        s_base = cuda.shared.array(MAX_K, np.int64)
        tab_g = cuda.shared.array(n_tg, tg_type)
        tab_d = cuda.shared.array(n_td, td_type)
        hs = cuda.shared.array(hs_len, types.float32)
        s_last = cuda.shared.array(1, types.int32)   # whether this block is the last
        s_flag = cuda.shared.array(1, types.int64)   # the overflow flag, read by the last block
        xs = cuda.shared.array(0, xs_type)
        t = cuda.threadIdx.x
        lane = t & 31
        w = t >> 5
        if n_route > 0:  # the same in every block
            rank_topk(logits, 0, n_route, k, s_val, s_key, s_cand, s_id, s_top)
            topk_weights(n_route, k, norm_topk, s_ids, s_wt, s_val, s_id, s_top, s_red)
            cuda.syncthreads()
            if cuda.blockIdx.x == 0 and t < k:
                ids[t] = s_id[t]
                weights[t] = s_wt[t]
        elif t < k:
            s_wt[t] = weights[t]
        resolve_shared(s_id if n_route > 0 else ids, k, slot_table, layer, slot_off, host_off,
                       cpu_misses, miss_list, counters, s_where, s_base, True)
        u = cuda.blockIdx.x // n_split
        share = cuda.blockIdx.x - u * n_split
        per_c = dn_n_sb * parts
        c = u // per_c
        rem = u - c * per_c
        sb = rem // parts
        p = rem - sb * parts
        for i in range(t, hs_len, LANE_THREADS):
            hs[i] = F0  # entries outside the unit's part stay zero (their sums too)
        cuda.syncthreads()
        where = s_where[c]  # the same in the whole block
        src = cache if where == 0 else host
        base = s_base[c]
        if where < 0:  # left to the CPU: dummy loads of one expert's bytes, never used; from
            # mapped host memory only if the cache cannot hold one expert (`moe_lanes`)
            base = 0
            src = cache if cache.shape[0] >= down_off + n_embd * dn_row_bytes else host
        j = w
        off = base + (sb * sbv + part_value(p, j)) * gu_row_bytes
        cur = load_pair(src, off, off + up_off, gu_n_sb, 0)  # in flight while x is staged
        nx1 = cur
        if two and w + LANE_WARPS < n_pv:
            off = base + (sb * sbv + part_value(p, w + LANE_WARPS)) * gu_row_bytes
            nx1 = load_pair(src, off, off + up_off, gu_n_sb, 0)
        if has_tg:
            stage_table(tab_gu, tab_g, n_tg)
        if has_td:
            stage_table(tab_dn, tab_d, n_td)
        stage_x(x, gu_n_sb * gu_values, xs, gu_sums_off)
        cuda.syncthreads()
        if where >= 0:
            while j < n_pv:
                j1 = j + (2 * LANE_WARPS if two else LANE_WARPS)
                nxt = nx1 if two else cur
                if j1 < n_pv:
                    off = base + (sb * sbv + part_value(p, j1)) * gu_row_bytes
                    nxt = load_pair(src, off, off + up_off, gu_n_sb, 0)
                g, v = dot_pair(cur, gu_n_sb, 0, xs, gu_sums_off, tab_g)
                g = warp_sum(g)
                v = warp_sum(v)
                if lane == 0:
                    hs[pad(part_value(p, j))] = silu(g) * v
                if two:
                    cur = nx1
                    nx1 = nxt
                else:
                    cur = nxt
                j += LANE_WARPS
        rows_per = (n_embd + n_split - 1) // n_split
        r0 = share * rows_per
        r1 = min(r0 + rows_per, n_embd)
        dbase = base + down_off + sb * sb_bytes
        r = r0 + t
        # down's first loads (they do not read h) in flight across the block's barriers
        cur_d = dn_load(src, dbase + min(r, r1 - 1) * dn_row_bytes, p)
        nd1 = cur_d
        if two and r + LANE_THREADS < r1:
            nd1 = dn_load(src, dbase + (r + LANE_THREADS) * dn_row_bytes, p)
        cuda.syncthreads()
        if t < sbv // 16:
            acc = F0
            for i in range(16):
                acc += hs[pad(16 * t + i)]
            hs[pad_sb + t] = acc
        cuda.syncthreads()
        if where >= 0:
            wt = s_wt[c]
            while r < r1:
                r_n = r + (2 * LANE_THREADS if two else LANE_THREADS)
                nxt_d = nd1 if two else cur_d
                if r_n < r1:
                    nxt_d = dn_load(src, dbase + r_n * dn_row_bytes, p)
                dq = dn_dot(cur_d, p, hs, 0, pad_sb, tab_d) * wt * FIX
                if not abs(dq) < LIMIT:  # NaN, or past what the sums hold: out becomes NaN
                    scratch[n_embd + 1] = 1
                    dq = F0
                cuda.atomic.add(scratch, r, np.int64(dq))
                if two:
                    cur_d = nd1
                    nd1 = nxt_d
                else:
                    cur_d = nxt_d
                r += LANE_THREADS
        cuda.syncthreads()
        if t == 0:
            cuda.threadfence()  # this block's sums before its ticket
            s_last[0] = 1 if cuda.atomic.add(scratch, n_embd, 1) == cuda.gridDim.x - 1 else 0
        cuda.syncthreads()
        if s_last[0] != 0:  # every other block's sums are in
            cuda.threadfence()
            if t == 0:
                s_flag[0] = cuda.atomic.exch(scratch, n_embd + 1, np.int64(0))
            cuda.syncthreads()
            scale = UNFIX if s_flag[0] == 0 else NAN
            for i in range(t, n_embd, LANE_THREADS):
                f = np.float32(cuda.atomic.exch(scratch, i, np.int64(0))) * scale
                out[i] = out[i] + f if accumulate else f
            if t == 0:
                scratch[n_embd] = 0
    return moe_splitk


def _kernel(gu: LaneFormat, dn: LaneFormat):
    key = (gu.ggml_type, gu.x8, dn.ggml_type, AHEAD)
    if key not in _CACHE:
        _CACHE[key] = _splitk(gu, dn, AHEAD)
    return _CACHE[key]


def _sms() -> int:
    dev = cuda.get_current_device()
    if dev.id not in _SMS:
        _SMS[dev.id] = dev.MULTIPROCESSOR_COUNT
    return _SMS[dev.id]


def launch(x, ids, weights, *, k, where, miss_list, counters, layout, gu, dn, logits, n_route,
           norm_topk, accumulate, out, scratch, stream, n_sm: int | None = None,
           n_split: int | None = None) -> None:
    """moe_decode's arguments (`where`: slot_table .. cpu_misses) as this kernel's launch.
    n_sm: the SMs the grid is sized for (default: the current device's; the simulator's: 1);
    n_split: blocks a unit (default `n_split_for`; a benchmark's)."""
    n_embd, n_ff = layout.n_embd, layout.n_ff
    gu_n_sb, dn_n_sb = n_embd // gu.sb_values, n_ff // dn.sb_values
    n_units = k * dn_n_sb * dn.lanes
    if n_sm is None:
        n_sm = 1 if SIMULATED else _sms()
    if n_split is None:
        n_split = n_split_for(n_units, n_embd, n_sm)
    _kernel(gu, dn)[n_units * n_split, LANE_THREADS, stream, gu.stage_bytes(n_embd)](
        x, ids, weights, k, *where, miss_list, counters, layout.gate_row_bytes, gu_n_sb,
        layout.up_off, gu.stage_len(n_embd), device_table(gu), logits, n_route, bool(norm_topk),
        layout.down_off, layout.down_row_bytes, dn_n_sb, n_embd, bool(accumulate), n_split,
        scratch, out, device_table(dn))


CHECKED = (("Q4_K", True, "Q6_K"), ("Q4_K", True, "Q4_K"), ("Q8_0", False, "Q8_0"))


def register(family: str = "moe", *, rest: bool = False) -> None:
    """The kernels in the PTX registry: the CHECKED pairs (`moe` registers them, for the compile
    check), or with `rest` every other pair `supports` allows (`compile_bundle`: the binary's
    kernel bundle holds both, and `moe_fused`'s pairs beside them, whichever USE picks)."""
    from .lanes import LANE_FORMATS
    from .lanes_x8 import X8_FORMATS
    from .moe import _tab_type

    ups = [g for g in list(LANE_FORMATS.values()) + list(X8_FORMATS.values())
           if not is_planar(g.ggml_type)]
    pairs = [(g, d) for g in ups for d in LANE_FORMATS.values()
             if supports(g, d) and ((g.name, g.x8, d.name) in CHECKED) != rest]
    u8, i32, i64, f32 = types.uint8[::1], types.int32[::1], types.int64[::1], types.float32[::1]
    n = types.int64
    for g, d in pairs:
        # x, ids, weights, k, slot_table .. cpu_misses, miss_list, counters, gate/up's geometry,
        # tab_gu, logits, n_route, norm_topk, down's geometry, n_embd, accumulate, n_split,
        # scratch, out, tab_dn
        sig = ((f32, i32, f32, n, types.int32[:, ::1], n, u8, i64, u8, types.int64[:, ::1],
                types.boolean, i32, types.int64[:, ::1], n, n, n, n, _tab_type(g),
                types.float32[:, ::1], n, types.boolean, n, n, n, n, types.boolean, n, i64, f32,
                _tab_type(d)))
        register_ptx(family, f"moe_splitk_{'x8_' if g.x8 else ''}{g.name}_{d.name}",
                     lambda g=g, d=d, sig=sig: (_splitk(g, d, AHEAD).py_func, sig),
                     options=_jit())
