"""Every format's device decoders (dq32, dot32) against gguf-py's dequantize, in the simulator."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from helpers.kernel_blocks import own_random_rows as random_rows, reference, stored
from strata.cuda_kernels.qformats import BY_NAME, FORMATS, get_format, specialize

N_ROWS = 2


def _dq_factory(fmt):
    dq32 = fmt.dq32

    @cuda.jit
    def k(src, row_bytes, n_groups, out):  # out: [n_rows, n_cols] f32
        t = cuda.grid(1)
        r = t // n_groups
        if r < out.shape[0]:
            j = t % n_groups
            dq32(src, r * row_bytes, j, out[r], j * 32)
    return k


def _dot_factory(fmt):
    dot32 = fmt.dot32

    @cuda.jit
    def k(src, row_bytes, n_groups, x, out):  # out: [n_rows, n_groups] f32
        t = cuda.grid(1)
        r = t // n_groups
        if r < out.shape[0]:
            j = t % n_groups
            out[r, j] = dot32(src, r * row_bytes, j, x, j * 32)
    return k


dq_kernel = specialize(_dq_factory)
dot_kernel = specialize(_dot_factory)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_dq32_and_dot32_match_gguf(name):
    fmt = BY_NAME[name]
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    n_cols = max(fmt.block_values, 64)
    rows = random_rows(fmt.ggml_type, N_ROWS, n_cols, rng)
    ref = reference(fmt.ggml_type, rows, n_cols)
    n_groups = n_cols // 32
    src = stored(name, rows)  # a planar format's layout (`strata.quant.planar`)

    out = np.full((N_ROWS, n_cols), np.nan, dtype=np.float32)
    dq_kernel(name)[1, N_ROWS * n_groups](src, rows.shape[1], n_groups, out)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())

    x = rng.standard_normal(n_cols).astype(np.float32)
    dots = np.full((N_ROWS, n_groups), np.nan, dtype=np.float32)
    dot_kernel(name)[1, N_ROWS * n_groups](src, rows.shape[1], n_groups, x, dots)
    want = (ref * x).reshape(N_ROWS, n_groups, 32).sum(-1)
    scale = np.abs(ref).reshape(N_ROWS, n_groups, 32).max(-1) * np.abs(x).max() * 32
    assert np.all(np.abs(dots - want) <= 1e-5 * scale + 1e-30), (dots, want)


def test_f16_activations_give_the_same_dot():
    fmt = BY_NAME["Q4_K"]
    rng = np.random.default_rng(7)
    rows = random_rows(fmt.ggml_type, 1, 256, rng)
    ref = reference(fmt.ggml_type, rows, 256)
    x = rng.standard_normal(256).astype(np.float16)
    dots = np.full((1, 8), np.nan, dtype=np.float32)
    dot_kernel("Q4_K")[1, 8](rows.reshape(-1).copy(), rows.shape[1], 8, x, dots)
    want = (ref * x.astype(np.float64)).reshape(1, 8, 32).sum(-1)
    np.testing.assert_allclose(dots, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_table_geometry_matches_gguf():
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from strata.quant import planar
    from strata.quant.types import SUPPORTED_NAMES
    planars = {p.name for p in planar.BY_TYPE.values()}
    assert sorted(BY_NAME) == sorted(SUPPORTED_NAMES + tuple(planars))
    for t, f in FORMATS.items():
        base = GGMLQuantizationType(planar.base_type(t))
        assert GGML_QUANT_SIZES[base] == (f.block_values, f.block_bytes)
        assert (f.name in planars) == (base != t)
    assert get_format("q4_k").row_bytes(4096) == 16 * 144


def test_unsupported_type_and_bad_row_are_refused():
    with pytest.raises(ValueError, match="IQ1_S"):
        get_format("IQ1_S")
    with pytest.raises(ValueError, match="not a whole number"):
        get_format("Q4_K").row_bytes(100)
