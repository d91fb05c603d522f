"""Random valid blocks and quantized rows: validity, magnitude, determinism, input checks.

Magnitudes are read back through gguf-py's dequantizer, not through Strata's."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

from strata.quant.random_blocks import quantize_rows, random_blocks
from strata.quant.types import SUPPORTED_NAMES, quant_type

ALL = list(SUPPORTED_NAMES)
QUANTIZABLE = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"]


def values_of(raw: np.ndarray, name: str) -> np.ndarray:
    return np.asarray(gguf_quants.dequantize(raw, T[name]), dtype=np.float64).reshape(-1)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("scale", [0.02, 3.0])
def test_random_blocks_are_finite_with_the_requested_spread(name, scale):
    q = quant_type(name)
    n_blocks = max(64, 8192 // q.block_size)
    raw = random_blocks(name, n_blocks, np.random.default_rng(1), scale=scale)
    assert raw.shape == (n_blocks, q.block_bytes) and raw.dtype == np.uint8
    v = values_of(raw, name)
    assert np.all(np.isfinite(v))
    assert scale / 1.5 < v.std() < scale * 1.5, v.std()
    assert abs(v.mean()) < 0.2 * scale
    assert np.count_nonzero(v) > 0.5 * v.size  # not a block of zeros with a right-looking std


@pytest.mark.parametrize("name", ["Q4_K", "IQ2_XXS", "F16"])
def test_random_blocks_are_deterministic_per_generator(name):
    a = random_blocks(name, 16, np.random.default_rng(9))
    b = random_blocks(name, 16, np.random.default_rng(9))
    c = random_blocks(name, 16, np.random.default_rng(10))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_random_blocks_bad_input():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="unknown GGML tensor type 4242"):
        random_blocks(4242, 1, rng)
    with pytest.raises(ValueError, match="TQ1_0.*no Strata decoder"):
        random_blocks("TQ1_0", 1, rng)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale must be a positive finite number"):
            random_blocks("Q8_0", 1, rng, scale=bad)
    with pytest.raises(ValueError, match="n_blocks must be >= 0, got -1"):
        random_blocks("Q8_0", -1, rng)
    with pytest.raises(ValueError, match="Q8_0: scale 1e\\+09 needs an fp16 scale field"):
        random_blocks("Q8_0", 1, rng, scale=1e9)
    assert random_blocks("Q4_K", 0, rng).shape == (0, 144)


@pytest.mark.parametrize("name", QUANTIZABLE)
def test_quantize_rows_uses_gguf_where_it_can(name):
    rng = np.random.default_rng(2)
    values = rng.standard_normal((3, 64)).astype(np.float32)  # [3, 64] f32
    got = quantize_rows(values, name, rng)
    want = np.ascontiguousarray(gguf_quants.quantize(values, T[name])).view(np.uint8)
    np.testing.assert_array_equal(got, want.reshape(3, -1))
    assert got.shape == (3, quant_type(name).row_bytes(64))


@pytest.mark.parametrize("name", sorted(set(ALL) - set(QUANTIZABLE)))
def test_quantize_rows_elsewhere_matches_each_rows_spread(name):
    rng = np.random.default_rng(3)
    row_stds = np.array([0.01, 0.1, 2.0])
    values = (rng.standard_normal((3, 2048)) * row_stds[:, None]).astype(np.float32)
    raw = quantize_rows(values, name, rng)
    assert raw.shape == (3, quant_type(name).row_bytes(2048))
    got = values_of(raw, name).reshape(3, 2048)
    ratio = got.std(axis=1) / values.std(axis=1)
    assert np.all((ratio > 1 / 1.5) & (ratio < 1.5)), ratio
    flat = quantize_rows(values[0], name, rng)  # 1-D in, 1-D out
    assert flat.shape == (quant_type(name).row_bytes(2048),)


def test_quantize_rows_bad_input():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="Q4_K: a row of 100 values is not a whole number of "
                                         "256-value blocks"):
        quantize_rows(np.zeros((2, 100), np.float32), "Q4_K", rng)
    with pytest.raises(ValueError, match=r"values must be 1-D or 2-D rows, got shape \(1, 1, 32\)"):
        quantize_rows(np.zeros((1, 1, 32), np.float32), "Q8_0", rng)
    with pytest.raises(ValueError, match="Q6_K: values must be finite"):
        quantize_rows(np.full((1, 256), np.nan, np.float32), "Q6_K", rng)
