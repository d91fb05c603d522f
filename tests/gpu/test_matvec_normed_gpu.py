"""The RMSNorm-fused lane matvec on a real GPU at the 30B attention shapes (n_embd 2048; q 4096
rows, k and v 512 each) against a float64 RMSNorm and gguf-py's dequantization, outputs poisoned
(NaN) before the run: q, k, v all Q4_K, all Q6_K, and the Q4_K_M split (q, k Q4_K | v Q6_K) in
one launch of the mixed kernel (`matvec_mixed`), also bit for bit against the per-format launches.

    STRATA_TEST_GPU=1 python -m pytest -n0 tests/gpu/test_matvec_normed_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import dots_x8, random_rows, reference, x_seen

pytestmark = pytest.mark.gpu
N_EMBD = 2048
ROWS = {"q": 4096, "k": 512, "v": 512}
EPS = 1e-6
TOL = 1e-4  # f32 accumulation over 2048 columns


def _rel(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _fmt_bytes(rows, fmts, fmt) -> int:
    """Weight bytes of format fmt in one layer's q, k, v: what its part of the launch reads."""
    return sum(r.nbytes for r, f in zip(rows, fmts) if f == fmt)


def _layer(fmts):
    """A residual x (fresh random, never zeros), norm weights, the float64 normed x, and q, k,
    v rows in `fmts` with their float64 matrices."""
    rng = np.random.default_rng()
    x = (rng.standard_normal(N_EMBD) * 5.0).astype(np.float32)
    nw = rng.uniform(0.2, 2.0, N_EMBD).astype(np.float32)
    x64 = x.astype(np.float64)
    want_xn = x64 / np.sqrt(np.mean(x64 * x64) + EPS) * nw.astype(np.float64)
    rows = [random_rows(fmt, ROWS[name], N_EMBD, rng) for name, fmt in zip(ROWS, fmts)]
    return x, nw, want_xn, rows, [reference(f, r, N_EMBD) for f, r in zip(fmts, rows)]


@pytest.mark.parametrize("fmts", [("Q4_K", "Q4_K", "Q4_K"), ("Q6_K", "Q6_K", "Q6_K"),
                                  ("Q4_K", "Q4_K", "Q6_K")])
def test_matvec_normed_30b_attention_shapes(fmts):
    from numba import cuda

    from strata.cuda_kernels.matvec import matvec
    from strata.cuda_kernels.matvec_normed import matvec_normed, normed_groups

    x, nw, want_xn, rows, refs = _layer(fmts)
    mats = [(cuda.to_device(r), fmt, cuda.to_device(np.full(ROWS[name], np.nan, np.float32)))
            for r, fmt, name in zip(rows, fmts, ROWS)]
    groups = normed_groups(mats, N_EMBD)
    assert len(groups) == 1  # one format, or Q4_K_M's mixed pair
    d_x, d_nw = cuda.to_device(x), cuda.to_device(nw)
    d_xn = cuda.to_device(np.full(N_EMBD, np.nan, np.float32))
    for i, g in enumerate(groups):
        matvec_normed(d_x, d_nw, EPS, g, normed_out=d_xn if i == 0 else None)
    xn = d_xn.copy_to_host()
    assert _rel(xn, want_xn) < 1e-6
    for (w, fmt, y), wmat, r in zip(mats, refs, rows):
        # 8-bit x (`lanes_x8`): the kernel's own normed vector, quantized as the CPU engine does;
        # whether a format dots it follows its weight bytes in the launch (`matvec.x8_pays`)
        x8 = dots_x8(fmt, _fmt_bytes(rows, fmts, fmt))
        ref = wmat @ (x_seen(xn, True) if x8 else want_xn)
        got = y.copy_to_host()
        assert np.isfinite(got).all(), f"{fmt} [{got.size}]: unwritten outputs"
        assert _rel(got, ref) < TOL, f"{fmt} [{got.size}]: relative error {_rel(got, ref):.2e}"
        # the plain kernel on the normed vector block 0 wrote: the same matrix product, to
        # float32 rounding where it dots the same x (its own bytes can fall under the floor:
        # all-Q6_K q alone is 6.9 MB, the launch's three 8.6 MB)
        plain = cuda.to_device(np.full(got.size, np.nan, np.float32))
        matvec(w, fmt, d_xn, plain)
        if dots_x8(fmt, r.nbytes) == x8:
            np.testing.assert_allclose(got, plain.copy_to_host(), rtol=1e-4,
                                       atol=1e-5 * float(np.abs(got).max()))
        else:
            want_plain = wmat @ (x_seen(xn, True) if not x8 else want_xn)
            assert _rel(plain.copy_to_host(), want_plain) < TOL


@pytest.mark.parametrize("x8,grid_cap", [(True, None), (False, None), (True, 1024)])
def test_mixed_q4_k_m_layer_in_one_launch(x8, grid_cap, monkeypatch):
    """q 4096 and k 512 rows Q4_K, v 512 rows Q6_K, 2048 columns, in one launch of the mixed
    kernel (rounds at the default grid cap; grid_cap 1024: a warp a row pair): against float64
    (q, k with 8-bit x: of the kernel's normed vector as the CPU engine quantizes it; v: of the
    normed vector), and the same bits as the Q4_K launch of q, k plus the Q6_K launch of v."""
    from numba import cuda

    import strata.cuda_kernels.matvec as mv
    import strata.cuda_kernels.matvec_mixed as mm
    from strata.cuda_kernels.matvec_normed import matvec_normed
    from strata.cuda_kernels.qformats import get_format

    monkeypatch.setattr(mv, "LANE_X8", x8)
    if grid_cap is not None:
        monkeypatch.setattr(mv, "LANE_GRID_BLOCKS", grid_cap)
    fmts = ("Q4_K", "Q4_K", "Q6_K")
    x, nw, want_xn, rows, refs = _layer(fmts)
    ws = [cuda.to_device(r) for r in rows]
    d_x, d_nw = cuda.to_device(x), cuda.to_device(nw)

    def launch(groups):
        ys = [cuda.to_device(np.full(ROWS[n], np.nan, np.float32)) for n in ROWS]
        d_xn = cuda.to_device(np.full(N_EMBD, np.nan, np.float32))
        for i, g in enumerate(groups):
            matvec_normed(d_x, d_nw, EPS, [(ws[j], fmts[j], ys[j]) for j in g],
                          normed_out=d_xn if i == 0 else None)
        cuda.synchronize()
        return [y.copy_to_host() for y in ys], d_xn.copy_to_host()

    got, xn = launch([(0, 1, 2)])
    rounds = grid_cap is None  # 288 Q4_K blocks and 64 Q6_K ones past the cap of 256
    t4, t6 = (get_format(f).ggml_type for f in ("Q4_K", "Q6_K"))
    assert (t4, x8, t6, False, rounds) in mm._CACHE  # the mixed kernel ran
    assert _rel(xn, want_xn) < 1e-6
    for y, wmat, fmt in zip(got, refs, fmts):
        ref = wmat @ (x_seen(xn, True) if dots_x8(fmt, _fmt_bytes(rows, fmts, fmt)) else want_xn)
        assert np.isfinite(y).all(), f"{fmt} [{y.size}]: unwritten outputs"
        assert _rel(y, ref) < TOL, f"{fmt} [{y.size}]: relative error {_rel(y, ref):.2e}"
    apart, xn_apart = launch([(0, 1), (2,)])
    np.testing.assert_array_equal(xn, xn_apart)
    for y, y_apart, fmt in zip(got, apart, fmts):
        np.testing.assert_array_equal(y, y_apart, err_msg=f"{fmt} [{y.size}]")
