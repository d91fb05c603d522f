"""The mixed-format normed lane matvec (`matvec_mixed`: q, k of one format and v of another in one
launch, a Q4_K_M layer's Q4_K | Q6_K) against a float64 numpy RMSNorm and gguf-py's
dequantization, and bit for bit against the per-format launches it replaces.

Each block runs its own format's single-format kernel, so an output of a format that dots 8-bit x
(`lanes_x8`: Q4_K and Q6_K) is held, as there, to float64 of the kernel's normed vector quantized
as the CPU engine quantizes it, and one on float32 x (Q5_K) to float64 of the normed vector
itself."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import dots_x8, random_rows, reference, x_seen
from strata.cuda_kernels import matvec as mv
from strata.cuda_kernels import matvec_mixed as mm
from strata.cuda_kernels.lanes import lane_format
from strata.cuda_kernels.matvec_normed import matvec_normed, normed_groups
from strata.cuda_kernels.qformats import BY_NAME

EPS = 1e-6


def _rmsnorm64(x, w):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64) + EPS) * w.astype(np.float64)


def _rel(got, want):
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def _problem(fmts, rows_each, n_cols, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n_cols) * 7.0).astype(np.float32)  # a deep layer's scale
    nw = rng.uniform(0.2, 2.0, n_cols).astype(np.float32)
    ws = [random_rows(f, n, n_cols, rng) for f, n in zip(fmts, rows_each)]
    refs = [reference(f, w, n_cols) for f, w in zip(fmts, ws)]
    return x, nw, ws, refs


def _launch(x, nw, fmts, ws, rows_each, *, groups=None, normed_out=True):
    """Outputs (NaN-poisoned first) and the normed vector of one matvec_normed call per group of
    mats indices (default: all in one)."""
    ys = [np.full(n, np.nan, np.float32) for n in rows_each]
    xn = np.full(x.shape[0], np.nan, np.float32)
    for i, g in enumerate(groups or [range(len(fmts))]):
        matvec_normed(x, nw, EPS, [(ws[j], fmts[j], ys[j]) for j in g],
                      normed_out=xn if normed_out and i == 0 else None)
    return ys, xn


def _fmt_bytes(ws, fmts, fmt) -> int:
    return sum(w.nbytes for w, f in zip(ws, fmts) if f == fmt)


def _check_float64(ys, xn, x, nw, fmts, refs, ws):
    assert _rel(xn, _rmsnorm64(x, nw)) < 1e-6
    for y, ref, f in zip(ys, refs, fmts):
        seen = x_seen(xn, True) if dots_x8(f, _fmt_bytes(ws, fmts, f)) else _rmsnorm64(x, nw)
        assert np.isfinite(y).all(), f
        assert _rel(y, ref @ seen) < 1e-5, f


# (formats of q, k, v; their rows; columns): odd counts, a part of one matrix and of two, the
# second format first in mats, Q5_K_M's split
CASES = [
    (("Q4_K", "Q4_K", "Q6_K"), (7, 5, 9), 512),
    (("Q4_K", "Q6_K", "Q6_K"), (3, 5, 2), 256),
    (("Q6_K", "Q4_K", "Q4_K"), (5, 1, 4), 256),
    (("Q5_K", "Q5_K", "Q6_K"), (6, 3, 3), 256),
    (("Q4_K", "Q6_K"), (4, 3), 768),
]


@pytest.mark.parametrize("fmts,rows_each,n_cols", CASES)
def test_mixed_against_float64_and_the_per_format_launches(fmts, rows_each, n_cols):
    x, nw, ws, refs = _problem(fmts, rows_each, n_cols, sum(rows_each) * 7 + n_cols)
    mats = [(w, f, np.zeros(n, np.float32)) for w, f, n in zip(ws, fmts, rows_each)]
    assert len(normed_groups(mats, n_cols)) == 1  # one launch
    ys, xn = _launch(x, nw, fmts, ws, rows_each)
    _check_float64(ys, xn, x, nw, fmts, refs, ws)
    by_fmt = {}
    for i, f in enumerate(fmts):
        by_fmt.setdefault(f, []).append(i)
    apart, xn_apart = _launch(x, nw, fmts, ws, rows_each, groups=list(by_fmt.values()))
    np.testing.assert_array_equal(xn, xn_apart)
    for y, y_apart in zip(ys, apart):
        np.testing.assert_array_equal(y, y_apart)  # the same bits, format by format


def test_mixed_with_float32_x_everywhere(monkeypatch):
    """LANE_X8 off (an A/B switch): Q4_K's blocks stage float32 x too, held to float64 of the
    normed vector, still the per-format launches' bits."""
    monkeypatch.setattr(mv, "LANE_X8", False)
    fmts, rows_each, n_cols = ("Q4_K", "Q4_K", "Q6_K"), (5, 3, 3), 256
    x, nw, ws, refs = _problem(fmts, rows_each, n_cols, 11)
    ys, xn = _launch(x, nw, fmts, ws, rows_each)
    assert not dots_x8("Q4_K", _fmt_bytes(ws, fmts, "Q4_K"))
    _check_float64(ys, xn, x, nw, fmts, refs, ws)
    apart, _ = _launch(x, nw, fmts, ws, rows_each, groups=[(0, 1), (2,)])
    for y, y_apart in zip(ys, apart):
        np.testing.assert_array_equal(y, y_apart)
    assert (BY_NAME["Q4_K"].ggml_type, False, BY_NAME["Q6_K"].ggml_type, False, False) \
        in mm._CACHE


def test_mixed_in_rounds(monkeypatch):
    """A grid cap of 2 blocks: each format's one block goes through all its row pairs in rounds
    (Q4_K 9 + 8 pairs over 8 warps, Q6_K 6 pairs over 8 warps), with the full grid's bits; no
    normed_out: nothing else is written."""
    fmts, rows_each, n_cols = ("Q4_K", "Q4_K", "Q6_K"), (17, 15, 11), 256
    x, nw, ws, refs = _problem(fmts, rows_each, n_cols, 3)
    full, xn = _launch(x, nw, fmts, ws, rows_each)
    monkeypatch.setattr(mv, "LANE_GRID_BLOCKS", 2)
    rounds, xn_none = _launch(x, nw, fmts, ws, rows_each, normed_out=False)
    assert np.isnan(xn_none).all()
    assert (BY_NAME["Q4_K"].ggml_type, dots_x8("Q4_K", _fmt_bytes(ws, fmts, "Q4_K")),
            BY_NAME["Q6_K"].ggml_type, dots_x8("Q6_K", _fmt_bytes(ws, fmts, "Q6_K")), True) \
        in mm._CACHE
    _check_float64(rounds, xn, x, nw, fmts, refs, ws)
    for y, y_full in zip(rounds, full):
        np.testing.assert_array_equal(y, y_full)


def test_split_blocks():
    # the 30B's q, k (Q4_K, 2304 row pairs: 288 blocks) and v (Q6_K, 2 warps a pair: 64)
    assert mm.split_blocks(288, 64, 256) == (209, 47, True)
    assert mm.split_blocks(200, 56, 256) == (200, 56, False)
    assert mm.split_blocks(1000, 1, 256) == (255, 1, True)
    assert mm.split_blocks(1, 1000, 256) == (1, 255, True)
    assert mm.split_blocks(3, 3, 2) == (1, 1, True)
    assert mm.split_blocks(3, 3, 1) == (1, 1, True)  # each format keeps a block


def test_normed_groups_take_the_mixed_pairs_only():
    y = np.zeros(2, np.float32)
    q, k = ("wq", "Q4_K", y), ("wk", "Q4_K", y)
    v6, v8, iq = ("wv", "Q6_K", y), ("wv", "Q8_0", y), ("wv", "IQ4_XS", y)
    assert normed_groups([q, k, v6], 2048) == [[q, k, v6]]
    assert normed_groups([q, k, iq], 2048) == [[q, k], [iq]]         # IQ mixes: per format
    assert normed_groups([q, k, v8], 2048) == [[q, k], [v8]]         # no kernel for the pair
    assert normed_groups([q, ("wk", "Q6_K", y), v8], 2048) == [[q], [("wk", "Q6_K", y)], [v8]]
    assert mm.mixed_pair(BY_NAME["Q6_K"].ggml_type, BY_NAME["Q4_K"].ggml_type) == (
        BY_NAME["Q4_K"].ggml_type, BY_NAME["Q6_K"].ggml_type)


def test_mixed_launch_refuses_what_it_cannot_take():
    n_cols = 256
    x = np.zeros(n_cols, np.float32)
    nw = np.ones(n_cols, np.float32)
    y = np.zeros(4, np.float32)
    w4, w6 = np.zeros(4 * 144, np.uint8), np.zeros(4 * 210, np.uint8)
    w8, wiq = np.zeros(4 * 8 * 34, np.uint8), np.zeros(4 * 136, np.uint8)
    with pytest.raises(ValueError, match=r"mixed formats \['Q4_K', 'Q8_0'\] have no mixed"):
        matvec_normed(x, nw, EPS, [(w4, "Q4_K", y), (w8, "Q8_0", y)])
    with pytest.raises(ValueError, match="one format or two"):
        matvec_normed(x, nw, EPS, [(w4, "Q4_K", y), (w6, "Q6_K", y), (w8, "Q8_0", y)])
    with pytest.raises(ValueError, match=r"mats\[1\] w: 840 bytes, Q6_K \[5, 256\] needs 1050"):
        matvec_normed(x, nw, EPS, [(w4, "Q4_K", y), (w6, "Q6_K", np.zeros(5, np.float32))])
    norm = (nw, EPS, x[:0])
    lf4, lf6 = (lane_format(BY_NAME[n].ggml_type) for n in ("Q4_K", "Q6_K"))
    lfiq = lane_format(BY_NAME["IQ4_XS"].ggml_type)
    with pytest.raises(ValueError, match=r"no mixed lane kernel for Q4_K \+ IQ4_XS"):
        mm.launch_mixed_normed(lf4, lfiq, x, [(w4, y, 4)], [(wiq, y, 4)], n_cols, 0, norm=norm)
    with pytest.raises(ValueError, match="no mixed lane kernel for Q4_K \\+ Q4_K"):
        mm.launch_mixed_normed(lf4, lf4, x, [(w4, y, 4)], [(w4, y, 4)], n_cols, 0, norm=norm)
    with pytest.raises(ValueError, match="1..2 of each, 3 in all"):
        mm.launch_mixed_normed(lf4, lf6, x, [(w4, y, 4)] * 3, [(w6, y, 4)], n_cols, 0, norm=norm)
    with pytest.raises(ValueError, match="1..2 of each"):
        mm.launch_mixed_normed(lf4, lf6, x, [], [(w6, y, 4)], n_cols, 0, norm=norm)
    with pytest.raises(ValueError, match="whole, stageable Q4_K rows"):
        mm.launch_mixed_normed(lf4, lf6, x[:128], [(w4, y, 4)], [(w6, y, 4)], 128, 0,
                               norm=norm)


@pytest.mark.parametrize("x8,cap", [(True, None), (False, None), (True, 2)])
def test_mixed_launches_are_in_the_aot_registry(x8, cap, monkeypatch):
    """The frozen binary runs only bundled kernels: each mixed launch (8-bit x or not, rounds or
    not) is a registered specialization (test_aot_coverage's models store v as Q8_0, the
    8-expert recipe, so their layers never take the mixed kernel)."""
    from helpers.kernel_record import record_launches, registered
    monkeypatch.setattr(mv, "LANE_X8", x8)
    if cap is not None:
        monkeypatch.setattr(mv, "LANE_GRID_BLOCKS", cap)
    fmts, rows_each, n_cols = ("Q4_K", "Q4_K", "Q6_K"), (17, 3, 9), 256
    x, nw, ws, _ = _problem(fmts, rows_each, n_cols, 1)
    with record_launches(run=lambda name: False) as seen:
        _launch(x, nw, fmts, ws, rows_each)
    assert [n.rsplit(".", 1)[-1] for n in seen.values()] == ["matvec_lanes_mixed"]
    assert set(seen) <= registered()
