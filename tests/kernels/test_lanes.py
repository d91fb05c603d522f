"""The lane-cooperative decode path: span loads, padded x staging, the paddings' bank layout,
and the lane matvec against gguf-py's dequantization (tails, split steps, misaligned rows)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, types

from helpers.kernel_blocks import dots_x8, own_random_rows, random_rows, reference, x_seen
from strata.cuda_kernels import matvec as mv
from strata.cuda_kernels.lanes import LANE_FORMATS, LaneFormat, split_log
from strata.cuda_kernels.lanes_x8 import x8_format
from strata.cuda_kernels.qtables import NO_TABLE
from strata.cuda_kernels.spans import span2, span4, span8
from strata.cuda_kernels.xstage import padded_len, stage_padded

BY_LANE_NAME = {f.name: f for f in LANE_FORMATS.values()}


@cuda.jit
def _spans_kernel(buf, offs, out):
    i = cuda.grid(1)
    if i < offs.size:
        o = offs[i]
        n = buf.size
        if o + 8 <= n:
            a = span2(buf, o)
            for j in range(2):
                out[i, j] = a[j]
        if o + 16 <= n:
            b = span4(buf, o)
            for j in range(4):
                out[i, 2 + j] = b[j]
        if o + 32 <= n:
            c = span8(buf, o)
            for j in range(8):
                out[i, 6 + j] = c[j]


@pytest.mark.parametrize("n_bytes", [70, 72])
def test_spans_read_every_even_offset_up_to_the_buffer_end(n_bytes):
    """Every span ending at the buffer's end among the offsets, at either 4-byte alignment of
    that end; the simulator's loads fail on a word that starts past it."""
    rng = np.random.default_rng(3)
    buf = rng.integers(0, 256, n_bytes, dtype=np.uint8)
    offs = np.arange(0, n_bytes - 8 + 1, 2, dtype=np.int64)
    out = np.full((offs.size, 14), -1, np.int64)
    _spans_kernel[1, 64](buf, offs, out)
    for i, o in enumerate(offs):
        for lo, n_words in ((0, 2), (2, 4), (6, 8)):
            want = [-1] * n_words
            if o + 4 * n_words <= buf.size:
                want = buf[o:o + 4 * n_words].view("<u4").astype(np.int64).tolist()
            assert out[i, lo:lo + n_words].tolist() == want, (o, n_words)


def _stage_kernel(pad, sums):
    a, pa, b, pb = pad

    @cuda.jit
    def k(x, n_vals, sums_off, out):
        xs = cuda.shared.array(0, types.float32)
        stage_padded(x, 0, n_vals, xs, a, pa, b, pb, sums, sums_off)
        cuda.syncthreads()
        for i in range(cuda.threadIdx.x, out.size, cuda.blockDim.x):
            out[i] = xs[i]
    return k


def _pad_pos(v, pad):
    a, pa, b, pb = pad
    return v + pa * (v >> a) + pb * (v >> b)


@pytest.mark.parametrize("pad,dtype", [((5, 4, 7, 8), np.float32), ((6, 4, 31, 0), np.float16),
                                       ((5, 4, 8, 4), np.float32)])
def test_stage_padded_places_values_and_16_sums(pad, dtype):
    n = 272  # not a multiple of the block's quads per pass (64 threads)
    x = np.random.default_rng(5).standard_normal(n).astype(dtype)
    off = padded_len(n, pad)
    out = np.full(off + n // 16, np.nan, np.float32)
    _stage_kernel(pad, True)[1, 64, 0, 4 * out.size](x, n, off, out)
    pos = np.array([_pad_pos(v, pad) for v in range(n)])
    np.testing.assert_array_equal(out[pos], x.astype(np.float32))
    want = x.astype(np.float64).reshape(-1, 16).sum(1)
    np.testing.assert_allclose(out[off:], want, rtol=1e-5, atol=1e-6)


# first value (inside its super-block) of each x read of lane `part`, per the slice layouts
# in lanes_k / lanes_iq (the other reads of a lane are these plus a multiple of 4)
_READS = {
    "Q4_K": lambda p: (64 * p, 64 * p + 32),
    "Q5_K": lambda p: (64 * (p >> 1) + 16 * (p & 1), 64 * (p >> 1) + 16 * (p & 1) + 32),
    "Q6_K": lambda p: ((v := 128 * (p >> 2) + 32 * ((p >> 1) & 1) + 16 * (p & 1)), v + 64),
    "Q8_0": lambda p: (0, 16),
    "IQ4_XS": lambda p: (32 * p, 32 * p + 16),
    "IQ3_S": lambda p: (64 * p, 64 * p + 32),
}
_READS["Q6_K_P8"] = _READS["Q6_K"]  # the planar layout's lanes read x as Q6_K's


@pytest.mark.parametrize("name", sorted(BY_LANE_NAME))
def test_padding_spreads_each_phase_over_all_bank_groups(name):
    lf = BY_LANE_NAME[name]
    for read in range(2):
        for phase in range(4):                  # a 16-byte shared load serves 8 lanes at once
            groups = set()
            for lane in range(8 * phase, 8 * phase + 8):
                v = (lane // lf.lanes) * lf.sb_values + _READS[name](lane % lf.lanes)[read]
                groups.add((_pad_pos(v, lf.pad) // 4) % 8)
            assert len(groups) == 8, (name, read, phase, groups)


def test_lane_format_refuses_bad_geometry():
    base = dict(ggml_type=0, name="X", sb_values=256, sb_bytes=64, sums=False, load=None,
                dot=None, table=NO_TABLE)
    with pytest.raises(ValueError, match="do not divide 32"):
        LaneFormat(lanes=3, pad=(5, 4, 31, 0), **base)
    with pytest.raises(ValueError, match="16-byte"):
        LaneFormat(lanes=8, pad=(5, 2, 31, 0), **base)
    with pytest.raises(ValueError, match="periodic"):
        LaneFormat(lanes=8, pad=(5, 4, 9, 4), **base)


def test_split_log():
    assert split_log(2048, 4, warps=8, min_blocks=256) == 0   # 256 blocks already
    assert split_log(1024, 4, warps=8, min_blocks=256) == 1
    assert split_log(1, 8, warps=8, min_blocks=256) == 2     # capped at 4 warps a pair
    assert split_log(1, 3, warps=8, min_blocks=256) == 1     # never more warps than steps
    assert split_log(1, 1, warps=8, min_blocks=256) == 0


_X8_FLOOR = dict(mv.X8_MIN_BYTES)  # the product's, read before the kernel tests' fixture lifts it


def _rel(got, want):
    return np.linalg.norm(got - want) / np.linalg.norm(want)


# (format, n_rows, n_cols): tails of the last step, 2 and 4 warps per row pair, rows at 2-byte
# boundaries (Q6_K 768: 630-byte rows, Q8_0 96: 102-byte rows, IQ3_S 768: 330-byte rows)
CASES = [("Q4_K", 5, 768), ("Q4_K", 3, 2048), ("Q5_K", 5, 1280), ("Q6_K", 5, 768),
         ("Q6_K", 3, 2048), ("Q8_0", 5, 96), ("Q8_0", 3, 3136), ("IQ4_XS", 3, 2048),
         ("IQ4_XS", 5, 768), ("IQ3_S", 5, 768), ("IQ3_S", 3, 2304)]


@pytest.mark.parametrize("name,n_rows,n_cols", CASES)
def test_lane_matvec(name, n_rows, n_cols):
    rng = np.random.default_rng(n_rows * n_cols)
    lf = BY_LANE_NAME[name]
    assert mv.lanes_fit(lf, n_cols)
    for gen in (random_rows, own_random_rows):
        rows = gen(name, n_rows, n_cols, rng)
        x = rng.standard_normal(n_cols).astype(np.float32)
        y = np.full(n_rows, np.nan, np.float32)
        mv.matvec(rows, name, x, y)
        assert _rel(y, reference(name, rows, n_cols) @ x_seen(x, dots_x8(name, rows.nbytes))) < 1e-5
    # the lane kernel ran (plain, or asking for x between the rows: X_BETWEEN)
    assert any(k[:3] == (lf.ggml_type, 0, dots_x8(name, rows.nbytes)) for k in mv._CACHE)


def test_x8_floor(monkeypatch):
    """A format under its X8_MIN_BYTES dots float32 x (Q6_K: 8 MiB a launch, the product's
    default, lifted for the other kernel tests), from it 8-bit x; in the mixed q/k/v launch
    each format decides on its own matrices' bytes, with the bits of its own launch."""
    assert _X8_FLOOR == {BY_LANE_NAME["Q6_K"].ggml_type: 8 << 20,
                         BY_LANE_NAME["Q6_K_P8"].ggml_type: 4 << 20}
    rng = np.random.default_rng(23)
    t6, t4 = BY_LANE_NAME["Q6_K"].ggml_type, BY_LANE_NAME["Q4_K"].ggml_type
    rows = random_rows("Q6_K", 5, 768, rng)
    x = rng.standard_normal(768).astype(np.float32)
    ref = reference("Q6_K", rows, 768)
    for floor, x8 in ((rows.nbytes + 1, False), (rows.nbytes, True)):
        monkeypatch.setattr(mv, "X8_MIN_BYTES", {t6: floor})
        mv._CACHE.clear()
        y = np.full(5, np.nan, np.float32)
        mv.matvec(rows, "Q6_K", x, y)
        assert list(mv._CACHE) == [(t6, 0, x8)]
        assert _rel(y, ref @ x_seen(x, x8)) < 1e-5
        assert dots_x8("Q6_K", rows.nbytes) == x8
    # q, k Q4_K and v Q6_K with the norm: v under the floor keeps float32 x, q and k take 8-bit
    from strata.cuda_kernels import matvec_mixed as mm
    from strata.cuda_kernels.matvec_normed import matvec_normed
    nw = rng.uniform(0.5, 1.5, 768).astype(np.float32)
    ws = [random_rows(f, n, 768, rng) for f, n in (("Q4_K", 4), ("Q4_K", 2), ("Q6_K", 3))]
    monkeypatch.setattr(mv, "X8_MIN_BYTES", {t6: ws[2].nbytes + 1})
    mm._CACHE.clear()

    def launch(groups):
        ys = [np.full(w.shape[0], np.nan, np.float32) for w in ws]
        fmts = ("Q4_K", "Q4_K", "Q6_K")
        for g in groups:
            matvec_normed(x, nw, 1e-6, [(ws[j], fmts[j], ys[j]) for j in g])
        return ys
    mixed = launch([(0, 1, 2)])
    assert [k[:4] for k in mm._CACHE] == [(t4, True, t6, False)]
    for y, y_apart in zip(mixed, launch([(0, 1), (2,)])):
        np.testing.assert_array_equal(y, y_apart)


def test_lane_matvec_f16_x():
    rng = np.random.default_rng(17)
    rows = random_rows("Q6_K", 3, 1024, rng)
    x = rng.standard_normal(1024).astype(np.float16)
    y = np.full(3, np.nan, np.float32)
    mv.matvec(rows, "Q6_K", x, y)
    assert _rel(y, reference("Q6_K", rows, 1024) @ x_seen(x, dots_x8("Q6_K", rows.nbytes))) < 1e-5


def test_rows_too_wide_for_the_staged_x_use_the_generic_kernel():
    lf = BY_LANE_NAME["Q4_K"]
    n_cols = 11008                     # 43 super-blocks: padded x and sums exceed 48 KiB
    assert not mv.lanes_fit(lf, n_cols)
    rng = np.random.default_rng(2)
    rows = random_rows("Q4_K", 2, n_cols, rng)
    x = rng.standard_normal(n_cols).astype(np.float32)
    y = np.full(2, np.nan, np.float32)
    mv.matvec(rows, "Q4_K", x, y)
    assert _rel(y, reference("Q4_K", rows, n_cols) @ x.astype(np.float64)) < 1e-5


# (format, n_rows, n_cols, grid cap): more row pairs than the grid's warps, so warps go through
# pairs in rounds, the last round part empty: rows of one step (Q4_K 2048), and rows of several
# steps whose warps share a pair (IQ3_S 4096: four warps a pair; Q4_K 4096: two; Q6_K 3072:
# two warps over three steps, one unit of the second past the row; Q6_K 41 x 1024 and Q4_K
# 35 x 2048 at a cap of 2: three blocks of the wide kernel, `matvec.WIDE_ROUNDS`)
ROUNDS = [("Q4_K", 37, 512, 1), ("Q4_K", 35, 2048, 2), ("Q6_K", 41, 1024, 1),
          ("Q6_K", 41, 1024, 2), ("Q8_0", 67, 256, 2),
          ("Q8_0", 19, 96, 1), ("IQ3_S", 21, 4096, 1), ("Q4_K", 35, 4096, 2),
          ("Q6_K", 9, 3072, 1), ("IQ4_XS", 21, 512, 1)]


@pytest.mark.parametrize("name,n_rows,n_cols,cap", ROUNDS)
def test_lane_matvec_in_rounds_equals_one_round(name, n_rows, n_cols, cap, monkeypatch):
    """A grid capped below the row pairs (LANE_GRID_BLOCKS) goes through them in rounds: the
    same sums, bit for bit, as a grid of one pair per warp, and equal to the reference; y +=
    in rounds adds each row once."""
    rng = np.random.default_rng(n_rows + n_cols)
    rows = random_rows(name, n_rows, n_cols, rng)
    x = rng.standard_normal(n_cols).astype(np.float32)
    y_one = np.full(n_rows, np.nan, np.float32)
    mv.matvec(rows, name, x, y_one)
    monkeypatch.setattr(mv, "LANE_GRID_BLOCKS", cap)
    launched = []  # (rounds, min_blocks, copies) of each lane launch
    kernel = mv._lanes_kernel

    def recording(lf, normed=False, rounds=False, min_blocks=0, copies=1, between=False):
        launched.append((rounds, min_blocks, copies))
        return kernel(lf, normed, rounds, min_blocks, copies, between)
    monkeypatch.setattr(mv, "_lanes_kernel", recording)
    y = np.full(n_rows, np.nan, np.float32)
    mv.matvec(rows, name, x, y)
    # at a cap of 2 the formats of WIDE_ROUNDS run their wide kernel (three blocks an SM); Q6_K
    # on 8-bit x (every 8-bit decoder runs here: conftest) loads two units ahead instead;
    # IQ3_S's rounds read its grid in 16 copies (`lanes_x8.GRID_COPIES`)
    assert launched == [(True, 3 if cap == 2 and name in ("Q4_K", "Q8_0") else 0,
                         16 if name == "IQ3_S" else 1)]
    assert np.array_equal(y, y_one)
    assert _rel(y, reference(name, rows, n_cols) @ x_seen(x, dots_x8(name, rows.nbytes))) < 1e-5
    base = rng.standard_normal(n_rows).astype(np.float32)
    acc = base.copy()
    mv.matvec(rows, name, x, acc, accumulate=True)
    assert np.array_equal(acc, base + y_one)


# (format, n_rows, n_cols, x dtype): one step a warp (Q4_K 2048), two warps a pair (Q4_K 4096:
# 4 rows are 2 pairs, one block), a step's tail past the row (Q6_K 768: 3 super-blocks of a
# step's 8), several steps a warp (IQ3_S 4608 in 3 warps' interleaved steps), x past the two
# rounds each thread loads first (5120 values: 640 octets of 512), the tables (IQ3_S's grid,
# IQ4_XS's levels), float16 x, an odd row count
BETWEEN = [("Q4_K", 7, 2048, np.float32), ("Q4_K", 4, 4096, np.float32),
           ("Q6_K", 5, 768, np.float32), ("IQ3_S", 3, 4608, np.float32),
           ("Q4_K", 6, 5120, np.float16), ("IQ4_XS", 5, 5120, np.float32),
           ("IQ3_S", 4, 512, np.float16)]


@pytest.mark.parametrize("name,n_rows,n_cols,dtype", BETWEEN)
def test_x_between_the_rows_equals_the_plain_kernel(name, n_rows, n_cols, dtype, monkeypatch):
    """The one-pair 8-bit kernel asking for x between a step's rows (X_BETWEEN,
    `lanes_between`) stages the same x and dots the same steps in the same order: bit for bit
    the plain kernel's sums (y = and y +=), and equal to the reference."""
    rng = np.random.default_rng(n_rows * n_cols + 5)
    rows = random_rows(name, n_rows, n_cols, rng)
    x = rng.standard_normal(n_cols).astype(dtype)
    lf = mv.launch_decoding(BY_LANE_NAME[name], None, n_cols, ((rows, None, n_rows),))
    assert lf.x8
    base = rng.standard_normal(n_rows).astype(np.float32)
    got = {}
    for between in (False, True):
        monkeypatch.setattr(mv, "X_BETWEEN", {name: 1 << 30} if between else {})
        monkeypatch.setattr(mv, "_CACHE", {})
        y = np.full(n_rows, np.nan, np.float32)
        mv.matvec(rows, name, x, y)
        acc = base.copy()
        mv.matvec(rows, name, x, acc, accumulate=True)
        got[between] = y, acc
        assert ((lf.ggml_type, 0, True, "between") in mv._CACHE) == between
    assert np.array_equal(got[True][0], got[False][0])
    assert np.array_equal(got[True][1], got[False][1])
    assert _rel(got[True][0], reference(name, rows, n_cols) @ x_seen(x, True)) < 1e-5


def test_x_between_the_rows_only_where_it_applies(monkeypatch):
    """X_BETWEEN takes only plain one-pair 8-bit launches of its formats (not float32 x, rounds
    or the norm), and only where a warp takes at most the format's steps of a row pair: IQ3_S
    (slower at two steps a warp) at one, the others at any; lane_body refuses the others."""
    assert mv.X_BETWEEN == {"Q4_K": 1 << 30, "Q6_K_P8": 1 << 30, "IQ4_XS": 1 << 30,
                            "IQ3_S": 1}
    q4 = BY_LANE_NAME["Q4_K"]
    q4x8, iq3x8, q6x8 = (mv.lanes_for(BY_LANE_NAME[n], True) for n in ("Q4_K", "IQ3_S", "Q6_K"))
    assert mv.x_between(q4x8, False, False, 5)
    assert mv.x_between(iq3x8, False, False, 1) and not mv.x_between(iq3x8, False, False, 2)
    assert not mv.x_between(q6x8, False, False, 1)  # GGUF's Q6_K layout: not timed
    assert not mv.x_between(q4, False, False, 1)
    assert not mv.x_between(q4x8, True, False, 1)
    assert not mv.x_between(q4x8, False, True, 1)
    monkeypatch.setattr(mv, "X_BETWEEN", {})
    assert not mv.x_between(q4x8, False, False, 1)
    for kw in ({"rounds": True}, {"normed": True}):
        with pytest.raises(ValueError, match="plain one-pair 8-bit"):
            mv.lane_body(q4x8, x_between=True, **kw)
    with pytest.raises(ValueError, match="plain one-pair 8-bit"):
        mv.lane_body(q4, x_between=True)


@pytest.mark.parametrize("n_cols,min_blocks,between", [(4096, 256, True), (4096, 1, False),
                                                       (2048, 1, True)])
def test_x_between_by_the_steps_a_warp_takes(n_cols, min_blocks, between, monkeypatch):
    """IQ3_S (X_BETWEEN 1): rows of 4096 split between two warps (a grid aiming at 256 blocks:
    one step a warp) and rows of 2048 (one step) take the kernel asking for x between the
    rows; rows of 4096 on one warp (a grid aiming at one block: two steps) keep the plain
    one."""
    n_rows = 4
    monkeypatch.setattr(mv, "MIN_LANE_BLOCKS", min_blocks)
    monkeypatch.setattr(mv, "_CACHE", {})
    rng = np.random.default_rng(n_rows + n_cols)
    rows = random_rows("IQ3_S", n_rows, n_cols, rng)
    x = rng.standard_normal(n_cols).astype(np.float32)
    y = np.full(n_rows, np.nan, np.float32)
    mv.matvec(rows, "IQ3_S", x, y)
    t = BY_LANE_NAME["IQ3_S"].ggml_type
    assert list(mv._CACHE) == [(t, 0, True) + (("between",) if between else ())]
    assert _rel(y, reference("IQ3_S", rows, n_cols) @ x_seen(x, True)) < 1e-5


AHEAD = [("Q6_K", 41, 1024, 1), ("Q6_K", 9, 3072, 2), ("Q4_K", 35, 2048, 2),
         ("IQ3_S", 21, 4096, 1), ("Q8_0", 67, 256, 2)]


@pytest.mark.parametrize("name,n_rows,n_cols,cap", AHEAD)
def test_rounds_with_loads_two_units_ahead_equal_one_ahead(name, n_rows, n_cols, cap,
                                                           monkeypatch):
    """A rounds kernel whose loads run two units ahead (ROUNDS_AHEAD; by default Q6_K on 8-bit
    x, which every 8-bit format takes here: conftest) dots the same units in the same order:
    bit for bit the sums of loads one unit ahead, through pair changes at every unit (one step
    a pair), split pairs and the last pairs past the rows."""
    rng = np.random.default_rng(n_rows * n_cols)
    rows = random_rows(name, n_rows, n_cols, rng)
    x = rng.standard_normal(n_cols).astype(np.float32)
    monkeypatch.setattr(mv, "LANE_GRID_BLOCKS", cap)
    monkeypatch.setattr(mv, "WIDE_ROUNDS", {})  # a wide kernel loads one unit ahead
    lf = mv.launch_decoding(BY_LANE_NAME[name], None, n_cols, ((rows, None, n_rows),))
    got = {}
    for ahead in (1, 2):
        monkeypatch.setattr(mv, "ROUNDS_AHEAD", {(name, lf.x8): ahead})
        assert mv.rounds_ahead(lf) == ahead
        y = np.full(n_rows, np.nan, np.float32)
        mv.matvec(rows, name, x, y)
        got[ahead] = y
        copies = 16 if name == "IQ3_S" else 1
        assert (lf.ggml_type, 0, lf.x8, "rounds", 0, ahead, copies) in mv._CACHE
    assert np.array_equal(got[1], got[2])
    assert _rel(got[2], reference(name, rows, n_cols) @ x_seen(x, dots_x8(name, rows.nbytes))) \
        < 1e-5


@pytest.mark.parametrize("n_rows,n_cols,cap,normed", [(21, 4096, 1, False), (41, 768, 2, True),
                                                     (5, 256, 1, False)])
def test_iq3_s_rounds_on_grid_copies_equal_the_grid_once(n_rows, n_cols, cap, normed,
                                                         monkeypatch):
    """IQ3_S's rounds matvec reading its grid staged in 16 interleaved copies, each lane its
    own (`lanes_x8.GRID_COPIES`), gives bit for bit the sums of the grid staged once, plain and
    with the fused RMSNorm, at pairs of several steps and one; where the copies and x would not
    fit a block's shared memory, the grid is staged once."""
    from strata.cuda_kernels import lanes_x8
    rng = np.random.default_rng(n_rows + 7 * n_cols)
    rows = random_rows("IQ3_S", n_rows, n_cols, rng)
    x = rng.standard_normal(n_cols).astype(np.float32)
    nw = rng.standard_normal(n_cols).astype(np.float32)
    monkeypatch.setattr(mv, "LANE_GRID_BLOCKS", cap)
    lf = mv.launch_decoding(BY_LANE_NAME["IQ3_S"], None, n_cols, ((rows, None, n_rows),))
    assert lf.x8  # conftest: every 8-bit decoder runs
    got = {}
    for on in (True, False):
        monkeypatch.setattr(lanes_x8, "COPY_GRIDS", on)
        y = np.full(n_rows, np.nan, np.float32)
        if normed:
            xn = np.full(n_cols, np.nan, np.float32)
            mv.launch_lane_matvec(lf, x, ((rows, y, n_rows),), n_cols, rows.shape[1], 0,
                                  norm=(nw, 1e-6, xn))
        else:
            mv.matvec(rows, "IQ3_S", x, y)
        got[on] = y
        assert (lf.ggml_type, -1 if normed else 0, True, "rounds", 0, 1,
                16 if on else 1) in mv._CACHE
    assert np.array_equal(got[True], got[False]) and np.isfinite(got[True]).all()
    if not normed:
        assert _rel(got[True], reference("IQ3_S", rows, n_cols)
                    @ x_seen(x, dots_x8("IQ3_S", rows.nbytes))) < 1e-5
    # the fit: 32 KiB of copies beside x
    monkeypatch.setattr(lanes_x8, "COPY_GRIDS", True)
    assert lanes_x8.grid_copies(lf, 8192, 48 * 1024 - 64) == 16
    assert lanes_x8.grid_copies(lf, 16384, 48 * 1024 - 64) == 1
    assert lanes_x8.grid_copies(BY_LANE_NAME["IQ3_S"], 4096, 48 * 1024) == 1  # float32 x
    with pytest.raises(ValueError, match="a table in copies is for the rounds kernels"):
        mv.lane_body(lf, rounds=False, copies=16)
    with pytest.raises(ValueError, match="no decoder reads its table in 16 copies"):
        mv.lane_body(x8_format(BY_LANE_NAME["Q4_K"].ggml_type), rounds=True, copies=16)


def test_table_copies_are_staged_interleaved():
    """Entry e of copy c at e * copies + c, every copy whole."""
    from strata.cuda_kernels.lanes_x8 import stage_table_copies
    tab = np.arange(1, 41, dtype=np.uint32) * 7919

    @cuda.jit
    def k(tab, out):
        s = cuda.shared.array(640, np.uint32)
        stage_table_copies(tab, s, 40, 16)
        cuda.syncthreads()
        i = cuda.threadIdx.x
        while i < 640:
            out[i] = s[i]
            i += cuda.blockDim.x
    out = np.zeros(640, np.uint32)
    k[1, 64](tab, out)
    assert np.array_equal(out, np.repeat(tab, 16))


def test_table_copies_banks():
    """The bank arithmetic GRID_COPIES' layout claims, for 16 copies of 512 entries: each of a
    warp's stores (a thread's j-th, entries 32w + lane) falls in its own bank, and a lane's
    lookups of any entry fall in one of two banks, shared with one other lane only."""
    copies, lanes = 16, np.arange(32)
    rot = lanes + (lanes >> 4)
    for w in range(16):
        e = 32 * w + lanes
        for j in range(copies):
            banks = (e * copies + ((j + rot) & (copies - 1))) % 32
            assert len(set(banks.tolist())) == 32, (w, j)
    for entry in range(512):
        banks = (entry * copies + (lanes & (copies - 1))) % 32
        for lane in range(32):
            assert banks[lane] in (lane % 16, lane % 16 + 16)
        assert len(set(banks.tolist())) == 16  # lane l and l + 16 share a bank, no others


def test_rounds_ahead_default_and_bounds():
    """Q6_K on 8-bit x loads two units ahead at two blocks an SM (128 registers), no longer in a
    wide kernel; the others one unit; a third unit is refused."""
    q6_x8 = x8_format(BY_LANE_NAME["Q6_K"].ggml_type)
    assert mv.rounds_ahead(q6_x8) == 2 and ("Q6_K", True) not in mv.WIDE_ROUNDS
    assert mv.rounds_launch(q6_x8, 9496) == (250, 0)
    assert mv.matvec_jit_options(q6_x8, 0, 2) == {"launch_bounds": (mv.LANE_THREADS, 2)}
    assert all(mv.rounds_ahead(f) == 1 for f in LANE_FORMATS.values())
    with pytest.raises(ValueError, match="1 or 2 units ahead"):
        mv.lane_body(q6_x8, rounds=True, ahead=3)


def test_rounds_launch_balances_the_rounds_and_widens_past_two_blocks_an_sm():
    """The fewest blocks that take as few rounds as the widest grid allows; the wide kernel only
    where the blocks pass two an SM (the 30B shapes on the simulator's 128 SMs)."""
    q6, iq3 = BY_LANE_NAME["Q6_K"], BY_LANE_NAME["IQ3_S"]
    q4_x8 = x8_format(BY_LANE_NAME["Q4_K"].ggml_type)
    assert mv.LANE_GRID_BLOCKS is None and mv.lane_grid_blocks() == 256  # the simulator: 128 SMs
    assert mv.WIDE_ROUNDS[("Q6_K", False)] == 3
    assert mv.rounds_launch(q6, 9496) == (380, 3)   # the 151,936-row head: 25 rounds
    assert mv.rounds_launch(q4_x8, 9496) == (380, 3)
    assert mv.rounds_launch(q6, 512) == (256, 0)    # 8192 x 8192: two rounds either way
    assert mv.rounds_launch(q6, 300) == (300, 3)    # one round, wide
    assert mv.rounds_launch(iq3, 9496) == (250, 0)  # not wide: 38 rounds at most 256 blocks
    assert mv.rounds_launch(iq3, 257) == (129, 0)
    assert mv.rounds_launch(BY_LANE_NAME["Q4_K"], 9496) == (250, 0)  # float32 x: not wide


def test_rounds_grid_follows_the_devices_sms(monkeypatch):
    """Unless LANE_GRID_BLOCKS is set, the rounds' cap is two blocks an SM of the device: the
    head's 9,496 blocks of row pairs in 36 rounds of 264 on 132 SMs (not 38 of 250 with 14 SMs
    holding one block), 58 of 164 on 82; a set cap wins."""
    iq3, q6 = BY_LANE_NAME["IQ3_S"], BY_LANE_NAME["Q6_K"]
    for n_sm, want in ((132, (264, 0)), (82, (164, 0)), (128, (250, 0))):
        monkeypatch.setattr(mv, "device_sms", lambda n_sm=n_sm: n_sm)
        assert mv.lane_grid_blocks() == 2 * n_sm
        assert mv.rounds_launch(iq3, 9496) == want
    monkeypatch.setattr(mv, "device_sms", lambda: 132)
    assert mv.rounds_launch(q6, 9496) == (396, 3)    # three blocks an SM: 24 rounds
    monkeypatch.setattr(mv, "LANE_GRID_BLOCKS", 256)
    assert mv.lane_grid_blocks() == 256 and mv.rounds_launch(iq3, 9496) == (250, 0)


def test_wide_rounds_kernel_has_its_own_name():
    """The binary's bundle keys a kernel by its name and code, not its launch bounds."""
    q6 = BY_LANE_NAME["Q6_K"]
    plain = mv._lanes_single(q6, rounds=True).py_func
    wide = mv._lanes_single(q6, rounds=True, min_blocks=3).py_func
    assert wide.__qualname__ == plain.__qualname__ + "_wide3"


def test_formats_without_rounds_keep_a_warp_a_pair(monkeypatch):
    """IQ4_XS on float32 x (matvec.NO_ROUNDS) launches its one-pair kernel on any grid: the
    rounds kernel is never built for it, and the sums still equal the reference. On 8-bit x it
    takes rounds (test_lane_matvec_in_rounds_equals_one_round)."""
    rng = np.random.default_rng(3)
    rows = random_rows("IQ4_XS", 21, 256, rng)
    x = rng.standard_normal(256).astype(np.float32)
    monkeypatch.setattr(mv, "LANE_GRID_BLOCKS", 1)
    monkeypatch.setattr(mv, "LANE_X8", False)
    assert not mv.has_rounds(BY_LANE_NAME["IQ4_XS"])
    y = np.full(21, np.nan, np.float32)
    mv.matvec(rows, "IQ4_XS", x, y)
    assert _rel(y, reference("IQ4_XS", rows, 256) @ x.astype(np.float64)) < 1e-5
    assert not [k for k in mv._CACHE if k[0] == BY_LANE_NAME["IQ4_XS"].ggml_type
                and "rounds" in k and not k[2]]
