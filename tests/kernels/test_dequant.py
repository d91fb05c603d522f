"""dequant kernels: every format to f32 (and f16 for a sample) against gguf-py, in the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import random_rows, reference, stored
from strata.cuda_kernels.dequant import dequantize
from strata.cuda_kernels.qformats import BY_NAME


def _case(name, n_rows, rng):
    fmt = BY_NAME[name]
    n_cols = max(fmt.block_values, 64)
    rows = random_rows(fmt.ggml_type, n_rows, n_cols, rng)
    return fmt, n_cols, rows, reference(fmt.ggml_type, rows, n_cols)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_dequant_f32_every_format(name):
    fmt, n_cols, rows, ref = _case(name, 3, np.random.default_rng(len(name) * 7919))
    out = np.full((3, n_cols), np.nan, dtype=np.float32)
    dequantize(stored(name, rows), fmt.ggml_type, out)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-7 * np.abs(ref).max())


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "IQ2_XS", "BF16"])
def test_dequant_f16(name):
    fmt, n_cols, rows, ref = _case(name, 2, np.random.default_rng(3))
    out = np.full((2, n_cols), np.nan, dtype=np.float16)
    dequantize(rows.reshape(-1), name, out)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())


def test_dequant_refuses_bad_arguments():
    rows = np.zeros((2, 144), dtype=np.uint8)
    with pytest.raises(ValueError, match="dtype float64"):
        dequantize(rows, "Q4_K", np.zeros((2, 256), dtype=np.float64))
    with pytest.raises(ValueError, match="needs 432"):
        dequantize(rows, "Q4_K", np.zeros((3, 256), dtype=np.float32))
    with pytest.raises(ValueError, match="not a whole number"):
        dequantize(rows, "Q4_K", np.zeros((1, 100), dtype=np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        dequantize(rows, "Q4_K", np.zeros((2, 512), dtype=np.float32)[:, ::2])
    with pytest.raises(ValueError, match="no device decoder"):
        dequantize(rows, "IQ1_M", np.zeros((2, 256), dtype=np.float32))
