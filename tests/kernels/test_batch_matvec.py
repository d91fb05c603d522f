"""The small-batch lane matvec (`lanes_batch`): every token's row dots against gguf-py's
dequantization in float64, each token's result equal to the one-token lane kernel's (the batch
does not change a token's arithmetic), token groups, the generic fallback, and bad shapes."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import random_rows, reference
from strata.cuda_kernels import lanes_batch as lb
from strata.cuda_kernels import matvec as mv
from strata.cuda_kernels.lanes import LANE_FORMATS

BY_NAME = {f.name: f for f in LANE_FORMATS.values()}


def _rel(got, want):
    return np.linalg.norm(got - want) / np.linalg.norm(want)


# (format, n_rows, n_cols, n_tok): a tail row pair, 2 warps per pair (Q6_K: 2 steps, log 1),
# Q8_0 rows at 2-byte boundaries, a table format
CASES = [("Q4_K", 3, 512, 3), ("Q6_K", 3, 2048, 2), ("Q8_0", 3, 96, 3), ("IQ4_XS", 3, 256, 2)]


@pytest.mark.parametrize("name,n_rows,n_cols,n_tok", CASES)
def test_batch_lane_matvec_against_float64_and_the_one_token_kernel(name, n_rows, n_cols, n_tok):
    rng = np.random.default_rng(n_rows * n_cols + n_tok)
    rows = random_rows(name, n_rows, n_cols, rng)
    x = rng.standard_normal((n_tok, n_cols)).astype(np.float32)
    y = np.full((n_tok, n_rows), np.nan, np.float32)
    lb.matvec_batch(rows, name, x, y)
    want = x.astype(np.float64) @ reference(name, rows, n_cols).T
    assert _rel(y, want) < 1e-5
    for t in range(n_tok):
        one = np.full(n_rows, np.nan, np.float32)
        mv.matvec(rows, name, x[t], one, x8=False)  # float32 x, as the batch kernels
        np.testing.assert_array_equal(y[t], one)
    tg = lb.tokens_per_block(BY_NAME[name], n_cols, n_tok)
    assert (BY_NAME[name].ggml_type, tg) in lb._CACHE  # the lane batch kernel ran


def test_tokens_split_into_groups_when_their_x_does_not_fit(monkeypatch):
    """Three tokens with room for two a block: two groups, the second holding one token."""
    lf = BY_NAME["Q8_0"]
    n_cols = 64
    monkeypatch.setattr(lb, "MAX_SHARED_BYTES",
                        lb._STATIC_BYTES + 4 * 2 * lb.token_floats(lf, n_cols) + 8)
    assert lb.tokens_fit(lf, n_cols) == 2 and lb.tokens_per_block(lf, n_cols, 3) == 2
    rng = np.random.default_rng(9)
    rows = random_rows("Q8_0", 2, n_cols, rng)
    x = rng.standard_normal((3, n_cols)).astype(np.float32)
    y = np.full((3, 2), np.nan, np.float32)
    lb.matvec_batch(rows, "Q8_0", x, y)
    want = x.astype(np.float64) @ reference("Q8_0", rows, n_cols).T
    assert _rel(y, want) < 1e-5


def test_tokens_per_block():
    lf = BY_NAME["Q4_K"]
    assert lb.token_floats(lf, 2048) == 2048 + 4 * 32 + 128
    assert lb.tokens_fit(lf, 2048) == 5 and lb.tokens_fit(lf, 4096) == 2
    assert [lb.tokens_per_block(lf, 2048, n) for n in (1, 2, 5, 6, 8)] == [1, 2, 5, 3, 4]
    assert lb.tokens_per_block(lf, 4096, 7) == 2
    assert not lb.lanes_batch_fits(lf.ggml_type, 11264)  # one token's x alone exceeds 48 KiB
    with pytest.raises(ValueError, match="exceed"):
        lb.tokens_per_block(lf, 11264, 1)


def test_formats_without_lanes_use_the_generic_batch_kernel():
    rng = np.random.default_rng(4)
    rows = random_rows("Q4_0", 3, 64, rng)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    y = np.full((2, 3), np.nan, np.float32)
    lb.matvec_batch(rows, "Q4_0", x, y)
    assert _rel(y, x.astype(np.float64) @ reference("Q4_0", rows, 64).T) < 1e-5


def test_batch_matvec_refuses_bad_shapes():
    z = np.zeros
    w = z(3 * 144, np.uint8)
    with pytest.raises(ValueError, match="1..8"):
        lb.matvec_batch(w, "Q4_K", z((9, 256), np.float32), z((9, 3), np.float32))
    with pytest.raises(ValueError, match="n_tok"):
        lb.matvec_batch(w, "Q4_K", z((2, 256), np.float32), z((3, 3), np.float32))
    with pytest.raises(ValueError, match="needs"):
        lb.matvec_batch(w[:100], "Q4_K", z((2, 256), np.float32), z((2, 3), np.float32))
    with pytest.raises(ValueError, match="dtype"):
        lb.matvec_batch(w, "Q4_K", z((2, 256), np.float64), z((2, 3), np.float32))



def test_the_engines_batch_kernels_are_registered_for_the_compile_check():
    """`compile_check` (CI: tests/kernels/test_ptx_compile.py) compiles the "batch" family for
    sm_90 through `batch_moe`'s import: the kernels the engine launches on the Q4_K_M mix at 8
    sequences are in it."""
    from strata.cuda_kernels import batch_moe
    from strata.cuda_kernels.compile_check import MODULES
    from strata.cuda_kernels.launch import PTX_CHECKS

    assert batch_moe.__name__ in MODULES   # importing it registers both lane modules
    names = {c.name for c in PTX_CHECKS if c.family == "batch"}
    assert {"matvec_lanes_batch_Q4_K_t4", "matvec_lanes_batch_Q4_K_t2",
            "matvec_lanes_batch_Q6_K_t4", "batch_gate_up_lanes_Q4_K_t4",
            "batch_down_lanes_Q4_K", "batch_down_lanes_Q6_K"} <= names
