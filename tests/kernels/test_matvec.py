"""matvec kernels on quantized rows against a float64 product of gguf-py's dequantization."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import dots_x8, random_rows, reference, stored, x_seen
from strata.cuda_kernels.matvec import matvec
from strata.cuda_kernels.qformats import BY_NAME

N_ROWS = 5  # two blocks of 4 warps, the second one partly empty


def _weights(name, rng, n_cols=None):
    fmt = BY_NAME[name]
    n_cols = n_cols or max(fmt.block_values, 64)
    rows = random_rows(fmt.ggml_type, N_ROWS, n_cols, rng)
    return rows, reference(fmt.ggml_type, rows, n_cols), n_cols


def _rel(got, want):
    return np.linalg.norm(got - want) / np.linalg.norm(want)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_matvec_one_token_every_format(name):
    rng = np.random.default_rng(len(name) * 31 + 1)
    rows, ref, n_cols = _weights(name, rng)
    x = rng.standard_normal(n_cols).astype(np.float32)
    y = np.full(N_ROWS, np.nan, dtype=np.float32)
    matvec(stored(name, rows), name, x, y)
    # 8-bit x: exact but for rounding
    assert _rel(y, ref @ x_seen(x, dots_x8(name, rows.nbytes))) < 1e-5


@pytest.mark.parametrize("name,n_tok", [("Q4_K", 3), ("Q6_K", 8), ("IQ3_S", 2), ("Q8_0", 4)])
def test_matvec_small_batch(name, n_tok):
    rng = np.random.default_rng(n_tok)
    rows, ref, n_cols = _weights(name, rng, n_cols=512 if name == "Q8_0" else None)
    x = rng.standard_normal((n_tok, n_cols)).astype(np.float32)
    y = np.full((n_tok, N_ROWS), np.nan, dtype=np.float32)
    matvec(rows, name, x, y)
    assert _rel(y, x.astype(np.float64) @ ref.T) < 1e-5


def test_matvec_f16_activations():
    rng = np.random.default_rng(11)
    rows, ref, n_cols = _weights("IQ4_XS", rng)
    x = rng.standard_normal(n_cols).astype(np.float16)
    y = np.full(N_ROWS, np.nan, dtype=np.float32)
    matvec(rows, "IQ4_XS", x, y)
    assert _rel(y, ref @ x_seen(x.astype(np.float32), dots_x8("IQ4_XS", rows.nbytes))) < 1e-5


def test_matvec_refuses_bad_arguments():
    w = np.zeros(N_ROWS * 144, dtype=np.uint8)
    x = np.zeros(256, dtype=np.float32)
    with pytest.raises(ValueError, match="1..8"):
        matvec(w, "Q4_K", np.zeros((9, 256), np.float32), np.zeros((9, N_ROWS), np.float32))
    with pytest.raises(ValueError, match="does not match"):
        matvec(w, "Q4_K", x, np.zeros((2, N_ROWS), np.float32))
    with pytest.raises(ValueError, match="needs 864"):
        matvec(w, "Q4_K", x, np.zeros(6, np.float32))
    with pytest.raises(ValueError, match="dtype int32"):
        matvec(w, "Q4_K", x.astype(np.int32), np.zeros(N_ROWS, np.float32))


@pytest.mark.parametrize("n_tok,n_cols", [(1, 4096 + 256), (2, 1280)])
def test_matvec_spans_several_staged_column_tiles(n_tok, n_cols):
    rng = np.random.default_rng(n_cols)
    rows, ref, _ = _weights("Q4_K", rng, n_cols=n_cols)
    x = rng.standard_normal((n_tok, n_cols)).astype(np.float32)
    y = np.full((n_tok, N_ROWS), np.nan, dtype=np.float32)
    matvec(rows, "Q4_K", x[0] if n_tok == 1 else x, y[0] if n_tok == 1 else y)
    assert _rel(y, x_seen(x, n_tok == 1 and dots_x8("Q4_K", rows.nbytes)) @ ref.T) < 1e-5


@pytest.mark.parametrize("name", ["Q4_K", "IQ4_NL"])  # a lane kernel, a generic one
def test_matvec_accumulate_adds_into_y(name):
    rng = np.random.default_rng(7)
    rows, ref, n_cols = _weights(name, rng)
    x = rng.standard_normal(n_cols).astype(np.float32)
    y0 = rng.standard_normal(N_ROWS).astype(np.float32)
    y = y0.copy()
    matvec(rows, name, x, y, accumulate=True)
    want = y0 + ref @ x_seen(x, dots_x8(name, rows.nbytes))
    assert _rel(y, want) < 1e-5
    with pytest.raises(ValueError, match="one token"):
        matvec(rows, name, x[None], y[None], accumulate=True)


@pytest.mark.parametrize("name2,n_a", [("Q8_0", 4), ("Q8_0", 3), ("Q4_0", 4)])
def test_matvec_pair_equals_two_products(name2, n_a):
    """One launch over two matrices (same lane format, even rows), else two launches."""
    from strata.cuda_kernels.matvec import matvec_pair

    rng = np.random.default_rng(n_a)
    n_cols = 64
    wa = random_rows(BY_NAME["Q8_0"].ggml_type, n_a, n_cols, rng)
    wb = random_rows(BY_NAME[name2].ggml_type, 6, n_cols, rng)
    x = rng.standard_normal(n_cols).astype(np.float32)
    ya, yb = np.full(n_a, np.nan, np.float32), np.full(6, np.nan, np.float32)
    matvec_pair(wa.reshape(-1), "Q8_0", wb.reshape(-1), name2, x, ya, yb)
    x64 = x.astype(np.float64)
    assert _rel(ya, reference(BY_NAME["Q8_0"].ggml_type, wa, n_cols) @ x64) < 1e-5
    assert _rel(yb, reference(BY_NAME[name2].ggml_type, wb, n_cols) @ x64) < 1e-5
