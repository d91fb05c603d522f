"""Small-batch (1..8 tokens) matrix-vector products on quantized rows with the lane-cooperative
decoders of `lanes`: each weight super-block is loaded ONCE per block and dotted with the x of
every token the block holds.

Layout (as the one-token lane kernel of `matvec`): a block of `LANE_WARPS` warps, each warp a
pair of rows, 1 << log warps sharing a pair on interleaved steps (`matvec.lane_split`); per step
the lane groups of a warp take consecutive super-blocks, each lane its fixed slice (wide loads),
the next step's loads issued before the current one is computed. The grid's second axis is the
token group: a block stages the padded x (and 16-value sums) of `tg` tokens in shared memory,
one after the other, and keeps `tg` accumulators per row. `tg` is as many tokens as fit in 48 KiB
(`tokens_per_block`); where the batch needs several groups, the groups' blocks read the same
rows side by side, so the repeated reads come from L2, not HBM.

Each token's sum runs over the same steps, in the same order, with the same partial-sum combine
as the one-token kernel at the same shape: a token's result does not depend on the batch it is
in, and equals the one-token kernel's (bit for bit under the simulator; on a GPU where the
compiler fuses the multiply-adds alike).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, from_dtype, types

from .intrinsics import SIMULATED, ld_x4, quad_sum, st_x4, warp_sum
from .lanes import LaneFormat, combine_split, lane_format
from .launch import (MAX_SHARED_BYTES, check_rows, check_token_batch, device_table, flat,
                     n_blocks, register_ptx)
from .matvec import LANE_THREADS, LANE_WARPS, PART_SLOTS, lane_split, matvec, stage_table
from .qformats import BY_NAME, get_format
from .xstage import padded_len

MAX_TOKENS = 8
F0 = np.float32(0.0)
# static shared memory of a block besides the staged x: the partial sums and a format's table
_STATIC_BYTES = 4 * PART_SLOTS

# A row pair's tg-long accumulators take the batch lane kernels (here and in `batch_moe_lanes`)
# past 128 registers (ptxas 13.0: 159-245 unbounded), which leaves one 256-thread block per SM:
# on the H200 the 8-row step spent 62% of its 22 ms in the batched MoE at that occupancy. They
# are compiled for two blocks per SM (128 registers; Q4_K spills about 40 bytes).
BATCH_JIT_OPTIONS = {"launch_bounds": (LANE_THREADS, 2)}


def batch_jit() -> dict:
    """The options `cuda.jit` takes for a batch lane kernel (none in the simulator)."""
    return {} if SIMULATED else BATCH_JIT_OPTIONS


_CACHE: dict[tuple[int, int], object] = {}


def token_floats(lf: LaneFormat, n_vals: int) -> int:
    """Shared floats one token's staged x takes: padded values, then their 16-value sums
    (rounded up to 4 so every token starts 16-byte aligned)."""
    n = padded_len(n_vals, lf.pad) + (n_vals // 16 if lf.sums else 0)
    return -(-n // 4) * 4


def tokens_fit(lf: LaneFormat, n_vals: int) -> int:
    """How many tokens' staged x of n_vals values fit in one block's shared memory."""
    room = MAX_SHARED_BYTES - _STATIC_BYTES - lf.table.nbytes
    return max(0, room // (4 * token_floats(lf, n_vals)))


def tokens_per_block(lf: LaneFormat, n_vals: int, n_tok: int) -> int:
    """Tokens per block for n_tok tokens: the fewest groups, then groups of equal size."""
    fit = tokens_fit(lf, n_vals)
    if fit < 1:
        raise ValueError(f"{lf.name}: one token's {n_vals} staged values exceed the shared memory")
    n_groups = -(-n_tok // fit)
    return -(-n_tok // n_groups)


@cuda.jit(device=True, inline="always")
def stage_token(x, x_base, n_vals, xs, xs_base, a, pa, b, pb, sums, sums_off):
    """xs[xs_base + pad_pos(i)] = x[x_base + i] for i < n_vals and, with `sums`,
    xs[xs_base + sums_off + i // 16] = the sum of those 16 values (the layout
    `xstage.stage_padded` gives one token, at an offset). The whole block calls this."""
    n_quads = n_vals >> 2
    for q0 in range(0, n_quads, cuda.blockDim.x):
        q = q0 + cuda.threadIdx.x
        s = F0
        if q < n_quads:
            x0, x1, x2, x3 = ld_x4(x, x_base + 4 * q)
            v = 4 * q
            st_x4(xs, xs_base + v + pa * (v >> a) + pb * (v >> b), x0, x1, x2, x3)
            s = (x0 + x1) + (x2 + x3)
        if sums:
            s = quad_sum(s)
            if (cuda.threadIdx.x & 3) == 0 and q < n_quads:
                xs[xs_base + sums_off + (q >> 2)] = s


def token_steps(lf: LaneFormat, tg: int):
    """Device function run(w, off_a, off_b, n_sb, xs, tok_floats, sums_off, tab, s_first,
    s_stride, n_valid, acc_a, acc_b): the calling warp's dots of two rows (byte offsets off_a,
    off_b of w) with the first n_valid (<= tg) staged tokens, added into acc_a[j], acc_b[j]. The
    steps, their clamping and their order are `lanes.row_pair_steps`'s, so each token's sum is
    the one-token kernel's."""
    load, dot = lf.load, lf.dot
    lanes = lf.lanes
    sb_bytes, sb_padded, sb_sums = lf.sb_bytes, lf.padded_sb, lf.sb_values // 16

    @cuda.jit(device=True, inline="always")
    def run(w, off_a, off_b, n_sb, xs, tok_floats, sums_off, tab, s_first, s_stride, n_valid,
            acc_a, acc_b):
        lane = cuda.threadIdx.x & 31
        part = lane & (lanes - 1)
        grp = lane // lanes
        last_sb = n_sb - 1
        sb0 = min(s_first + grp, last_sb)
        cur_a = load(w, off_a + sb0 * sb_bytes, part)
        cur_b = load(w, off_b + sb0 * sb_bytes, part)
        for s0 in range(s_first, n_sb, s_stride):
            sb_next = min(s0 + s_stride + grp, last_sb)
            nxt_a = load(w, off_a + sb_next * sb_bytes, part)
            nxt_b = load(w, off_b + sb_next * sb_bytes, part)
            sb = min(s0 + grp, last_sb)
            valid = s0 + grp < n_sb
            for j in range(tg):
                if j < n_valid:  # the same in the whole block
                    base = j * tok_floats
                    xo = base + sb * sb_padded
                    so = base + sums_off + sb * sb_sums
                    da = dot(cur_a, part, xs, xo, so, tab)
                    db = dot(cur_b, part, xs, xo, so, tab)
                    if valid:
                        acc_a[j] += da
                        acc_b[j] += db
            cur_a = nxt_a
            cur_b = nxt_b
    return run


def _dense(lf: LaneFormat, tg: int):
    run = token_steps(lf, tg)
    n_values, per_step = lf.sb_values, lf.sbs_per_step
    pa_a, pa_pa, pa_b, pa_pb = lf.pad
    sums = lf.sums
    n_tab, tab_type, has_tab = lf.table.size, lf.table.dtype.type, lf.has_table

    @cuda.jit(**batch_jit())
    def matvec_lanes_batch(w, row_bytes, n_sb, n_rows, n_tok, tok_floats, sums_off, log, x, y,
                           tab):
        # w: [n_rows * row_bytes] u8; x: [n_tok * n_cols] f32; y: [n_tok * n_rows] f32;
        # grid (row blocks, token groups of tg); dynamic shared: [tg, tok_floats] f32
        tab_s = cuda.shared.array(n_tab, tab_type)
        s_part = cuda.shared.array(PART_SLOTS, types.float32)
        xs = cuda.shared.array(0, types.float32)
        warp = cuda.threadIdx.x >> 5
        sub = warp & ((1 << log) - 1)
        row0 = (cuda.blockIdx.x * (LANE_WARPS >> log) + (warp >> log)) * 2
        off_a = min(row0, n_rows - 1) * row_bytes
        off_b = min(row0 + 1, n_rows - 1) * row_bytes
        t0 = cuda.blockIdx.y * tg
        n_cols = n_sb * n_values
        if has_tab:
            stage_table(tab, tab_s, n_tab)
        n_valid = min(tg, n_tok - t0)  # the last group may be short
        for j in range(tg):
            if j < n_valid:
                stage_token(x, (t0 + j) * n_cols, n_cols, xs, j * tok_floats, pa_a, pa_pa, pa_b,
                            pa_pb, sums, sums_off)
        cuda.syncthreads()
        acc_a = cuda.local.array(tg, types.float32)
        acc_b = cuda.local.array(tg, types.float32)
        for j in range(tg):
            acc_a[j] = F0
            acc_b[j] = F0
        run(w, off_a, off_b, n_sb, xs, tok_floats, sums_off, tab_s, sub * per_step,
            per_step << log, n_valid, acc_a, acc_b)
        for j in range(tg):
            a, b = combine_split(warp_sum(acc_a[j]), warp_sum(acc_b[j]), s_part, log)
            t = t0 + j
            if (cuda.threadIdx.x & 31) == 0 and sub == 0 and t < n_tok:
                if row0 < n_rows:
                    y[t * n_rows + row0] = a
                if row0 + 1 < n_rows:
                    y[t * n_rows + row0 + 1] = b
            cuda.syncthreads()  # s_part is reused by the next token
    return matvec_lanes_batch


def dense_kernel(lf: LaneFormat, tg: int):
    """The compiled-on-first-use dense kernel for (format, tokens per block)."""
    key = (lf.ggml_type, tg)
    k = _CACHE.get(key)
    if k is None:
        k = _CACHE[key] = _dense(lf, tg)
    return k


def lanes_batch_fits(ggml_type, n_cols: int) -> bool:
    """Whether the lane batch kernel takes rows of this format and width (else `matvec`'s
    generic batch kernel does)."""
    lf = lane_format(get_format(ggml_type).ggml_type)
    return lf is not None and n_cols % lf.sb_values == 0 and tokens_fit(lf, n_cols) >= 1


def matvec_batch(w, ggml_type, x, y, *, stream=0) -> None:
    """y[t] = W x[t] for n_tok = 1..8 tokens in one pass over W. `w`: uint8 rows (1-D or
    [n_rows, row_bytes], 16-byte aligned); x: float32 [n_tok, n_cols]; y: float32
    [n_tok, n_rows]. Formats without a lane decoding, or rows too wide for one token's staged
    x, go to `matvec`'s generic batch kernel."""
    n_tok, n_cols, n_rows = check_token_batch(x, y, MAX_TOKENS, "the batch matvec")
    if not lanes_batch_fits(ggml_type, n_cols):
        matvec(w, ggml_type, x, y, stream=stream)
        return
    lf = lane_format(get_format(ggml_type).ggml_type)
    row_bytes = n_cols // lf.sb_values * lf.sb_bytes
    check_rows(w, lf.name, n_rows, n_cols, row_bytes)
    if n_rows == 0:
        return
    n_sb = n_cols // lf.sb_values
    log = lane_split(lf, n_rows, n_sb)
    tg = tokens_per_block(lf, n_cols, n_tok)
    tf = token_floats(lf, n_cols)
    grid = (n_blocks(n_rows, 2 * (LANE_WARPS >> log)), -(-n_tok // tg))
    dense_kernel(lf, tg)[grid, LANE_THREADS, stream, 4 * tg * tf](
        flat(w), row_bytes, n_sb, n_rows, n_tok, tf, padded_len(n_cols, lf.pad), log, flat(x),
        flat(y), device_table(lf))


def _tab_type(lf):
    return types.Array(from_dtype(lf.table.dtype), 1, "C")


def register_dense(family: str, lf: LaneFormat, tg: int) -> None:
    """Put the dense batch kernel of (format, tokens per block) in the compile registry, with the
    launch bounds it is compiled with (the frozen app's bundle is looked up by them)."""
    def build():
        i64, f32 = types.int64, types.float32[::1]
        return dense_kernel(lf, tg).py_func, ((types.uint8[::1],) + (i64,) * 7
                                              + (f32, f32, _tab_type(lf)))
    register_ptx(family, f"matvec_lanes_batch_{lf.name}_t{tg}", build, options=BATCH_JIT_OPTIONS)


# The specializations the batch engine launches on the Q4_K_M mix for 2..8 sequences: rows of
# 2048 values (q, k, v, head: Q4_K 2..5 tokens a block, Q6_K 2..4, in the engine's planar
# layout) and 4096 (the output projection: 2 a block). Other formats and mixes compile on first
# use.
for _name, _tgs in (("Q4_K", (2, 3, 4, 5)), ("Q6_K", (2, 3, 4)), ("Q6_K_P8", (2, 3, 4))):
    for _tg in _tgs:
        register_dense("batch", lane_format(BY_NAME[_name].ggml_type), _tg)
