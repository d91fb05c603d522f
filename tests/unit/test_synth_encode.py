"""Encoders and random blocks of the synthesizer, read back with gguf-py's dequantizer."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from strata.quant.types import quant_type
from strata.synth.blocks import BLOCK_TYPES, BlockPool, random_blocks
from strata.synth.encode import ENCODABLE, encode_rows

# relative RMS error of round-to-nearest on Gaussian rows, with margin
TOLERANCE = {"F32": 1e-7, "F16": 1e-3, "BF16": 1e-2, "Q8_0": 0.02, "Q5_0": 0.07, "Q5_1": 0.07,
             "Q4_0": 0.13, "Q4_1": 0.13, "IQ4_NL": 0.12, "IQ4_XS": 0.12, "Q4_K": 0.12,
             "Q6_K": 0.04, "IQ3_S": 0.22}


def _back(raw: np.ndarray, t: str) -> np.ndarray:
    return np.asarray(dequantize(raw, GGMLQuantizationType[t]), np.float64)


@pytest.mark.parametrize("t", ENCODABLE)
def test_encode_reads_back_close(t):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((12, 512)).astype(np.float32)  # [rows, row_len]
    x[3] *= 50  # rows of very different scale
    x[4, :40] = 0  # a run of zeros
    raw = encode_rows(x, t)
    assert raw.shape == (12, quant_type(t).row_bytes(512))
    y = _back(raw, t).reshape(x.shape)
    err = np.sqrt(((y - x) ** 2).mean(axis=1)) / x.std(axis=1)
    assert np.all(err < TOLERANCE[t]), err
    clear = np.abs(x) > 0.5 * x.std(axis=1, keepdims=True)  # well away from zero
    assert np.all(np.sign(y[clear]) == np.sign(x[clear]))


@pytest.mark.parametrize("t", ["Q4_K", "Q6_K", "IQ4_XS", "IQ3_S", "IQ4_NL"])
def test_encode_zero_rows_and_one_hot(t):
    x = np.zeros((2, 256), np.float32)
    x[1, 77] = -3.0
    y = _back(encode_rows(x, t), t).reshape(x.shape)
    assert np.all(y[0] == 0)
    assert np.abs(y[1]).argmax() == 77 and -3.3 < y[1, 77] < -2.4  # the grids are coarse
    assert np.abs(np.delete(y[1], 77)).max() < 0.25


def test_encode_refuses_bad_rows():
    with pytest.raises(ValueError, match="whole 256-value blocks"):
        encode_rows(np.ones((1, 96), np.float32), "Q4_K")
    with pytest.raises(ValueError, match="cannot encode"):
        encode_rows(np.ones((1, 256), np.float32), "Q5_K")


@pytest.mark.parametrize("t", BLOCK_TYPES)
def test_random_blocks_have_the_asked_spread(t):
    blocks = random_blocks(t, 2048, np.random.default_rng(3), std=0.05)
    assert blocks.shape == (2048, quant_type(t).block_bytes)
    v = _back(blocks.reshape(-1), t)
    assert np.isfinite(v).all()
    assert 0.04 < v.std() < 0.06
    assert abs(v.mean()) < 0.25 * v.std()


def test_pool_windows_start_at_different_blocks():
    pool = BlockPool("Q4_K", 0.02, 64, np.random.default_rng(0))
    windows = [pool.window(8) for _ in range(6)]
    starts = {int((w.__array_interface__["data"][0] -
                   pool.blocks.__array_interface__["data"][0]) // pool.blocks.shape[1])
              for w in windows}
    assert len(starts) > 1 and all(0 <= s <= 56 for s in starts)
    with pytest.raises(ValueError, match="window of 65 blocks"):
        pool.window(65)
