"""Matrix-vector products directly on quantized rows: y = W x for one token (decode) and for a small
batch of 2..8 tokens, every supported format; x float32 or float16, y float32.

One token, formats with a lane decoding (`lanes`: Q4_K, Q5_K, Q6_K, Q8_0, IQ4_XS, IQ3_S): each
warp takes two rows; per step its lanes cover 32 // lanes consecutive super-blocks of both rows,
each lane loading its fixed slice with wide loads (the warp's loads cover whole contiguous
super-blocks) and dotting it with x staged once per block in shared memory (padded per format:
conflict-free). The loads of the next step are issued before the current one is computed (two
steps ahead in Q6_K's rounds on 8-bit x: ROUNDS_AHEAD), and the first step's before x is staged,
so each warp keeps several 16-byte loads per lane in flight.
Formats with an 8-bit decoding (`lanes_x8`: Q4_K) stage x quantized per 32 values, as the CPU
engine does, and dot it four values an instruction.

Other formats, batches, and rows longer than the staged x fits (`lanes_fit`): the generic
kernels of `matvec_generic`, one warp per row.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, types

from .intrinsics import SIMULATED, block_sum
from .lanes import LaneFormat, combine_split, lane_format, pair_step, row_pair_steps, split_log
from .lanes_x8 import grid_copies, lanes_for, rounds_decoding, stage_table_copies, stager
from .lane_rows import finish_pair, next_unit, pair_at, put_pair
from .lanes_between import between_steps
from .launch import (MAX_SHARED_BYTES, check_array, check_rows, device_sms, device_table, flat,
                     n_blocks)
from .matvec_f32 import float_format, matvec_float
from .matvec_generic import (MAX_TOKENS, THREADS, WARPS, batch_tile_groups, kernel_for,
                             stage_table)
from .qformats import BY_NAME, get_format
from .xstage import staged_bytes, sum_squares

F0 = np.float32(0.0)
F1 = np.float32(1.0)
LANE_WARPS = 8     # warps per block of the lane kernels, 2 rows each
LANE_THREADS = 32 * LANE_WARPS
PART_SLOTS = 2 * LANE_WARPS  # shared partial sums of the lane kernels: 2 per warp
# blocks a lane launch aims at when it splits row pairs between warps (`lane_split`), and the
# MoE's grids (`moe`, `moe_fused`): about two an SM of an H100 or H200 (132 SMs); the rounds'
# cap is the device's own (`lane_grid_blocks`)
MIN_LANE_BLOCKS = 256
# The most blocks a lane matvec launches: more row pairs than they hold go in rounds (the
# `rounds` kernel), so a 151,936-row head stages x 256 times instead of 9,496. On the H200 the
# head took as long at a cap of 256 as at 512, within 1% (`2026-12-01_kernels_matvec_rounds.json`).
# Smaller grids keep the kernel of a warp a pair, which takes fewer registers (Q6_K 80
# against 128, IQ4_XS 64 against 80). None: two blocks an SM of the device launched on
# (`lane_grid_blocks`), which the rounds kernels' registers hold at once. A fixed 256 left 14 of
# an H100's or H200's 132 SMs one block of the head's 250 (38 rounds; 36 at 264): on the H100,
# two runs each way, the IQ4_XS head 67.5-67.9 us against 70.9-71.0 and IQ3_S's 80.9-81.0
# against 85.0-85.1, the heads already near the read (Q4_K, Q6_K_P8, Q8_0 at 89-92% of one)
# and the other shapes unchanged (`2026-12-05_lane_grid_sms_h100.json`). On a card of 82 SMs
# 256 blocks would have been a wave and a half. Read at launch, so a benchmark can compare
# settings.
LANE_GRID_BLOCKS: int | None = None
# One-token lane matvecs dot 8-bit x (`lanes_x8`) in the formats that have it, as the CPU engine
# does. Read at launch, so a benchmark can compare both in one process.
LANE_X8 = True
# Formats whose 8-bit decoding pays only from this many weight bytes a launch (of that format):
# below it they dot float32 x. Q6_K on the H200, both ways in one run
# (`2026-12-03_kernels_matvec_q6k_x8.json`): 4096x4096 (13.8 MB) 8.97 against 10.07 us,
# 8192x8192 27.6 against 31.1, the 151,936-row head 107.4 against 121.2; but 2048->4096 and
# 4096->2048 (6.9 MB) 6.30 and 6.95 against 6.29 and 6.87, and the D1 step's q/k/v launch, whose
# Q6_K v (512 x 2048, 0.9 MB) then took 8-bit x too, 0.353 against 0.330 ms a step
# (`2026-12-03_engine_cuda_d1_v23_q6k_x8.json`). Not profiled; one difference at 2,048 columns:
# its four lanes a super-block take a row in one step, the float32 decoder's eight in two, which
# split a row pair between two warps.
# Planar Q6_K (`strata.quant.planar`, the engine's dense Q6_K) from 4 MiB: with its aligned loads
# the 30B's 6.9 MB shapes gain from 8-bit x, 2048->4096 5.89-5.90 against 6.11-6.15 us and
# 4096->2048 6.58-6.60 against 6.88-6.91, the others unchanged (H100, two runs alternating,
# `2026-12-05_q6k_planar_settings_h100.json`); v's 0.9 MB stays on float32 x, as measured above.
X8_MIN_BYTES = {int(BY_NAME["Q6_K"].ggml_type): 8 << 20,
                int(BY_NAME["Q6_K_P8"].ggml_type): 4 << 20}


def lane_grid_blocks() -> int:
    """LANE_GRID_BLOCKS, or where it is None two blocks an SM of the current device."""
    return 2 * device_sms() if LANE_GRID_BLOCKS is None else LANE_GRID_BLOCKS


def x8_pays(lf: LaneFormat, n_bytes: int) -> bool:
    """Whether a launch reading n_bytes of lf's weights dots 8-bit x where lf has that decoding
    (X8_MIN_BYTES; read at launch)."""
    return n_bytes >= X8_MIN_BYTES.get(lf.ggml_type, 0)


def launch_decoding(lf: LaneFormat, x8: bool | None, n_cols: int, mats) -> LaneFormat:
    """The decoding a lane launch of lf's matrices mats = ((w, y, n_rows), ...) of n_cols
    columns runs: 8-bit x where x8 (None: LANE_X8) holds, lf has that decoding and the
    matrices' bytes reach its floor (`x8_pays`); else float32 x."""
    n_bytes = lf.sb_bytes * (n_cols // lf.sb_values) * sum(m[2] for m in mats)
    return lanes_for(lf, (LANE_X8 if x8 is None else x8) and x8_pays(lf, n_bytes))


# (format, 8-bit x) whose rounds measured slower than a warp a pair on the H200: IQ4_XS's
# float32 rounds kernel takes 80 registers against 64 (three blocks an SM against four):
# 8192x8192 25.4 against 21.5 us, the 151,936-row head 105.4 against 103.4. Its 8-bit kernel
# gains from rounds: 19.1 against 20.1 us, the head 72.0 against 84.5
# (`2026-12-03_kernels_matvec_iq_x8.json`).
NO_ROUNDS = frozenset({("IQ4_XS", False)})


def has_rounds(lf: LaneFormat) -> bool:
    """Whether lf's lane matvec goes through row pairs in rounds where they exceed the grid."""
    return (lf.name, lf.x8) not in NO_ROUNDS


# Plain one-pair 8-bit lane matvecs of these formats ask for x between their first step's two
# rows (`lanes_between`), so x is staged and row a dotted while row b still streams, where a warp
# takes at most this many steps. On an H100, off and on twice in one process, the same bits
# (`2026-12-07_x_between_h100.json`), us (4096x4096 / 2048->4096 / 4096->2048): Q4_K 5.90 / 4.32
# / 4.66 against 6.97 / 4.77 / 5.46 (93 / 87 / 80% of a read of the bytes against 78 / 78 /
# 69%), Q6_K_P8 8.95 / 5.65 / 5.89 against 8.93 / 5.89 / 6.60, IQ4_XS 6.95 / 4.95 / 5.24
# against 7.43 / 5.24 / 5.93; IQ3_S 5.71 / 6.02 against 5.80 / 6.54 where its warps take one
# step, but 8.77 against 8.26 at 4096x4096 (two steps a warp). Q6_K in GGUF's layout was not
# timed. Read at launch.
X_BETWEEN: dict[str, int] = {"Q4_K": 1 << 30, "Q6_K_P8": 1 << 30, "IQ4_XS": 1 << 30,
                             "IQ3_S": 1}


def x_between(lf: LaneFormat, rounds: bool, normed: bool, warp_steps: int) -> bool:
    """Whether a launch of lf's kernel (rounds / normed; its warps taking warp_steps steps of a
    row pair) asks for x between the rows (X_BETWEEN; plain one-pair 8-bit kernels only)."""
    return (lf.x8 and not rounds and not normed
            and warp_steps <= X_BETWEEN.get(lf.name, 0))


# Formats whose lane kernels (matvec and MoE) take more than 128 registers unbounded (ptxas 13.0:
# Q4_K 132-159, IQ3_S 128-167), which leaves one 256-thread block per SM: their kernels are
# compiled for two blocks per SM (128 registers; no spills). The others take 56-121 and keep
# their extra blocks.
CAPPED_LANE_FORMATS = frozenset({"Q4_K", "IQ3_S"})


def lane_jit_options(lf: LaneFormat) -> dict:
    """Compile options of a format's lane kernels (also recorded in the PTX registry)."""
    return {"launch_bounds": (LANE_THREADS, 2)} if lf.name in CAPPED_LANE_FORMATS else {}


# (format, 8-bit x) whose rounds kernels (one-token lane matvecs only) also come compiled for
# this many blocks an SM (launch bounds: 80 registers), taken where the balanced rounds grid
# (`rounds_launch`) passes `lane_grid_blocks`. Why: Q6_K's head matvec on the H200 (96 registers
# unbounded: two blocks, 16 warps an SM) waits on its loads (ncu: long-scoreboard stalls first,
# issue slots 48% busy, DRAM 49%). At three blocks (the 8-bit kernels spill 28-146 bytes) the
# heads took Q6_K 97.3 us against 109.3, Q4_K 53.3-54.0 against 63.2-63.3 (capped at two blocks
# before: 128 registers), Q8_0 107.8-108.4 against 111.3-111.5 (72 registers: the grid had held
# it at two); three blocks on every shape was slower where it adds no warps (Q6_K 4096x4096 9.55
# against 8.95 us: the spill), and IQ4_XS at three lost everywhere (its head 77.2 against 72.2)
# (`2026-12-04_kernels_matvec_wide_rounds.json`). Q4_K on float32 x stays out: 292 bytes of
# spill at 80 registers.
# Q6_K on 8-bit x left this list for ROUNDS_AHEAD.
WIDE_ROUNDS: dict[tuple[str, bool], int] = {("Q6_K", False): 3, ("Q6_K_P8", False): 3,
                                            ("Q4_K", True): 3, ("Q8_0", False): 3}
# (format, 8-bit x) whose rounds kernels issue each unit's loads two units (steps) before its
# dots instead of one, at two blocks an SM (launch bounds: 128 registers; unbounded 139). On the
# H100 (2026-12-05, one process each way, `2026-12-05_rounds_ahead_h100.json`): Q6_K 8192x8192
# 28.24 against 31.21 us, the head 98.4 against 108.5 (its wide kernel at three blocks), 2048 ->
# 4096 6.27 against 6.66; Q4_K 1-2% faster (not taken); IQ4_XS and IQ3_S 4-11% slower. ncu
# there: every rounds kernel's warps wait on their loads (long scoreboard, 59-62% of the cycles
# between two instructions for Q6_K and Q4_K at 8192x8192).
# Planar Q6_K two ahead too: its head 91.2-91.3 us against 91.9 one ahead, 8192x8192 25.8 against
# 25.4 (H100, `2026-12-05_q6k_planar_settings_h100.json`); the head is the engine's.
ROUNDS_AHEAD: dict[tuple[str, bool], int] = {("Q6_K", True): 2, ("Q6_K_P8", True): 2}


def rounds_ahead(lf: LaneFormat, rounds: bool = True, min_blocks: int = 0) -> int:
    """Units lf's rounds kernel loads ahead of its dots (read when a kernel is made): 1 for the
    one-pair and the wide kernels."""
    return ROUNDS_AHEAD.get((lf.name, lf.x8), 1) if rounds and not min_blocks else 1


def matvec_jit_options(lf: LaneFormat, min_blocks: int = 0, ahead: int = 1,
                       between: bool = False) -> dict:
    """Compile options of a format's one-token lane matvec kernels (min_blocks: a wide rounds
    kernel's blocks an SM; ahead: a rounds kernel's units of loads ahead; between: x asked for
    between the rows, whose held loads took Q6_K to 130 registers unbounded)."""
    if min_blocks or ahead > 1 or between:
        return {"launch_bounds": (LANE_THREADS, min_blocks or 2)}
    return lane_jit_options(lf)


def rounds_launch(lf: LaneFormat, grid: int) -> tuple[int, int]:
    """(blocks, min_blocks) of a rounds launch for `grid` blocks of row pairs: the fewest blocks
    that take as few rounds as the widest grid lf's kernels allow (`lane_grid_blocks`, or
    WIDE_ROUNDS' blocks an SM: 1.5 times it at three), so no warp takes a round more than
    another; min_blocks: the wide kernel's blocks an SM where they pass `lane_grid_blocks`,
    else 0 (read at launch)."""
    wide = WIDE_ROUNDS.get((lf.name, lf.x8), 0)
    two = lane_grid_blocks()
    cap = two * max(wide, 2) // 2
    n_rounds = -(-grid // cap)
    blocks = -(-grid // n_rounds)
    return blocks, (wide if blocks > two else 0)


def lane_jit(lf: LaneFormat) -> dict:
    """The options `cuda.jit` takes for a lane kernel (none in the simulator)."""
    return {} if SIMULATED else lane_jit_options(lf)


# the lane kernels, by (format, -1 normed | 0, x8[, "rounds", min_blocks, ahead])
_CACHE: dict[tuple, object] = {}


def lane_body(lf: LaneFormat, normed: bool = False, rounds: bool = False, ahead: int = 1,
              copies: int = 1, x_between: bool = False):
    """The lane matvec of one block as a device function (`_lanes_single`'s kernel; the mixed
    kernel of `matvec_mixed` runs one per format; ahead: see ROUNDS_AHEAD):
      body(blk, n_blk, xn_blk, <the kernel's arguments>, tab_s, s_part, xs)
    blk of n_blk blocks taking this row space; xn_blk: the one of them that writes the normed
    vector to xn where xn is not empty (-1: none); tab_s, s_part, xs: the block's shared arrays
    (the format's table, `copies` times over (`lanes_x8.GRID_COPIES`: rounds only), the partial
    sums, the staged x of lf's `xs_type`). x_between: a plain one-pair 8-bit kernel asking for x
    between a step's rows (`lanes_between`; X_BETWEEN)."""
    if copies > 1 and not rounds:
        raise ValueError("a table in copies is for the rounds kernels")
    if x_between and (rounds or normed or not lf.x8):
        raise ValueError("x between the rows is for plain one-pair 8-bit kernels")
    between = between_steps(lf, LANE_THREADS) if x_between else None
    if rounds:
        lf = rounds_decoding(lf, copies)
    load_pair, dot_pair = pair_step(lf)
    _, run = row_pair_steps(lf)
    n_values, per_step = lf.sb_values, lf.sbs_per_step
    stage, stage_normed = stager(lf)
    n_tab, has_tab = lf.table.size, lf.has_table
    if ahead not in (1, 2):
        raise ValueError(f"a rounds kernel's loads run 1 or 2 units ahead, not {ahead}")

    @cuda.jit(device=True, inline="always")
    def body(blk, n_blk, xn_blk, w, w2, w3, row_bytes, n_sb, n_rows, n_first, b3, n1, n3,
             sums_off, log, x, nw, eps, xn, y, y2, y3, accumulate, tab, tab_s, s_part, xs):
        warp = cuda.threadIdx.x >> 5
        sub = warp & ((1 << log) - 1)
        per_block = LANE_WARPS >> log
        s_first = sub * per_step
        s_stride = per_step << log
        pair = blk * per_block + (warp >> log)
        m, row0, n_here = pair_at(2 * pair, n_rows, n_first, b3, n1, n3, normed)
        off_a = min(row0, n_here - 1) * row_bytes
        off_b = min(row0 + 1, n_here - 1) * row_bytes
        if x_between:  # compile time: loads, table and x staged by `lanes_between`
            acc_a, acc_b = between(w3 if m == 2 else (w2 if m == 1 else w), off_a, off_b, n_sb,
                                   x, xs, sums_off, tab, tab_s, s_first, s_stride)
            acc_a, acc_b = combine_split(acc_a, acc_b, s_part, log)
            if (cuda.threadIdx.x & 31) == 0 and sub == 0:
                put_pair(y3 if m == 2 else (y2 if m == 1 else y), row0, n_here, acc_a, acc_b,
                         accumulate)
            return
        cur = load_pair(w3 if m == 2 else (w2 if m == 1 else w), off_a, off_b, n_sb,
                        s_first)  # in flight while x is staged
        if has_tab:
            if copies > 1:  # compile time
                stage_table_copies(tab, tab_s, n_tab, copies)
            else:
                stage_table(tab, tab_s, n_tab)
        n_vals = n_sb * n_values
        if normed:
            total = block_sum(sum_squares(x, n_vals), s_part)  # fixed order: every block alike
            scale = F1 / math.sqrt(total / np.float32(n_vals) + eps)
            stage_normed(x, nw, scale, n_vals, xs, sums_off, xn,
                         blk == xn_blk and xn.shape[0] > 0)
        else:
            stage(x, n_vals, xs, sums_off)
        cuda.syncthreads()
        if not rounds:
            acc_a, acc_b = run(w3 if m == 2 else (w2 if m == 1 else w), off_a, off_b, n_sb, cur,
                               xs, sums_off, tab_s, s_first, s_stride)
            acc_a, acc_b = combine_split(acc_a, acc_b, s_part, log)
            if (cuda.threadIdx.x & 31) == 0 and sub == 0:
                put_pair(y3 if m == 2 else (y2 if m == 1 else y), row0, n_here, acc_a, acc_b,
                          accumulate)
            return
        n_pairs = ((b3 + n3 if n3 > 0 else n_rows) + 1) // 2
        stride = n_blk * per_block  # pairs a round of the blocks takes
        # units (steps) of a pair: the same for every warp of a block, one unit past the row
        # for some where the steps do not split evenly (dotted as zero)
        spp = (((n_sb + per_step - 1) // per_step) + (1 << log) - 1) >> log
        r_first = blk * per_block
        n_units = ((n_pairs - r_first + stride - 1) // stride) * spp
        if ahead == 2:  # compile time
            # loads two units ahead: a load cursor (lp, lj: pair and unit; lm, la, lb: where
            # it reads) runs two units before the dot's (pair, j)
            lp, lj, lm, la, lb = next_unit(pair, 0, m, off_a, off_b, spp, stride, n_pairs,
                                           row_bytes, n_rows, n_first, b3, n1, n3, normed)
            nxt = load_pair(w3 if lm == 2 else (w2 if lm == 1 else w), la, lb, n_sb,
                            s_first + lj * s_stride)
            acc_a = F0
            acc_b = F0
            j = 0
            for _ in range(n_units):
                lp, lj, lm, la, lb = next_unit(lp, lj, lm, la, lb, spp, stride, n_pairs,
                                               row_bytes, n_rows, n_first, b3, n1, n3, normed)
                nxt2 = load_pair(w3 if lm == 2 else (w2 if lm == 1 else w), la, lb, n_sb,
                                 s_first + lj * s_stride)
                da, db = dot_pair(cur, n_sb, s_first + j * s_stride, xs, sums_off, tab_s)
                acc_a += da
                acc_b += db
                j += 1
                if j == spp:  # the same in the whole block
                    finish_pair(acc_a, acc_b, s_part, log, sub, y, y2, y3, m, row0, n_here,
                                accumulate)
                    acc_a = F0
                    acc_b = F0
                    j = 0
                    pair += stride
                    m, row0, n_here = pair_at(2 * pair, n_rows, n_first, b3, n1, n3, normed)
                cur = nxt
                nxt = nxt2
            return
        # (m_ld, off_a, off_b): where the warp loads, its last real pair's rows once it is past
        # n_pairs (a load of a row past the end would cost every warp an L2 round trip);
        # (m, row0, n_here): where it writes, past the rows then (nothing written)
        m_ld = m
        acc_a = F0
        acc_b = F0
        j = 0
        for _ in range(n_units):
            s0 = s_first + j * s_stride
            last = j + 1 == spp  # the pair's last unit: the same in the whole block
            m_ld1, off_a1, off_b1, s1 = m_ld, off_a, off_b, s0 + s_stride
            if last:
                s1 = s_first
                m1, row1, n_here1 = pair_at(2 * (pair + stride), n_rows, n_first, b3, n1, n3,
                                            normed)
                if pair + stride < n_pairs:  # else this pair's first step again (cached)
                    m_ld1 = m1
                    off_a1 = min(row1, n_here1 - 1) * row_bytes
                    off_b1 = min(row1 + 1, n_here1 - 1) * row_bytes
            nxt = load_pair(w3 if m_ld1 == 2 else (w2 if m_ld1 == 1 else w), off_a1, off_b1,
                            n_sb, s1)
            da, db = dot_pair(cur, n_sb, s0, xs, sums_off, tab_s)
            acc_a += da
            acc_b += db
            j += 1
            if last:
                finish_pair(acc_a, acc_b, s_part, log, sub, y, y2, y3, m, row0, n_here,
                            accumulate)
                acc_a = F0
                acc_b = F0
                j = 0
                pair += stride
                m, row0, n_here = m1, row1, n_here1
                m_ld, off_a, off_b = m_ld1, off_a1, off_b1
            cur = nxt
    return body


def _lanes_single(lf: LaneFormat, normed: bool = False, rounds: bool = False,
                  min_blocks: int = 0, copies: int = 1, between: bool = False):
    ahead = rounds_ahead(lf, rounds, min_blocks)
    body = lane_body(lf, normed, rounds, ahead, copies, between)
    xs_type = lf.xs_type
    n_tab, tab_type = lf.table.size * copies, lf.table.dtype.type

    def matvec_lanes(w, w2, w3, row_bytes, n_sb, n_rows, n_first, b3, n1, n3, sums_off, log, x,
                     nw, eps, xn, y, y2, y3, accumulate, tab):
        # Up to three matrices of the same format and columns, one after the other in row
        # space: W's n1 rows (w -> y) from row 0, W2's (w2 -> y2, from its row 0) from n_first
        # to n_rows, W3's n3 rows from b3 (n_first, b3 even: a row pair never straddles two;
        # n_first = n_rows without W2, n3 = 0 without W3). Plain kernels take n1 = n_first
        # and no W3 (fewer registers). w*: rows of row_bytes, each of n_sb super-blocks; x:
        # [n_sb * sb_values] f32|f16; y* f32 (= or += W x); two rows per 1 << log warps
        # (interleaved steps). `rounds` (compile time): a grid smaller than the row pairs
        # takes them in rounds, x staged once per block, a warp's steps of all its pairs one
        # stream of units, the next unit's loads (the next step, or the next pair's first)
        # issued before the current one is dotted; without, a warp a pair (fewer registers:
        # more blocks an SM for some formats). Dynamic shared: x as lf stages it
        # (`lanes_x8.stager`), its sums or scales from sums_off. `normed` (compile time): x is
        # the raw f32 residual and the staged vector is rmsnorm(x) * nw (every block computes
        # the same scale); block 0 writes it to xn where xn is not empty.
        tab_s = cuda.shared.array(n_tab, tab_type)
        s_part = cuda.shared.array(PART_SLOTS, types.float32)
        xs = cuda.shared.array(0, xs_type)
        body(cuda.blockIdx.x, cuda.gridDim.x, 0, w, w2, w3, row_bytes, n_sb, n_rows, n_first,
             b3, n1, n3, sums_off, log, x, nw, eps, xn, y, y2, y3, accumulate, tab, tab_s, s_part,
             xs)
    if min_blocks:  # its own name: the binary's kernel key (name and code) sees no launch bounds
        matvec_lanes.__name__ += f"_wide{min_blocks}"
        matvec_lanes.__qualname__ += f"_wide{min_blocks}"
    if copies > 1:
        matvec_lanes.__name__ += f"_copies{copies}"
        matvec_lanes.__qualname__ += f"_copies{copies}"
    if between:
        matvec_lanes.__name__ += "_between"
        matvec_lanes.__qualname__ += "_between"
    return cuda.jit(**({} if SIMULATED else matvec_jit_options(lf, min_blocks, ahead,
                                                               between)))(matvec_lanes)


def lanes_fit(lf: LaneFormat, n_vals: int) -> bool:
    """Whether n_vals staged values (padded, with their sums) and the format's table fit the
    shared memory of one block of the lane kernels."""
    return lf.stage_bytes(n_vals) + lf.table.nbytes <= MAX_SHARED_BYTES


def _lanes_kernel(lf: LaneFormat, normed: bool = False, rounds: bool = False,
                  min_blocks: int = 0, copies: int = 1, between: bool = False):
    key = (lf.ggml_type, -1 if normed else 0, lf.x8) + (
        ("rounds", min_blocks, rounds_ahead(lf, rounds, min_blocks), copies) if rounds else
        (("between",) if between else ()))
    k = _CACHE.get(key)
    if k is None:
        k = _CACHE[key] = _lanes_single(lf, normed, rounds, min_blocks, copies, between)
    return k


def lane_split(lf: LaneFormat, n_rows: int, n_sb: int) -> int:
    """log2 of the warps sharing a row pair of the lane kernels for n_rows rows of n_sb
    super-blocks (see `lanes.split_log`)."""
    n_steps = -(-n_sb // lf.sbs_per_step)
    return split_log(-(-n_rows // 2), n_steps, warps=LANE_WARPS, min_blocks=MIN_LANE_BLOCKS)


def launch_lane_matvec(lf, x, mats, n_cols: int, row_bytes: int, stream, *,
                       accumulate: bool = False, norm=None, x8: bool | None = None) -> None:
    """One lane launch over 1..3 matrices of format lf and n_cols columns, mats = ((w, y,
    n_rows), ...) with n_rows >= 1: y = W x (`accumulate`: +=). norm = (norm_w, eps, xn):
    x is the raw f32 residual and the kernel stages rmsnorm(x) * norm_w instead (xn: where
    block 0 writes that vector, or an empty array). x8 (default LANE_X8): dot 8-bit x where
    the format has that decoding (`lanes_x8`) and the matrices hold enough bytes (`x8_pays`)."""
    lf = launch_decoding(lf, x8, n_cols, mats)
    n_sb = n_cols // lf.sb_values
    x = flat(x)
    w, y, n1 = mats[0]
    y = flat(y)
    # absent matrices: empty outputs (never written; a second view of y would be copied back
    # over y where numba transfers host arrays)
    (w2, y2, n2), (w3, y3, n3) = (list(mats[1:]) + [(w, y[:0], 0)] * 2)[:2]
    n_first = n1 + (n1 & 1) if n2 else n1
    b3 = n_first + n2 + (n2 & 1)
    n_pairs = (n_first + n2 + 1) // 2 + (n3 + 1) // 2
    if norm is None and (n3 or n1 != n_first):
        raise ValueError("plain lane launches take two matrices, the first of even rows")
    log = lane_split(lf, 2 * n_pairs, n_sb)
    nw, eps, xn = (y[:0], 0.0, y[:0]) if norm is None else norm
    smem = lf.stage_bytes(n_cols)
    grid = n_blocks(n_pairs, LANE_WARPS >> log)
    rounds = grid > lane_grid_blocks() and has_rounds(lf)
    min_blocks, copies = 0, 1
    if rounds:  # the block's shared memory: x, the table (copies of it), the partial sums
        grid, min_blocks = rounds_launch(lf, grid)
        copies = grid_copies(lf, n_cols, MAX_SHARED_BYTES - 4 * PART_SLOTS)
    n_steps = -(-n_sb // lf.sbs_per_step)
    warp_steps = (n_steps + (1 << log) - 1) >> log  # a row pair's steps a warp takes
    kern = _lanes_kernel(lf, norm is not None, rounds, min_blocks, copies,
                         x_between(lf, rounds, norm is not None, warp_steps))
    kern[grid, LANE_THREADS, stream, smem](
        flat(w), flat(w2), flat(w3), row_bytes, n_sb, n_first + n2, n_first, b3, n1, n3,
        lf.stage_len(n_cols), log, x, nw, np.float32(eps), xn, y, flat(y2), flat(y3),
        bool(accumulate), device_table(lf))


def matvec(w, ggml_type, x, y, *, accumulate: bool = False, x8: bool | None = None,
           stream=0) -> None:
    """y = W x on quantized rows (`accumulate`: y += W x, one token only, e.g. a projection added
    into the residual without a separate add). `w`: uint8, C-contiguous, 1-D or [n_rows,
    row_bytes], starting 16-byte aligned; `x`: [n_cols] or [n_tok, n_cols] float32/float16
    (n_tok <= 8); `y`: [n_rows] or [n_tok, n_rows] float32. n_cols must be a multiple of the
    format's block size. F32 and F16 weights with float32 x go to `matvec_f32.matvec_float`
    (a block per row; n_cols a multiple of 4 or 8; batch-invariant). One token of a lane format
    with an 8-bit decoding dots 8-bit x (`lanes_x8`) where x8 (default LANE_X8) holds: the
    batched kernels dot float32 x, so a row of a batch run alone passes False."""
    fmt = get_format(ggml_type)
    check_array("x", x, (np.float32, np.float16))
    if len(x.shape) not in (1, 2):
        raise ValueError(f"x: shape {tuple(x.shape)}, expected [n_cols] or [n_tok, n_cols]")
    n_tok = 1 if len(x.shape) == 1 else x.shape[0]
    n_cols = tuple(x.shape)[-1]
    if not 1 <= n_tok <= MAX_TOKENS:
        raise ValueError(f"x: {n_tok} tokens, matvec takes 1..{MAX_TOKENS}")
    if accumulate and len(x.shape) != 1:
        raise ValueError(f"accumulate takes one token (x [n_cols]), got x {tuple(x.shape)}")
    if np.dtype(x.dtype) == np.float32 and float_format(fmt.ggml_type) is not None:
        matvec_float(w, fmt.ggml_type, x, y, accumulate=accumulate, stream=stream)
        return
    row_bytes = fmt.row_bytes(n_cols)
    check_array("y", y, np.float32)
    if len(y.shape) != len(x.shape) or (n_tok > 1 and y.shape[0] != n_tok):
        raise ValueError(f"y: shape {tuple(y.shape)} does not match x {tuple(x.shape)}")
    n_rows = tuple(y.shape)[-1]
    check_rows(w, fmt.name, n_rows, n_cols, row_bytes)
    if n_rows == 0:
        return
    lf = lane_format(fmt.ggml_type)
    if n_tok == 1 and lf is not None and lanes_fit(lf, n_cols):
        launch_lane_matvec(lf, x, ((w, y, n_rows),), n_cols, row_bytes, stream,
                           accumulate=accumulate, x8=x8)
        return
    n_groups = n_cols // 32
    tile = batch_tile_groups(n_tok)
    smem = staged_bytes(min(n_groups, tile) if n_tok == 1 else n_tok * tile)
    extra = (bool(accumulate),) if n_tok == 1 else ()  # the batch kernels overwrite y
    kernel_for(fmt.ggml_type, n_tok)[n_blocks(n_rows, WARPS), THREADS, stream, smem](
        flat(w), row_bytes, n_groups, n_rows, flat(x), flat(y), *extra, device_table(fmt))


def matvec_pair(w, ggml_type, w2, ggml_type2, x, y, y2, *, stream=0) -> None:
    """y = W x and y2 = W2 x for one token (x [n_cols]; y [n_rows], y2 [n_rows2] float32): one
    launch where both have the same lane format and y has an even length (e.g. a layer's k and
    v projections), else two `matvec` launches."""
    check_array("x", x, (np.float32, np.float16), (None,))
    check_array("y", y, np.float32, (None,))
    check_array("y2", y2, np.float32, (None,))
    fmt, fmt2 = get_format(ggml_type), get_format(ggml_type2)
    n_cols, n_rows, n2 = x.shape[0], y.shape[0], y2.shape[0]
    lf = lane_format(fmt.ggml_type)
    if (fmt.ggml_type != fmt2.ggml_type or lf is None or not lanes_fit(lf, n_cols)
            or n_rows % 2 or n_rows == 0 or n2 == 0):
        matvec(w, ggml_type, x, y, stream=stream)
        matvec(w2, ggml_type2, x, y2, stream=stream)
        return
    row_bytes = fmt.row_bytes(n_cols)
    for name, a, n in (("w", w, n_rows), ("w2", w2, n2)):
        check_rows(a, fmt.name, n, n_cols, row_bytes, name)
    launch_lane_matvec(lf, x, ((w, y, n_rows), (w2, y2, n2)), n_cols, row_bytes, stream)
