"""Lane-cooperative decoding of quantized rows for the decode kernels (matvec, MoE).

The generic decoders (`qformats`) give each lane one whole 32-value group, so the lanes of a warp
read 32 groups at once with narrow strided loads. Here the lanes of a warp split each super-block
(`lanes` lanes per super-block, `32 // lanes` super-blocks per step), each lane loading one fixed
slice with the widest aligned loads its layout allows: a warp's loads cover whole contiguous
super-blocks. Each lane decodes only its slice, so its x positions are fixed per lane: x is staged
in shared memory with a per-format padding that keeps those reads free of bank conflicts, and
formats with a per-block minimum read sums of x over 16 values staged alongside.

A `LaneFormat` holds, per format, the two device functions the kernels call:
  load(w, off, part) -> tuple of u32   lane `part`'s slice of the super-block at byte `off`
  dot(v, part, xs, xo, so, tab) -> f32 that slice's dot with x (see `lanes_k` for the arguments)
Formats without one here use the generic kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, types

from strata.quant.planar import Q6_K_P8

from . import qtables as Q
from .intrinsics import warp_sum
from .lanes_iq import dot_iq3_s, dot_iq4_xs, load_iq3_s, load_iq4_xs
from .lanes_k import (dot_q4_k, dot_q5_k, dot_q6_k, dot_q8_0, load_q4_k, load_q5_k, load_q6_k,
                      load_q6_k_p8, load_q8_0)
from .xstage import X8_SPAN, padded_bytes, padded_len, x8_len

NO_PAD_B = (31, 0)  # (B, PB) of a padding with a single period
F0 = np.float32(0.0)


@dataclass(frozen=True, slots=True)
class LaneFormat:
    """One format's lane-cooperative decoding (see the module doc)."""

    ggml_type: int
    name: str
    sb_values: int      # values of one super-block (block, for Q8_0)
    sb_bytes: int
    lanes: int          # lanes sharing one super-block: a power of two dividing 32
    pad: tuple[int, int, int, int]  # (A, PA, B, PB) of `xstage.pad_pos`
    sums: bool          # whether dot reads the staged 16-value sums of x
    load: Callable[..., Any]
    dot: Callable[..., Any]
    table: np.ndarray   # the table dot indexes (qtables.NO_TABLE where none)
    x8: bool = False    # x staged as 8-bit integers (`lanes_x8`), not padded float32

    def __post_init__(self):
        a, pa, b, pb = self.pad
        if self.x8:
            if self.sb_values % X8_SPAN:
                raise ValueError(f"{self.name}: 8-bit x is staged in {X8_SPAN}-value spans; "
                                 f"{self.sb_values}-value super-blocks do not fill them")
            if self.lanes * X8_SPAN != self.sb_values:
                raise ValueError(f"{self.name}: an 8-bit lane reads {X8_SPAN} values (the span "
                                 f"the staging spreads over the banks), not "
                                 f"{self.sb_values // self.lanes}")
            return
        if 32 % self.lanes or self.lanes & (self.lanes - 1):
            raise ValueError(f"{self.name}: {self.lanes} lanes per super-block do not divide 32")
        if a < 4 or pa % 4 or pb % 4 or self.sb_values % (1 << a):
            raise ValueError(f"{self.name}: padding {self.pad} breaks 16-byte x reads")
        if pb and self.sb_values % (1 << b):
            raise ValueError(f"{self.name}: padding {self.pad} is not periodic per super-block")

    @property
    def has_table(self) -> bool:
        return self.table is not Q.NO_TABLE

    @property
    def sbs_per_step(self) -> int:
        return 32 // self.lanes

    @property
    def padded_sb(self) -> int:
        """Staged 4-byte words per super-block (the padding repeats with each one)."""
        if self.x8:
            return x8_len(self.sb_values)
        a, pa, b, pb = self.pad
        v = self.sb_values
        return v + pa * (v >> a) + pb * (v >> b)

    @property
    def sb_sums(self) -> int:
        """Staged words per super-block after the values: its 16-value sums of x (float32
        staging), or its groups' scales and sums (8-bit, `lanes_x8`)."""
        return self.sb_values // 16

    @property
    def xs_type(self):
        """The numba dtype of the kernels' dynamic shared array holding the staged x."""
        return types.uint32 if self.x8 else types.float32

    def stage_len(self, n_vals: int) -> int:
        """Words of the staged x of n_vals values before its sums (the kernels' sums_off)."""
        return x8_len(n_vals) if self.x8 else padded_len(n_vals, self.pad)

    def stage_bytes(self, n_vals: int) -> int:
        """Dynamic shared memory of a staged x of n_vals values."""
        if self.x8:
            return 4 * (x8_len(n_vals) + n_vals // 16)
        return padded_bytes(n_vals, self.pad, self.sums)


def _lf(t: T, sb_values: int, sb_bytes: int, lanes: int, pad, sums: bool, load, dot,
        table=Q.NO_TABLE) -> tuple[int, LaneFormat]:
    return int(t), LaneFormat(int(t), t.name, sb_values, sb_bytes, lanes, pad, sums, load, dot,
                              table)


LANE_FORMATS: dict[int, LaneFormat] = dict([
    _lf(T.Q4_K, 256, 144, 4, (6, 4) + NO_PAD_B, True, load_q4_k, dot_q4_k),
    _lf(T.Q5_K, 256, 176, 8, (6, 4) + NO_PAD_B, True, load_q5_k, dot_q5_k),
    _lf(T.Q6_K, 256, 210, 8, (5, 4, 7, 8), True, load_q6_k, dot_q6_k),
    _lf(T.Q8_0, 32, 34, 1, (5, 4) + NO_PAD_B, False, load_q8_0, dot_q8_0),
    _lf(T.IQ4_XS, 256, 136, 8, (5, 4) + NO_PAD_B, False, load_iq4_xs, dot_iq4_xs,
        Q.TABLE_IQ4NL),
    _lf(T.IQ3_S, 256, 110, 4, (5, 4, 8, 4), False, load_iq3_s, dot_iq3_s, Q.TABLE_IQ3_S),
])
# The planar layout of dense Q6_K (`strata.quant.planar`): Q6_K's lanes, loaded in place
LANE_FORMATS[Q6_K_P8.ggml_type] = replace(LANE_FORMATS[int(T.Q6_K)], ggml_type=Q6_K_P8.ggml_type,
                                          name=Q6_K_P8.name, load=load_q6_k_p8)


def lane_format(ggml_type: int) -> LaneFormat | None:
    """The lane decoding of a GGML type number, or None where only the generic kernels exist."""
    return LANE_FORMATS.get(int(ggml_type))


def split_log(n_row_pairs: int, n_steps: int, *, warps: int, min_blocks: int) -> int:
    """log2 of how many warps share a row pair (1, 2 or 4), so that n_row_pairs give at least
    min_blocks blocks of `warps` warps where they can; never more warps than steps per row."""
    log = 0
    while (log < 2 and (2 << log) <= n_steps
           and -(-n_row_pairs * (1 << log) // warps) < min_blocks):
        log += 1
    return log


def row_pair_steps(lf: LaneFormat):
    """Device functions (first, run) dotting two rows of n_sb super-blocks, at byte offsets off_a
    and off_b of w, with the staged x, in the calling warp:
      first(w, off_a, off_b, n_sb, s_first) -> cur    loads of the first step (issue them before
                                                      staging x)
      run(w, off_a, off_b, n_sb, cur, xs, sums_off, tab, s_first, s_stride) -> (dot_a, dot_b)
    Steps start at super-blocks s_first, s_first + s_stride, ... (s_first a multiple of
    32 // lanes; warps sharing a row pair take interleaved steps); each step's lane groups take
    the next 32 // lanes super-blocks (those past the row clamped and left out), and the loads
    of the next step are issued before the current one is computed. The sums are the warp's
    partial dots, in every lane."""
    first, _ = pair_step(lf)  # the lane's slices of both rows at step s_first
    steps = pair_steps_from(lf)

    @cuda.jit(device=True, inline="always")
    def run(w, off_a, off_b, n_sb, cur, xs, sums_off, tab, s_first, s_stride):
        cur_a, cur_b = cur
        acc_a, acc_b = steps(w, off_a, off_b, n_sb, cur_a, cur_b, F0, F0, xs, sums_off, tab,
                             s_first, s_stride)
        return warp_sum(acc_a), warp_sum(acc_b)
    return first, run


def pair_steps_from(lf: LaneFormat):
    """Device function steps(w, off_a, off_b, n_sb, cur_a, cur_b, acc_a, acc_b, xs, sums_off,
    tab, s0, s_stride) -> (acc_a, acc_b): `row_pair_steps`' loop from step s0 (cur_*: its
    loads) on, added to the lane's acc_* (per lane; sum them over the warp)."""
    load, dot = lf.load, lf.dot
    lanes = lf.lanes
    sb_bytes, sb_padded, sb_sums = lf.sb_bytes, lf.padded_sb, lf.sb_sums

    @cuda.jit(device=True, inline="always")
    def steps(w, off_a, off_b, n_sb, cur_a, cur_b, acc_a, acc_b, xs, sums_off, tab, s0,
              s_stride):
        lane = cuda.threadIdx.x & 31
        part = lane & (lanes - 1)
        grp = lane // lanes
        last_sb = n_sb - 1
        while s0 < n_sb:  # not a range: its trip count would divide by s_stride
            sb_next = min(s0 + s_stride + grp, last_sb)
            nxt_a = load(w, off_a + sb_next * sb_bytes, part)
            nxt_b = load(w, off_b + sb_next * sb_bytes, part)
            sb = min(s0 + grp, last_sb)
            xo = sb * sb_padded
            so = sums_off + sb * sb_sums
            da = dot(cur_a, part, xs, xo, so, tab)
            db = dot(cur_b, part, xs, xo, so, tab)
            if s0 + grp < n_sb:
                acc_a += da
                acc_b += db
            cur_a = nxt_a
            cur_b = nxt_b
            s0 += s_stride
        return acc_a, acc_b
    return steps


def pair_step(lf: LaneFormat):
    """Device functions for one step of two rows, for kernels that pipeline steps across rows
    (each warp's next step, of this row pair or the next, loaded before the current is dotted):
      load_pair(w, off_a, off_b, n_sb, s0) -> cur    the calling lane's slices of super-block
                                                     s0 + its group of both rows (clamped)
      dot_pair(cur, n_sb, s0, xs, sums_off, tab) -> (da, db)   their dots with the staged x,
                                                     zero for a group past the row
    The dots are per lane (sum them over the warp)."""
    load, dot = lf.load, lf.dot
    lanes = lf.lanes
    sb_bytes, sb_padded, sb_sums = lf.sb_bytes, lf.padded_sb, lf.sb_sums

    @cuda.jit(device=True, inline="always")
    def load_pair(w, off_a, off_b, n_sb, s0):
        lane = cuda.threadIdx.x & 31
        sb = min(s0 + lane // lanes, n_sb - 1)
        part = lane & (lanes - 1)
        return load(w, off_a + sb * sb_bytes, part), load(w, off_b + sb * sb_bytes, part)

    @cuda.jit(device=True, inline="always")
    def dot_pair(cur, n_sb, s0, xs, sums_off, tab):
        lane = cuda.threadIdx.x & 31
        part = lane & (lanes - 1)
        grp = lane // lanes
        sb = min(s0 + grp, n_sb - 1)
        xo = sb * sb_padded
        so = sums_off + sb * sb_sums
        da = dot(cur[0], part, xs, xo, so, tab)
        db = dot(cur[1], part, xs, xo, so, tab)
        if s0 + grp < n_sb:
            return da, db
        return F0, F0
    return load_pair, dot_pair


@cuda.jit(device=True, inline="always")
def combine_split(acc_a, acc_b, s_part, log):
    """Sum the partial dots of the 1 << log warps sharing a row pair (consecutive warps), in a
    fixed order: the result in lane 0 of the pair's first warp (other lanes: meaningless).
    s_part: shared float32 [2 * warps]; the whole block calls this (it synchronises)."""
    w = cuda.threadIdx.x >> 5
    if (cuda.threadIdx.x & 31) == 0:
        s_part[2 * w] = acc_a
        s_part[2 * w + 1] = acc_b
    cuda.syncthreads()
    if (cuda.threadIdx.x & 31) == 0 and (w & ((1 << log) - 1)) == 0:
        for j in range(1, 1 << log):
            acc_a += s_part[2 * (w + j)]
            acc_b += s_part[2 * (w + j) + 1]
    return acc_a, acc_b
