"""RMSNorm fused into the lane matvec (one to three matrices of one format per launch) against a
float64 numpy RMSNorm and gguf-py's dequantization, and against rms_norm + matvec (two formats in
one launch: test_matvec_mixed)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import dots_x8, random_rows, reference, x_seen
from strata.cuda_kernels import matvec as mv
from strata.cuda_kernels.matvec_normed import (matvec_normed, normed_groups,
                                                normed_lane_format)
from strata.cuda_kernels.norm_rope import rms_norm
from strata.cuda_kernels.qformats import BY_NAME

EPS = 1e-6


def _rmsnorm64(x, w, eps=EPS):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64) + eps) * w.astype(np.float64)


def _rel(got, want):
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def _inputs(rng, n_cols):
    # a residual with a large scale (as a deep layer's is): the norm must really rescale it
    x = (rng.standard_normal(n_cols) * 7.0).astype(np.float32)
    w = rng.uniform(0.2, 2.0, n_cols).astype(np.float32)
    return x, w


def _mats(name, rows_each, n_cols, rng):
    t = BY_NAME[name].ggml_type
    out = []
    for n in rows_each:
        rows = random_rows(t, n, n_cols, rng)
        out.append((rows, reference(t, rows, n_cols)))
    return out


# (format, columns, rows per matrix): odd row counts and counts that leave a block's last row
# pairs empty; the matrices after an odd one start on the next row pair
CASES = [
    ("Q4_K", 256, (5,)),
    ("Q6_K", 256, (7, 3)),
    ("Q8_0", 1280, (4, 3, 5)),   # 320 quads: the sum of squares loops twice per thread
    ("Q4_K", 512, (6, 2, 3)),
    ("Q6_K", 256, (3, 4, 1)),
    ("IQ4_XS", 256, (5, 2)),
]


@pytest.mark.parametrize("name,n_cols,rows_each", CASES)
def test_matvec_normed_against_float64(name, n_cols, rows_each):
    rng = np.random.default_rng(n_cols + sum(rows_each) * 13 + len(name))
    x, nw = _inputs(rng, n_cols)
    mats = _mats(name, rows_each, n_cols, rng)
    ys = [np.full(n, np.nan, np.float32) for n in rows_each]
    xn = np.full(n_cols, np.nan, np.float32)
    matvec_normed(x, nw, EPS, [(w, name, y) for (w, _), y in zip(mats, ys)], normed_out=xn)
    want_xn = _rmsnorm64(x, nw)
    assert _rel(xn, want_xn) < 1e-6
    # 8-bit x: the kernel's own normed vector (checked above), quantized as the CPU engine does
    seen = x_seen(xn, True) if dots_x8(name, sum(w.nbytes for w, _ in mats)) else want_xn
    for (_, ref), y in zip(mats, ys):
        assert _rel(y, ref @ seen) < 1e-5


def test_matvec_normed_equals_rms_norm_then_matvec():
    """q, k, v of one format in one launch give what rms_norm + matvec + matvec_pair give."""
    rng = np.random.default_rng(5)
    n_cols, name = 256, "Q4_K"
    x, nw = _inputs(rng, n_cols)
    (wq, _), (wk, _), (wv, _) = _mats(name, (6, 4, 4), n_cols, rng)
    fused = [np.full(n, np.nan, np.float32) for n in (6, 4, 4)]
    xn_fused = np.full(n_cols, np.nan, np.float32)
    matvec_normed(x, nw, EPS, [(wq, name, fused[0]), (wk, name, fused[1]), (wv, name, fused[2])],
                  normed_out=xn_fused)
    xn = np.full((1, n_cols), np.nan, np.float32)
    rms_norm(x[None], nw, xn, eps=EPS)
    sep = [np.full(n, np.nan, np.float32) for n in (6, 4, 4)]
    mv.matvec(wq, name, xn[0], sep[0])
    mv.matvec_pair(wk, name, wv, name, xn[0], sep[1], sep[2])
    np.testing.assert_allclose(xn_fused, xn[0], rtol=2e-6, atol=1e-7)
    for a, b in zip(fused, sep):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


def test_normed_out_is_optional_and_plain_kernels_still_run():
    rng = np.random.default_rng(9)
    n_cols, name = 64, "Q8_0"
    x, nw = _inputs(rng, n_cols)
    (w, ref), = _mats(name, (3,), n_cols, rng)
    y = np.full(3, np.nan, np.float32)
    matvec_normed(x, nw, 1e-5, [(w, name, y)])
    assert _rel(y, ref @ _rmsnorm64(x, nw, 1e-5)) < 1e-5
    assert (BY_NAME[name].ggml_type, -1, False) in mv._CACHE  # the normed lane kernel ran
    y_plain = np.full(3, np.nan, np.float32)
    mv.matvec(w, name, x, y_plain)  # the plain lane kernel: raw x
    assert _rel(y_plain, ref @ x.astype(np.float64)) < 1e-5


def test_normed_groups_by_format():
    y = np.zeros(2, np.float32)
    q, k, v = ("wq", "Q4_K", y), ("wk", "Q4_K", y), ("wv", "Q6_K", y)
    assert normed_groups([q, k, v], 2048) == [[q, k, v]]  # a mixed pair (test_matvec_mixed)
    assert normed_groups([q, k, ("wv", "IQ4_XS", y)], 2048) == [[q, k], [("wv", "IQ4_XS", y)]]
    assert normed_groups([q, k, ("wv", "Q4_K", y)], 2048) == [[q, k, ("wv", "Q4_K", y)]]
    assert normed_groups([q, ("wk", "F16", y)], 2048) is None     # no lane decoding
    assert normed_groups([q], 300) is None                          # not whole super-blocks
    assert normed_lane_format("Q4_K", 1 << 16) is None              # too long to stage
    assert normed_lane_format("Q8_0", 64).name == "Q8_0"


def test_matvec_normed_refuses_bad_arguments():
    n_cols = 256
    x = np.zeros(n_cols, np.float32)
    nw = np.ones(n_cols, np.float32)
    w = np.zeros(4 * 144, np.uint8)
    y = np.zeros(4, np.float32)
    one = [(w, "Q4_K", y)]
    with pytest.raises(ValueError, match="mixed formats"):  # no mixed kernel for the pair
        matvec_normed(x, nw, EPS, [(w, "Q4_K", y), (np.zeros(4 * 136, np.uint8), "IQ4_XS", y)])
    with pytest.raises(ValueError, match="1..3"):
        matvec_normed(x, nw, EPS, one * 4)
    with pytest.raises(ValueError, match="1..3"):
        matvec_normed(x, nw, EPS, [])
    with pytest.raises(ValueError, match="no lane decoding"):
        matvec_normed(x, nw, EPS, [(w, "Q4_0", y)])
    with pytest.raises(ValueError, match="multiple of 256"):
        matvec_normed(x[:128], nw[:128], EPS, one)
    with pytest.raises(ValueError, match="do not fit"):
        big = np.zeros(1 << 16, np.float32)
        matvec_normed(big, big, EPS, one)
    with pytest.raises(ValueError, match=r"norm_w: shape \(128,\)"):
        matvec_normed(x, nw[:128], EPS, one)
    with pytest.raises(ValueError, match="x: dtype float16"):
        matvec_normed(x.astype(np.float16), nw, EPS, one)
    with pytest.raises(ValueError, match=r"normed_out: shape"):
        matvec_normed(x, nw, EPS, one, normed_out=np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="eps must be > 0"):
        matvec_normed(x, nw, 0.0, one)
    with pytest.raises(ValueError, match=r"mats\[0\] w: 576 bytes, Q4_K \[5, 256\] needs 720"):
        matvec_normed(x, nw, EPS, [(w, "Q4_K", np.zeros(5, np.float32))])
    with pytest.raises(ValueError, match=r"mats\[1\] y: no rows"):
        matvec_normed(x, nw, EPS, [(w, "Q4_K", y), (w, "Q4_K", y[:0])])
    with pytest.raises(ValueError, match=r"mats\[0\] y: dtype float64"):
        matvec_normed(x, nw, EPS, [(w, "Q4_K", y.astype(np.float64))])


def test_matvec_normed_in_rounds(monkeypatch):
    """Three matrices (odd rows) through a grid of one block: the warps go through the row
    pairs of all three in rounds, each written to its own output once, as with a full grid."""
    name, n_cols, rows_each = "Q4_K", 256, (9, 5, 7)   # 5 + 3 + 4 pairs over one block's 8 warps
    rng = np.random.default_rng(5)
    x, nw = _inputs(rng, n_cols)
    mats = _mats(name, rows_each, n_cols, rng)

    xn = np.full(n_cols, np.nan, np.float32)

    def run():
        ys = [np.full(n, np.nan, np.float32) for n in rows_each]
        matvec_normed(x, nw, EPS, [(w, name, y) for (w, _), y in zip(mats, ys)], normed_out=xn)
        return ys
    full = run()
    monkeypatch.setattr(mv, "LANE_GRID_BLOCKS", 1)
    rounds = run()
    assert _rel(xn, _rmsnorm64(x, nw)) < 1e-6
    seen = x_seen(xn, dots_x8(name, sum(w.nbytes for w, _ in mats)))  # the x it multiplies
    for (_, ref), y, y_full in zip(mats, rounds, full):
        assert np.array_equal(y, y_full)
        assert _rel(y, ref @ seen) < 1e-5
