"""The float-row matvec (F32/F16 weights, 1..8 tokens) against a float64 product of gguf-py's
dequantization, its batch invariance, and its argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import own_random_rows, reference
from strata.cuda_kernels.matvec import matvec
from strata.cuda_kernels.matvec_f32 import matvec_float, n_warps

N_ROWS = 5  # a block per row: any count, here odd


def _rel(got, want):
    return np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want)


def _case(name, n_rows, n_cols, n_tok, seed):
    """(w [n_rows, row_bytes] u8, its float64 values, x float32 [n_tok, n_cols]): random normal
    weights and inputs (never zero)."""
    rng = np.random.default_rng(seed)
    rows = own_random_rows(name, n_rows, n_cols, rng)
    x = rng.standard_normal((n_tok, n_cols)).astype(np.float32)
    return rows, reference(name, rows, n_cols), x


def _poisoned(*shape):
    return np.full(shape, np.nan, np.float32)


@pytest.mark.parametrize("name,n_cols,n_tok", [
    ("F32", 132, 1),   # 33 chunks: one warp, a partial step
    ("F32", 132, 3),
    ("F32", 2052, 2),  # 513 chunks: four warps, a second step holding one chunk
    ("F16", 136, 4),
    ("F16", 2056, 1),  # 257 chunks: three warps
])
def test_matches_float64_reference(name, n_cols, n_tok):
    """Through device arrays, as the engine calls it (1-D x and y for one token)."""
    from numba import cuda

    n_rows = N_ROWS if n_cols < 1000 else 3
    rows, ref, x = _case(name, n_rows, n_cols, n_tok, seed=n_cols + n_tok)
    y = cuda.to_device(_poisoned(n_tok, n_rows))
    w, xd = cuda.to_device(rows), cuda.to_device(x)
    if n_tok == 1:
        matvec_float(w, name, xd[0], y[0])
    else:
        matvec_float(w, name, xd, y)
    assert _rel(y.copy_to_host(), x.astype(np.float64) @ ref.T) < 1e-5


@pytest.mark.parametrize("name", ["F32", "F16"])
def test_a_tokens_result_does_not_depend_on_the_batch(name):
    """Bit-identical rows for a token alone and inside a batch of 5 (same summation order)."""
    n_cols = 1032  # 258 / 129 chunks: three / two warps
    rows, ref, x = _case(name, 3, n_cols, 5, seed=5)
    y5 = _poisoned(5, 3)
    matvec_float(rows, name, x, y5)
    for t in (0, 2, 4):
        y1 = _poisoned(3)
        matvec_float(rows, name, x[t], y1)
        assert np.array_equal(y1.view(np.uint32), y5[t].view(np.uint32)), (t, y1, y5[t])
    assert _rel(y5, x.astype(np.float64) @ ref.T) < 1e-5


@pytest.mark.parametrize("n_tok", [1, 3])
def test_accumulate_adds_into_y(n_tok):
    rows, ref, x = _case("F32", N_ROWS, 68, n_tok, seed=9)
    y0 = np.random.default_rng(1).standard_normal((n_tok, N_ROWS)).astype(np.float32)
    y = y0.copy()
    matvec_float(rows.reshape(-1), "F32", x, y, accumulate=True)
    assert _rel(y, y0 + x.astype(np.float64) @ ref.T) < 1e-5


@pytest.mark.parametrize("name", ["F32", "F16"])
def test_matvec_routes_float_weights_here(name):
    """`matvec` sends F32/F16 weights with float32 x to this kernel (132/136 columns: not whole
    32-value groups, which the generic kernels refuse), one token with accumulate and a batch;
    float16 x still takes the generic kernels."""
    n_cols = 132 if name == "F32" else 136
    rows, ref, x = _case(name, N_ROWS, n_cols, 2, seed=3)
    x64 = x.astype(np.float64)
    y0 = np.ones(N_ROWS, np.float32)
    y = y0.copy()
    matvec(rows, name, x[0], y, accumulate=True)
    assert _rel(y, y0 + ref @ x64[0]) < 1e-5
    y = _poisoned(2, N_ROWS)
    matvec(rows, name, x, y)
    assert _rel(y, x64 @ ref.T) < 1e-5
    rows, ref, x = _case(name, N_ROWS, 64, 1, seed=4)
    xh = x[0].astype(np.float16)
    y = _poisoned(N_ROWS)
    matvec(rows, name, xh, y)
    assert _rel(y, ref @ xh.astype(np.float64)) < 1e-5


def test_warps_follow_the_row_width_only():
    assert [n_warps(c) for c in (1, 128, 129, 384, 385, 512, 4096)] == [1, 1, 2, 3, 4, 4, 4]


def test_refuses_bad_arguments():
    w = np.zeros(N_ROWS * 4 * 64, np.uint8)
    x, y = np.zeros(64, np.float32), np.zeros(N_ROWS, np.float32)
    cases = [
        ("F32 or F16", dict(ggml_type="Q8_0")),
        ("x: dtype float16", dict(x=x.astype(np.float16))),
        ("x: dtype float64", dict(x=x.astype(np.float64))),
        (r"expected \[n_cols\]", dict(x=np.zeros((1, 1, 64), np.float32))),
        ("9 tokens", dict(x=np.zeros((9, 64), np.float32), y=np.zeros((9, N_ROWS), np.float32))),
        ("130 columns, F32 rows take a positive multiple of 4", dict(x=np.zeros(130, np.float32))),
        ("132 columns, F16 rows take a positive multiple of 8",
         dict(ggml_type="F16", x=np.zeros(132, np.float32))),
        ("0 columns", dict(x=np.zeros(0, np.float32))),
        ("y: dtype float16", dict(y=y.astype(np.float16))),
        ("does not match", dict(y=np.zeros((2, N_ROWS), np.float32))),
        ("does not match", dict(x=np.zeros((3, 64), np.float32), y=np.zeros((2, N_ROWS),
                                                                           np.float32))),
        (r"w: 1276 bytes, F32 \[5, 64\] needs 1280", dict(w=w[:-4])),
        ("w: dtype int8", dict(w=w.view(np.int8))),
        ("C-contiguous", dict(w=np.zeros(2 * w.size, np.uint8)[::2])),
    ]
    for match, change in cases:
        args = dict(w=w, ggml_type="F32", x=x, y=y) | change
        with pytest.raises(ValueError, match=match):
            matvec_float(args["w"], args["ggml_type"], args["x"], args["y"])
