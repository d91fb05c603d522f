"""One token's MoE in one launch: gate/up, a barrier across the grid (`gridsync`), then down.
For lane formats whose gate/up rows take one step of a warp and whose k h vectors fit one
block's shared memory: the 30B models' Q4_K/Q6_K (2048 columns, 8 x 768 values of h).

Why one launch: down, as a launch of its own, began only once gate/up had drained, and then
resolved the experts' slots again (ids, slot table, slot offsets: three dependent reads) before
it could issue a weight load. Here the slots are resolved once, and each warp issues its first
down loads as soon as its gate/up items are done, so they are in flight across the barrier.

The kernel runs in one of three phases (an argument): 0 gate/up only, 1 down only, 2 both with
the barrier between. The GPU runs 2. The simulator runs blocks one after another, so a barrier
across blocks would never open there: it runs 0, then 1, the same code but for the barrier.
`moe.moe_decode` launches this where `fuses` holds and it is given the barrier's state (`sync`);
the results are bit for bit those of the two launches (the same dots in the same order).
"""

from __future__ import annotations

import warnings

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, types

from .gridsync import count_arrive, count_target, count_wait, grid_arrive, grid_sync, grid_wait
from .intrinsics import SIMULATED
from .lanes import LANE_FORMATS, LaneFormat
from .lanes_x8 import X8_FORMATS, stager
from .launch import MAX_SHARED_BYTES, device_table, n_blocks, register_ptx
from .matvec import (LANE_THREADS, LANE_WARPS, MIN_LANE_BLOCKS, PART_SLOTS, lane_split,
                     stage_table)
from .moe_lanes import between_first_item, down_units, gate_up_items, item_step
from .moe_slots import MAX_K, route_resolve
from .qformats import is_planar
from .xstage import padded_bytes, padded_len, stage_padded_wide, stage_padded_wide6

F0 = np.float32(0.0)
# Read at launch, so a benchmark can compare one launch with two in one process.
FUSE_DOWN = True
# The down formats fused after each gate/up format: its own and the K-quants the _M mixes put
# in down. The binary's kernel bundle holds these pairs; others run as two launches.
DOWN_WITH = (int(T.Q4_K), int(T.Q6_K))
# Read when a kernel is made (`bench/probes/moe_fused_variants.py` compares them): h staged six
# quads a thread at a time (one round of loads for 8 x 768 values, not two), and the block's
# arrival at the barrier before its first down loads are issued (not after). Each was faster on
# the H200 (2026-12-04, us a layer: Q4_K/Q4_K 15.79 neither, 15.42 both; Q4_K/Q6_K 18.09, 17.04;
# Q6_K/Q6_K 22.94, 22.26 with the arrival alone).
H_SIX = True
SPLIT_ARRIVE = True
# The barrier's form (with SPLIT_ARRIVE; read when a kernel is made and at launch; `gridsync`):
# "count", the state one 64-bit count to which each launch adds 2^32, never reset (the target
# read at the kernel's start, the arrival a release add with no value back, the wait a poll of
# the count), or
# "generation" (thread 0 reads the generation, then adds its arrival and waits for the add's
# value: two round trips before its first down loads). On an H100, the same outputs bit for bit,
# us a layer count / generation (two runs): Q4_K/Q4_K 16.09 / 16.57-16.74, Q4_K/Q6_K 17.72 /
# 18.32-18.33, Q6_K/Q6_K 22.54 / 23.33-23.40; the generation read at the kernel's start (one
# round trip left) 16.39, 18.15, 23.05 (`bench/results/2026-12-06_moe_barrier_count_h100.json`).
BARRIER = "count"
# Tried after these and dropped, each slower on the H200 at the 30B pair (2026-12-04, Q4_K/Q6_K
# 17.12 us a layer with neither): the block's down rows L2-prefetched at its barrier arrival
# (a line an instruction 18.14, one bulk prefetch a span 17.65), the layer's slot-table row read
# whole beside the ids (17.42), each warp's first two down units' loads issued before the
# barrier and later ones two ahead (Q4_K/Q4_K 16.88 against 15.50)
# (`bench/results/2026-12-04_kernels_moe_fused_variants_2.json`). Then no barrier at all: h
# written with a 2-bit tag alternating per launch and down's staging polling the entries it
# reads (code in commit 2c0961c): slower in both forms, on the H200 (Q4_K/Q4_K 17.74 against
# 15.50, `2026-12-06_moe_tagged_h_tried_h200.json`) and an H100 (18.74 against 16.69); and the
# block's down rows copied into shared memory by cp.async, at its barrier arrival or beside
# gate/up's first loads, read there after the barrier (code in commit 09a4378): on an H100
# 18.76 / 18.73 against 16.69, Q4_K/Q6_K 22.05 / 21.60 against 18.40
# (`bench/results/2026-12-06_moe_down_staged_tried_h100.json`). Nor is h's staging after the
# barrier bound by its bytes (every block reads 8 x 768 f32 from L2): staged from half of them
# (wrong sums) it saved 0.08-0.15 us a layer on an H100, so an f16 h was not built
# (`bench/results/2026-12-06_moe_half_h_tried_h100.json`).

# Blocks an SM the kernel is compiled for (launch bounds) and its gate/up grid's cap
# (MIN_LANE_BLOCKS at two): read when a kernel is made and at launch, so a benchmark can time
# both in one process. At two (127 registers, no spill) the 30B's 6,144 gate/up items give each
# warp three; at three (80 registers, a 152-byte spill with ptxas 13.0; a grid of 384) two. The
# one-token matvecs' heads gained 10-15% from a third block (`matvec.WIDE_ROUNDS`): their loads
# are what they wait on; here a third was slower on the H200 for every pair (Q4_K/Q4_K 21.57
# against 15.46 us; `bench/results/2026-12-05_kernels_moe_blocks_an_sm.json`).
BLOCKS_AN_SM = 2
# Gate/up on 8-bit x asks for each warp's first item's gate row, then x, then its up row and
# second item (`moe_lanes.between_first_item`), so x is staged and the gate row dotted while
# the up rows stream. On an H100, the same bits, us a layer (two runs each way alternating,
# `2026-12-07_x_between_h100.json`): Q4_K/Q4_K 15.32-15.38 against 15.98-16.03 (64% of a read
# of its bytes against 61%), Q4_K/Q6_K 16.83-16.85 against 17.71-17.73. Read when a kernel is
# made.
X_BETWEEN = True

# The simulator's stand-in for the blocks a GPU holds at once (a test sets a grid smaller than
# down's row blocks, as a small card's).
SIM_RESIDENT = 1 << 30

_CACHE: dict[tuple, object] = {}
_RESIDENT: dict[tuple, int] = {}  # (kernel, dynamic shared bytes) -> blocks the GPU holds
_REFUSED: dict[tuple, str] = {}   # (kernel, dynamic shared bytes) -> why the driver refused it


def fuses(gu: LaneFormat, dn: LaneFormat) -> bool:
    """Whether the pair (gate/up as launched, down) has a fused kernel."""
    return dn.ggml_type in (gu.ggml_type,) + DOWN_WITH and not dn.x8


def shared_bytes(gu: LaneFormat, dn: LaneFormat, n_embd: int, k: int, n_ff: int) -> int:
    """Dynamic shared memory: gate/up's staged x, then (the same bytes) down's staged h."""
    return max(gu.stage_bytes(n_embd), padded_bytes(k * n_ff, dn.pad, dn.sums))


def fits(gu: LaneFormat, dn: LaneFormat, n_embd: int, k: int, n_ff: int) -> bool:
    """Whether one block holds x, all k experts' h and both formats' tables."""
    return (shared_bytes(gu, dn, n_embd, k, n_ff) + gu.table.nbytes + dn.table.nbytes
            <= MAX_SHARED_BYTES)


def _jit(blocks_an_sm: int) -> dict:
    # BLOCKS_AN_SM blocks an SM (two: at most 128 registers), so a one-wave grid is resident
    return {} if SIMULATED else {"launch_bounds": (LANE_THREADS, blocks_an_sm)}


def _fused(gu: LaneFormat, dn: LaneFormat, blocks_an_sm: int, x_between: bool = False):
    gu_first, gu_run = gate_up_items(gu)
    geometry, dn_rows, dn_first, dn_run, dn_finish = down_units(dn)
    gu_values, dn_values = gu.sb_values, dn.sb_values
    stage_x, xs_type = stager(gu)[0], gu.xs_type
    pa_a, pa_pa, pa_b, pa_pb = dn.pad
    dn_sums = dn.sums
    n_tg, tg_type, has_tg = gu.table.size, gu.table.dtype.type, gu.has_table
    n_td, td_type, has_td = dn.table.size, dn.table.dtype.type, dn.has_table
    stage_h = stage_padded_wide6 if H_SIX else stage_padded_wide
    split = SPLIT_ARRIVE
    if BARRIER not in ("generation", "count"):
        raise ValueError(f"moe_fused.BARRIER: {BARRIER!r}")
    count = split and BARRIER == "count"
    between = x_between and gu.x8
    gu_between = between_first_item(gu) if between else None

    @cuda.jit(**_jit(blocks_an_sm))
    def moe_fused_lanes(x, ids, weights, k, n_items, slot_table, layer, cache, slot_off, host,
                        host_off, cpu_misses, miss_list, counters, gu_row_bytes, gu_n_sb, n_ff,
                        up_off, gu_sums_off, h, tab_gu, logits, n_route, norm_topk, down_off,
                        dn_row_bytes, dn_n_sb, inv_n_sb, n_embd, accumulate, dn_sums_off, log,
                        n_row_blocks, out, tab_dn, bar, phase):
        # x: [n_embd] f32; ids, weights: [k] (outputs where n_route > 0: see
        # moe_gate_up_lanes); h: [k * n_ff] f32; out: [n_embd] f32 (= or += the experts' sum);
        # bar: int32 [2], the barrier's state. Gate/up: items (h entry, expert) over every warp
        # of the grid; down: row blocks rb = blockIdx.x, + gridDim.x, ... < n_row_blocks, each
        # a row pair per 1 << log warps, over units (expert not left to the CPU, super-block).
        # Dynamic shared: x as gate/up stages it, then padded h [dn_sums_off] f32 and its sums
        s_where = cuda.shared.array(MAX_K, np.int32)   # by top-k position
        s_base = cuda.shared.array(MAX_K, np.int64)
        s_dwhere = cuda.shared.array(MAX_K, np.int32)  # down's list: experts not left to the CPU
        s_dbase = cuda.shared.array(MAX_K, np.int64)
        s_dkk = cuda.shared.array(MAX_K, np.int32)
        s_dwt = cuda.shared.array(MAX_K, np.float32)
        s_dn = cuda.shared.array(1, np.int32)
        s_part = cuda.shared.array(PART_SLOTS, types.float32)
        tab_g = cuda.shared.array(n_tg, tg_type)
        tab_d = cuda.shared.array(n_td, td_type)
        xs = cuda.shared.array(0, xs_type)
        hs = cuda.shared.array(0, types.float32)       # the same bytes as xs
        s_bar = cuda.shared.array(1, types.uint64)     # thread 0's: the barrier's target count
        t = cuda.threadIdx.x
        if count and phase == 2:  # compile time, then the launch's: read before any arrival
            tgt = count_target(bar)
            if t == 0:
                s_bar[0] = tgt
        route_resolve(logits, n_route, k, norm_topk, ids, weights, slot_table, layer, slot_off,
                      host_off, cpu_misses, miss_list, counters, s_where, s_base, phase != 1)
        cuda.syncthreads()
        if t < k:  # down's list, in top-k order (as moe_slots.resolve_compact makes it)
            n = 0
            for j in range(t):
                if s_where[j] >= 0:
                    n += 1
            where = s_where[t]
            if where >= 0:
                s_dwhere[n] = where
                s_dbase[n] = s_base[t] + down_off
                s_dkk[n] = t
                n += 1
            if t == k - 1:
                s_dn[0] = n
                if n == 0:  # no unit: the first down loads read one expert's bytes unused
                    s_dwhere[0] = 0 if cache.shape[0] >= down_off + n_embd * dn_row_bytes else 1
                    s_dbase[0] = down_off
        if phase != 1:
            step_row, step_kk = item_step(k)
            if between:  # compile time: the first item dotted, x staged, in `gu_between`
                it, row, kk, cur = gu_between(k, n_items, s_where, s_base, cache, host,
                                              gu_row_bytes, up_off, gu_n_sb, x, xs, gu_sums_off,
                                              tab_gu, tab_g, h, n_ff, step_row, step_kk)
            else:
                it, row, kk, cur = gu_first(k, n_items, s_where, s_base, cache, host,
                                            gu_row_bytes, up_off, gu_n_sb)  # in flight while
                if has_tg:                                                   # x is staged
                    stage_table(tab_gu, tab_g, n_tg)
                stage_x(x, gu_n_sb * gu_values, xs, gu_sums_off)
                cuda.syncthreads()
            gu_run(it, row, kk, cur, k, n_items, s_where, s_base, cache, host, gu_row_bytes,
                   up_off, gu_n_sb, xs, gu_sums_off, tab_g, h, n_ff, step_row, step_kk)
        else:
            cuda.syncthreads()  # down's list
        if phase != 0:
            n_units = s_dn[0] * dn_n_sb
            sub, u_first, u_stride, part, grp = geometry(log)
            rb = cuda.blockIdx.x
            row0, off_a, off_b = dn_rows(min(rb, n_row_blocks - 1), log, n_embd, dn_row_bytes)
            last_u = max(n_units - 1, 0)
            gen = 0
            if split and phase == 2:
                if count:  # compile time
                    count_arrive(bar)  # this block's h written
                else:
                    gen = grid_arrive(bar)  # this block's h written
            # the first units' loads, in flight across the barrier (they do not read h)
            c, sb, cur_a, cur_b = dn_first(cache, host, s_dwhere, s_dbase, u_first + grp,
                                           last_u, dn_n_sb, inv_n_sb, off_a, off_b, part)
            if phase == 2:
                if count:  # compile time
                    count_wait(bar, s_bar[0])
                elif split:
                    grid_wait(bar, gen)
                else:
                    grid_sync(bar)  # every block's h written (and block 0's weights, if routed)
            else:
                cuda.syncthreads()
            if has_td:
                stage_table(tab_dn, tab_d, n_td)
            stage_h(h, k * dn_n_sb * dn_values, hs, pa_a, pa_pa, pa_b, pa_pb, dn_sums,
                    dn_sums_off)
            if t < s_dn[0]:
                s_dwt[t] = weights[s_dkk[t]]
            cuda.syncthreads()
            while rb < n_row_blocks:  # the same in the whole block
                acc_a = F0
                acc_b = F0
                if n_units > 0:
                    acc_a, acc_b = dn_run(c, sb, cur_a, cur_b, n_units, u_first, u_stride, grp,
                                          cache, host, s_dwhere, s_dbase, s_dkk, s_dwt, dn_n_sb,
                                          inv_n_sb, off_a, off_b, part, hs, dn_sums_off, tab_d)
                dn_finish(acc_a, acc_b, s_part, log, sub, row0, n_embd, accumulate, out)
                rb += cuda.gridDim.x
                if rb < n_row_blocks:  # a grid smaller than the row blocks: the next one
                    row0, off_a, off_b = dn_rows(rb, log, n_embd, dn_row_bytes)
                    c, sb, cur_a, cur_b = dn_first(cache, host, s_dwhere, s_dbase,
                                                   u_first + grp, last_u, dn_n_sb, inv_n_sb,
                                                   off_a, off_b, part)
                    cuda.syncthreads()  # s_part's readers are done before the next writes
    return moe_fused_lanes


def _kernel(gu: LaneFormat, dn: LaneFormat):
    key = (gu.ggml_type, gu.x8, dn.ggml_type, BLOCKS_AN_SM, BARRIER) + (
        ("between",) if X_BETWEEN and gu.x8 else ())
    if key not in _CACHE:
        _CACHE[key] = _fused(gu, dn, BLOCKS_AN_SM, X_BETWEEN)
    return _CACHE[key]


def _resident(kern, args, shmem: int) -> tuple[int, object]:
    """(blocks of the kernel the current GPU holds at once, 0 for not one; the kernel compiled
    for args, marked for a cooperative launch)."""
    compiled = kern.compile(tuple(kern.typeof_pyval(a) for a in args))
    compiled.cooperative = True  # the driver refuses a grid it cannot hold at once
    key = (id(compiled), shmem)
    if key not in _RESIDENT:
        _RESIDENT[key] = compiled.max_cooperative_grid_blocks(LANE_THREADS, shmem)
    return _RESIDENT[key], compiled


def launch(x, ids, weights, *, k, n_items, where, miss_list, counters, layout, gu, dn, h1,
           logits, n_route, norm_topk, accumulate, out, sync, stream, rows) -> bool:
    """The fused launch of moe_decode's arguments (`where`: slot_table .. cpu_misses), or False
    (nothing launched) where the GPU cannot hold a block of it or its driver refused the
    cooperative launch (once; a warning says why, and the kernel is not tried again). rows: the
    simulator tests' cap on each phase's blocks (`moe._moe_decode`)."""
    n_embd, n_ff = layout.n_embd, layout.n_ff
    gu_n_sb, dn_n_sb = n_embd // gu.sb_values, n_ff // dn.sb_values
    log = lane_split(dn, n_embd, k * dn_n_sb)  # as if every expert were cached
    n_row_blocks = rows(n_blocks(n_embd, 2 * (LANE_WARPS >> log)))
    n_gu_blocks = rows(min(n_blocks(n_items, LANE_WARPS), MIN_LANE_BLOCKS * BLOCKS_AN_SM // 2))
    shmem = shared_bytes(gu, dn, n_embd, k, n_ff)
    kern = _kernel(gu, dn)
    args = (x, ids, weights, k, n_items, *where, miss_list, counters, layout.gate_row_bytes,
            gu_n_sb, n_ff, layout.up_off, gu.stage_len(n_embd), h1, device_table(gu), logits,
            n_route, bool(norm_topk), layout.down_off, layout.down_row_bytes, dn_n_sb,
            np.float32(1.0 / dn_n_sb), n_embd, bool(accumulate), padded_len(k * n_ff, dn.pad),
            log, n_row_blocks, out, device_table(dn), sync)
    grid = max(n_gu_blocks, n_row_blocks)
    if SIMULATED:
        for phase in (0, 1):
            kern[min(grid, SIM_RESIDENT), LANE_THREADS, stream, shmem](*args, phase)
        return True
    resident, compiled = _resident(kern, args + (2,), shmem)
    key = (id(compiled), shmem)
    if resident < 1 or key in _REFUSED:
        return False
    if isinstance(stream, int) and stream == 0:  # a launch past the dispatcher takes no 0
        stream = cuda.default_stream()
    try:
        compiled.launch(args + (2,), (min(grid, resident), 1, 1), (LANE_THREADS, 1, 1), stream,
                        shmem)
    except Exception as e:  # noqa: BLE001 - a driver without cooperative launches (some MPS
        # set-ups): a plain run comes before any graph capture, so the capture sees two launches
        _REFUSED[key] = f"{type(e).__name__}: {e}"
        warnings.warn(f"moe: the one-launch MoE kernel was refused ({_REFUSED[key]}); gate/up "
                      f"and down run as two launches", RuntimeWarning, stacklevel=3)
        return False
    return True


CHECKED = (("Q4_K", True, "Q6_K"), ("Q8_0", False, "Q8_0"))  # the 30B pair, the tiny model's


def register(family: str = "moe", *, rest: bool = False) -> None:
    """The fused kernels in the PTX registry: the CHECKED pairs (`moe` registers them, for the
    compile check), or with `rest` every other pair `fuses` allows (`compile_bundle`: the
    binary's kernel bundle holds both)."""
    from .moe import _GUL_SIG, _ROUTE_SIG, _tab_type  # the two launches' argument types

    ups = [g for g in list(LANE_FORMATS.values()) + list(X8_FORMATS.values())
           if not is_planar(g.ggml_type)]
    pairs = [(g, d) for g in ups for d in LANE_FORMATS.values()
             if fuses(g, d) and ((g.name, g.x8, d.name) in CHECKED) != rest
             and not is_planar(d.ggml_type)]
    down_sig = (types.int64, types.int64, types.int64, types.float32, types.int64,
                types.boolean, types.int64, types.int64, types.int64, types.float32[::1])
    for g, d in pairs:
        sig = ((types.float32[::1], types.int32[::1], types.float32[::1]) + _GUL_SIG[2:]
               + (_tab_type(g),) + _ROUTE_SIG[:3] + down_sig
               + (_tab_type(d), types.int32[::1], types.int64))
        # the kernel the engine makes (`_kernel`: X_BETWEEN), and for the checked 8-bit pair
        # the other form too, so both compile in CI
        register_ptx(family, f"moe_fused_lanes_{'x8_' if g.x8 else ''}{g.name}_{d.name}",
                     lambda g=g, d=d, sig=sig: (_fused(g, d, BLOCKS_AN_SM, X_BETWEEN).py_func,
                                                sig), options=_jit(BLOCKS_AN_SM))
        if g.x8 and not rest:
            register_ptx(family, f"moe_fused_lanes_{'plain' if X_BETWEEN else 'between'}_x8_"
                         f"{g.name}_{d.name}",
                         lambda g=g, d=d, sig=sig: (
                             _fused(g, d, BLOCKS_AN_SM, not X_BETWEEN).py_func, sig),
                         options=_jit(BLOCKS_AN_SM))
