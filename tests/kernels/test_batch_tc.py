"""The tensor-core small-batch matvec (`batch_tc`) in the simulator: every token against gguf-py's
dequantization in float64 (partial row tiles, several warps a row, Q6_K super-blocks at 2-byte
offsets), batch invariance (a token's row does not depend on the batch), x with a wide range
(the hi/lo f16 split), and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import own_random_rows, random_rows, reference
from strata.cuda_kernels import batch_tc as tc


def _rel(got, want):
    return np.linalg.norm(got - want) / np.linalg.norm(want)


# (format, n_rows, n_cols, n_tok): 19 rows = a full and a partial 16-row tile; 512 columns =
# 2 super-blocks (2 warps); Q6_K 210-byte blocks put odd super-blocks at 2-byte offsets
CASES = [("Q4_K", 19, 512, 3), ("Q6_K", 19, 512, 2), ("Q6_K", 5, 256, 8)]


@pytest.mark.parametrize("name,n_rows,n_cols,n_tok", CASES)
def test_tc_matvec_against_float64(name, n_rows, n_cols, n_tok):
    rng = np.random.default_rng(n_rows * n_cols + n_tok)
    rows = own_random_rows(name, n_rows, n_cols, rng)
    x = rng.standard_normal((n_tok, n_cols)).astype(np.float32)
    y = np.full((n_tok, n_rows), np.nan, np.float32)
    tc.matvec_tc(rows.reshape(-1), name, x, y)
    want = x.astype(np.float64) @ reference(name, rows, n_cols).T
    assert np.isfinite(y).all()
    assert _rel(y, want) < 2e-6
    assert np.abs(y - want).max() <= 1e-5 * np.abs(want).max()


def test_a_tokens_row_does_not_depend_on_the_batch():
    rng = np.random.default_rng(5)
    rows = random_rows("Q4_K", 16, 256, rng)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    y3 = np.full((3, 16), np.nan, np.float32)
    tc.matvec_tc(rows.reshape(-1), "Q4_K", x, y3)
    for t in (0, 2):
        y1 = np.full((1, 16), np.nan, np.float32)
        tc.matvec_tc(rows.reshape(-1), "Q4_K", x[t:t + 1].copy(), y1)
        np.testing.assert_array_equal(y1[0], y3[t])


def test_wide_range_x_keeps_float32_accuracy():
    """x from 1e-3 to 3e3 in one row: f16 alone would lose ~3 decimal digits; hi + lo do not."""
    rng = np.random.default_rng(6)
    rows = random_rows("Q6_K", 16, 256, rng)
    mag = 10.0 ** rng.uniform(-3, 3.5, (2, 256))
    x = (mag * rng.choice([-1.0, 1.0], (2, 256))).astype(np.float32)
    y = np.full((2, 16), np.nan, np.float32)
    tc.matvec_tc(rows.reshape(-1), "Q6_K", x, y)
    want = x.astype(np.float64) @ reference("Q6_K", rows, 256).T
    assert _rel(y, want) < 2e-6


def test_tc_fits_and_refusals():
    z = np.zeros
    assert tc.tc_fits("Q4_K", 2048) and tc.tc_fits("Q6_K", 256)
    assert not tc.tc_fits("Q8_0", 2048) and not tc.tc_fits("Q4_K", 320)
    w = z(3 * 144, np.uint8)
    with pytest.raises(ValueError, match="1..8"):
        tc.matvec_tc(w, "Q4_K", z((9, 256), np.float32), z((9, 3), np.float32))
    with pytest.raises(ValueError, match="n_tok"):
        tc.matvec_tc(w, "Q4_K", z((2, 256), np.float32), z((3, 3), np.float32))
    with pytest.raises(ValueError, match="needs"):
        tc.matvec_tc(w[:100], "Q4_K", z((2, 256), np.float32), z((2, 3), np.float32))
    with pytest.raises(ValueError, match="multiple of 256"):
        tc.matvec_tc(w, "Q8_0", z((2, 256), np.float32), z((2, 3), np.float32))
    with pytest.raises(ValueError, match="multiple of 256"):
        tc.matvec_tc(w, "Q4_K", z((2, 320), np.float32), z((2, 3), np.float32))
    with pytest.raises(ValueError, match="dtype"):
        tc.matvec_tc(w, "Q4_K", z((2, 256), np.float64), z((2, 3), np.float32))


def test_registered_for_the_compile_check_and_the_bundle():
    from strata.cuda_kernels import compile_bundle  # noqa: F401  (registers the "bundle" family)
    from strata.cuda_kernels.compile_check import MODULES
    from strata.cuda_kernels.launch import PTX_CHECKS

    assert tc.__name__ in MODULES
    for family in ("batch", "bundle"):
        names = {c.name for c in PTX_CHECKS if c.family == family}
        assert {"matvec_tc_Q4_K", "matvec_tc_Q6_K"} <= names, family
