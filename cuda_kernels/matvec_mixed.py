"""RMSNorm fused into one lane-matvec launch over matrices of two formats: y_i = W_i (rmsnorm(x) *
norm_w) for a Q4_K_M layer's q and k (Q4_K) and v (Q6_K), as `matvec_normed` does for one format.

llama.cpp's Q4_K_M recipe stores attn_v as Q6_K in half the layers (`use_more_bits`): launched per
format, those layers pay a second launch, a few microseconds of latency each. Here the grid is
split by blocks: blocks [0, blocks_a) run format A's matrices, the others format B's, each block
running exactly its format's single-format normed kernel (`matvec.lane_body`): its staging of x
(8-bit where `lanes_x8` has the format and `matvec.x8_pays`, as for Q4_K; padded float32 for
Q5_K, and for a Q6_K v of under 8 MiB; a block stages only its own),
its row-pair split, its rounds. So every output has the bits of the per-format launches: the
norm's scale is the same fixed-order block reduction in every block, and no dot changes. A
block-uniform choice keeps the warps of a block in step at the staging barrier and costs no
extra shared memory (the larger of the two stagings); the kernel's registers are those of the
larger format's path.

Pairs with kernels (`MIXED_PAIRS`) are the K_M recipes' splits; anything else launches per format
(`matvec_normed.normed_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, from_dtype, types

from strata.quant.planar import Q6_K_P8

from . import matvec as mv
from .intrinsics import SIMULATED
from .lanes import LaneFormat, lane_format
from .lanes_x8 import lanes_for
from .launch import device_table, flat, n_blocks, register_ptx
from .matvec import (LANE_THREADS, LANE_WARPS, PART_SLOTS, has_rounds, lane_body,
                     lane_jit_options, lane_split, lanes_fit)

# (format A, format B) of the mixed kernels: Q4_K_M's and Q5_K_M's q, k | v (Q6_K; in the engine
# its planar layout, `strata.quant.planar`). The launcher
# takes table-free formats with a rounds kernel only (K-quants, Q8_0), each pair registered for
# the compile check and the AOT bundle.
MIXED_PAIRS = frozenset({(int(T.Q4_K), int(T.Q6_K)), (int(T.Q5_K), int(T.Q6_K)),
                         (int(T.Q4_K), Q6_K_P8.ggml_type), (int(T.Q5_K), Q6_K_P8.ggml_type)})
MAX_PART_MATRICES = 2  # per format: the row space of `lane_body` without its third matrix

_CACHE: dict[tuple, object] = {}


def mixed_pair(type_a: int, type_b: int) -> tuple[int, int] | None:
    """(A, B): the order the mixed kernel takes two GGML types in, or None without a kernel."""
    for pair in ((int(type_a), int(type_b)), (int(type_b), int(type_a))):
        if pair in MIXED_PAIRS:
            return pair
    return None


def mixed_jit_options(lf_a: LaneFormat, lf_b: LaneFormat) -> dict:
    """The looser of the two formats' launch bounds (a path held to a tighter bound than its own
    kernel's could spill): Q4_K's two blocks an SM for the Q4_K/Q6_K kernel (127-128 registers,
    no spills; Q6_K's own normed kernels on 8-bit x take 95 and 126)."""
    mins = [o["launch_bounds"][1] for o in (lane_jit_options(lf_a), lane_jit_options(lf_b)) if o]
    return {"launch_bounds": (LANE_THREADS, min(mins))} if mins else {}


def _mixed_kernel_fn(lf_a: LaneFormat, lf_b: LaneFormat, rounds: bool):
    body_a, body_b = lane_body(lf_a, True, rounds), lane_body(lf_b, True, rounds)
    xs_a_type, xs_b_type = lf_a.xs_type, lf_b.xs_type
    n_tab_a, tab_a_type = lf_a.table.size, lf_a.table.dtype.type
    n_tab_b, tab_b_type = lf_b.table.size, lf_b.table.dtype.type
    opts = {} if SIMULATED else mixed_jit_options(lf_a, lf_b)

    @cuda.jit(**opts)
    def matvec_lanes_mixed(wa, wa2, wb, wb2, row_bytes_a, row_bytes_b, n_sb_a, n_sb_b, n_rows_a,
                           n_first_a, n1_a, n_rows_b, n_first_b, n1_b, sums_off_a, sums_off_b,
                           log_a, log_b, blocks_a, x, nw, eps, xn, ya, ya2, yb, yb2, tab_a,
                           tab_b):
        # Format A's one or two matrices (wa -> ya: n1_a rows from row 0; wa2 -> ya2 from the
        # even n_first_a to n_rows_a; n_first_a = n_rows_a without a second) in blocks
        # [0, blocks_a), format B's likewise (wb, wb2 -> yb, yb2) in the others, each as
        # `matvec._lanes_single`'s normed kernel with that format's arguments (x: the raw f32
        # residual [n_cols]; nw [n_cols] f32; block 0 writes the normed vector to xn where xn
        # is not empty). Dynamic shared: the larger of the two stagings (each block its own).
        s_part = cuda.shared.array(PART_SLOTS, types.float32)
        tab_sa = cuda.shared.array(n_tab_a, tab_a_type)
        tab_sb = cuda.shared.array(n_tab_b, tab_b_type)
        xs_a = cuda.shared.array(0, xs_a_type)
        xs_b = cuda.shared.array(0, xs_b_type)
        blk = cuda.blockIdx.x
        if blk < blocks_a:
            body_a(blk, blocks_a, 0, wa, wa2, wa2, row_bytes_a, n_sb_a, n_rows_a, n_first_a,
                   n_rows_a, n1_a, 0, sums_off_a, log_a, x, nw, eps, xn, ya, ya2, ya2, False,
                   tab_a, tab_sa, s_part, xs_a)
        else:  # block 0 is format A's: these never write xn
            body_b(blk - blocks_a, cuda.gridDim.x - blocks_a, -1, wb, wb2, wb2, row_bytes_b,
                   n_sb_b, n_rows_b, n_first_b, n_rows_b, n1_b, 0, sums_off_b, log_b, x, nw,
                   eps, xn, yb, yb2, yb2, False, tab_b, tab_sb, s_part, xs_b)
    return matvec_lanes_mixed


def _mixed_kernel(lf_a: LaneFormat, lf_b: LaneFormat, rounds: bool):
    key = (lf_a.ggml_type, lf_a.x8, lf_b.ggml_type, lf_b.x8, rounds)
    k = _CACHE.get(key)
    if k is None:
        k = _CACHE[key] = _mixed_kernel_fn(lf_a, lf_b, rounds)
    return k


def _part(lf: LaneFormat, mats: Sequence[tuple], n_cols: int) -> dict:
    """One format's row space: its 1..2 matrices ((w, y, n_rows), ...) as `lane_body` takes
    them, the warps a row pair (log) and the blocks a warp a pair would take."""
    n_sb = n_cols // lf.sb_values
    w, y, n1 = mats[0]
    y = flat(y)
    # no second matrix: an empty output (never written; a second view of y would be copied
    # back over y where numba transfers host arrays)
    w2, y2, n2 = mats[1] if len(mats) > 1 else (w, y[:0], 0)
    n_first = n1 + (n1 & 1) if n2 else n1
    n_pairs = (n_first + n2 + 1) // 2
    log = lane_split(lf, 2 * n_pairs, n_sb)
    return dict(lf=lf, n_sb=n_sb, w=(flat(w), flat(w2)), y=(y, flat(y2)), n1=n1,
                n_first=n_first, n_rows=n_first + n2, log=log,
                grid=n_blocks(n_pairs, LANE_WARPS >> log))


def split_blocks(grid_a: int, grid_b: int, cap: int) -> tuple[int, int, bool]:
    """(blocks of A, blocks of B, rounds): each part a warp a row pair where the whole grid fits
    `cap` blocks, else the cap shared in proportion to the parts' grids (each >= 1 block, never
    more than its pairs need), their pairs taken in rounds."""
    if grid_a + grid_b <= cap:
        return grid_a, grid_b, False
    cap = max(cap, 2)
    a = min(grid_a, max(1, min(cap - 1, round(cap * grid_a / (grid_a + grid_b)))))
    return a, min(grid_b, cap - a), True


def launch_mixed_normed(lf_a: LaneFormat, lf_b: LaneFormat, x, mats_a: Sequence[tuple],
                        mats_b: Sequence[tuple], n_cols: int, stream, *, norm,
                        x8: bool | None = None) -> None:
    """One launch of y = W (rmsnorm(x) * norm_w) over format A's 1..2 matrices and format B's
    1..2 (3 at most; mats = ((w, y, n_rows), ...), n_rows >= 1, w checked by the caller),
    norm = (norm_w, eps, xn) as `matvec.launch_lane_matvec` takes it, x8 (default
    `matvec.LANE_X8`): each format dots 8-bit x where it has that decoding and its matrices hold
    enough bytes (`matvec.x8_pays`), as its own launch would. Refuses (ValueError)
    a pair without a mixed kernel (`MIXED_PAIRS`, in either order) or shapes it cannot take."""
    pair = mixed_pair(lf_a.ggml_type, lf_b.ggml_type)
    if pair is None or lf_a.ggml_type == lf_b.ggml_type:
        pairs = sorted((lane_format(a).name, lane_format(b).name) for a, b in MIXED_PAIRS)
        raise ValueError(f"no mixed lane kernel for {lf_a.name} + {lf_b.name} (pairs: {pairs}):"
                         f" launch each format apart")
    if pair[0] != lf_a.ggml_type:
        lf_a, lf_b, mats_a, mats_b = lf_b, lf_a, mats_b, mats_a
    counts = (len(mats_a), len(mats_b))
    if min(counts) < 1 or max(counts) > MAX_PART_MATRICES or sum(counts) > 3:
        raise ValueError(f"mats: {counts[0]} {lf_a.name} and {counts[1]} {lf_b.name} "
                         f"matrices, the mixed kernel takes 1..2 of each, 3 in all")
    for lf in (lf_a, lf_b):
        if n_cols <= 0 or n_cols % lf.sb_values or not lanes_fit(lf, n_cols):
            raise ValueError(f"x: {n_cols} columns do not make whole, stageable {lf.name} rows")
    if any(not has_rounds(lf) or lf.has_table for lf in (lf_a, lf_b)):
        raise ValueError(f"{lf_a.name} + {lf_b.name}: the mixed kernel takes table-free formats "
                         f"with rounds only")
    # each format's decoding as its own launch would pick it
    a = _part(mv.launch_decoding(lf_a, x8, n_cols, mats_a), mats_a, n_cols)
    b = _part(mv.launch_decoding(lf_b, x8, n_cols, mats_b), mats_b, n_cols)
    blocks_a, blocks_b, rounds = split_blocks(a["grid"], b["grid"], mv.lane_grid_blocks())
    nw, eps, xn = norm
    la, lb = a["lf"], b["lf"]
    smem = max(la.stage_bytes(n_cols), lb.stage_bytes(n_cols))
    _mixed_kernel(la, lb, rounds)[blocks_a + blocks_b, LANE_THREADS, stream, smem](
        *a["w"], *b["w"], la.sb_bytes * a["n_sb"], lb.sb_bytes * b["n_sb"], a["n_sb"], b["n_sb"],
        a["n_rows"], a["n_first"], a["n1"], b["n_rows"], b["n_first"], b["n1"],
        la.stage_len(n_cols), lb.stage_len(n_cols), a["log"], b["log"], blocks_a, flat(x), nw,
        np.float32(eps), xn, *a["y"], *b["y"], device_table(la), device_table(lb))


def _ptx_mixed(lf_a: LaneFormat, lf_b: LaneFormat, rounds: bool):
    def build():
        u8, i64, f32 = types.uint8[::1], types.int64, types.float32[::1]
        tabs = tuple(types.Array(from_dtype(lf.table.dtype), 1, "C") for lf in (lf_a, lf_b))
        return _mixed_kernel_fn(lf_a, lf_b, rounds).py_func, (
            (u8,) * 4 + (i64,) * 15 + (f32, f32, types.float32) + (f32,) * 5 + tabs)
    return build


def _register() -> None:
    for ta, tb in sorted(MIXED_PAIRS):
        # by (A 8-bit, B 8-bit), the decodings a launch can pick: none with LANE_X8 off, each
        # format's 8-bit one with it, or float32 x for a format under its `X8_MIN_BYTES`
        variants = {}
        for x8 in (False, True):
            for pays_a in (True, False) if ta in mv.X8_MIN_BYTES else (True,):
                for pays_b in (True, False) if tb in mv.X8_MIN_BYTES else (True,):
                    la = lanes_for(lane_format(ta), x8 and pays_a)
                    lb = lanes_for(lane_format(tb), x8 and pays_b)
                    variants[(la.x8, lb.x8)] = (la, lb)
        for la, lb in variants.values():
            for rounds, tag in ((False, ""), (True, "_rounds")):
                x8a, x8b = ("x8_" if la.x8 else ""), ("x8_" if lb.x8 else "")
                register_ptx("matvec",
                             f"matvec_lanes_mixed{tag}_normed_{x8a}{la.name}_{x8b}{lb.name}",
                             _ptx_mixed(la, lb, rounds), options=mixed_jit_options(la, lb))


_register()
