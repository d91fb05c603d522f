"""Each block decoder against gguf-py's dequantizer, block by block, plus the registry."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

from strata.quant import blocks
from strata.quant.blocks import (
    BLOCK_DECODERS, FLOAT_GROUP, FLOAT_VALUE_DECODERS, block_decoder, decode_block, decode_blocks,
)
from strata.quant.types import SUPPORTED_NAMES, quant_type

ALL = list(SUPPORTED_NAMES)
FLOATS = ["F32", "F16", "BF16"]


def reference(raw: np.ndarray, name: str) -> np.ndarray:
    """gguf-py's values for whole blocks of `raw` (random bits may make NaN/inf scales)."""
    with np.errstate(all="ignore"):
        return np.asarray(gguf_quants.dequantize(raw, T[name]), dtype=np.float32).reshape(-1)


def random_bits(name: str, n_blocks: int, seed: int) -> np.ndarray:
    """Whole decoder blocks of uniformly random bytes: every bit pattern, scales included."""
    _, block_bytes, _ = block_decoder(name)
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, n_blocks * block_bytes, dtype=np.uint8)  # [n_bytes] u8


def test_registry_covers_exactly_the_supported_types():
    assert sorted(quant_type(t).name for t in BLOCK_DECODERS) == sorted(SUPPORTED_NAMES)
    for name in ALL:
        decode = getattr(blocks, f"decode_{name.lower()}")
        assert BLOCK_DECODERS[int(T[name])] is decode
        assert block_decoder(name).decode is decode


@pytest.mark.parametrize("name", ALL)
def test_block_geometry(name):
    q = quant_type(name)
    bs, bb, _ = block_decoder(int(T[name]))
    if name in FLOATS:
        assert (bs, bb) == (FLOAT_GROUP, FLOAT_GROUP * q.block_bytes)
    else:
        assert (bs, bb) == (q.block_size, q.block_bytes)


@pytest.mark.parametrize("name", ALL)
def test_single_block_decoder_matches_gguf(name):
    bs, bb, decode = block_decoder(name)
    raw = random_bits(name, 3, seed=len(name))
    want = reference(raw, name)
    dst = np.full(bs * 5, 7.0, dtype=np.float32)  # [5 * bs] f32, sentinel-filled
    # Blocks at unaligned byte offsets (1 + k * bb) land at arbitrary value offsets.
    src = np.concatenate([np.zeros(1, np.uint8), raw])
    for k, at in enumerate((2 * bs, 0, 4 * bs)):
        decode(src, 1 + k * bb, dst, at)
        np.testing.assert_array_equal(dst[at:at + bs], want[k * bs:(k + 1) * bs])
    np.testing.assert_array_equal(dst[bs:2 * bs], 7.0)  # nothing written outside the blocks
    np.testing.assert_array_equal(dst[3 * bs:4 * bs], 7.0)


@pytest.mark.parametrize("name", ALL)
def test_runtime_typed_decoders_match_gguf(name):
    bs, bb, _ = block_decoder(name)
    raw = random_bits(name, 4, seed=100 + len(name))
    want = reference(raw, name)
    many = np.zeros(4 * bs, np.float32)
    decode_blocks(int(T[name]), raw, 0, many, 0, 4)
    np.testing.assert_array_equal(many, want)
    one = np.zeros(bs, np.float32)
    decode_block(int(T[name]), raw, 2 * bb, one, 0)
    np.testing.assert_array_equal(one, want[2 * bs:3 * bs])


@pytest.mark.parametrize("name", FLOATS)
def test_float_value_decoders_take_any_count(name):
    q = quant_type(name)
    raw = random_bits(name, 1, seed=7)[:11 * q.block_bytes]  # 11 values: not a whole group
    dst = np.zeros(11, np.float32)
    FLOAT_VALUE_DECODERS[int(T[name])](raw, 0, dst, 0, 11)
    np.testing.assert_array_equal(dst, reference(raw, name))


def test_fp16_special_values_decode_like_numpy():
    halves = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 6.1e-5, 6e-8, -6e-8, np.inf, -np.inf, np.nan],
                      dtype=np.float16)
    raw = np.zeros(64, np.uint8)
    raw[:halves.nbytes] = halves.view(np.uint8)
    dst = np.zeros(32, np.float32)
    blocks.decode_f16(raw, 0, dst, 0)
    want = halves.astype(np.float32)
    np.testing.assert_array_equal(dst[:len(want)], want)
    assert np.signbit(dst[1])  # -0.0 keeps its sign


def test_unknown_and_unsupported_types_are_refused():
    with pytest.raises(ValueError, match="unknown GGML tensor type 999"):
        block_decoder(999)
    with pytest.raises(ValueError, match="Q8_K.*no Strata decoder"):
        block_decoder("Q8_K")
    with pytest.raises(ValueError, match="unsupported GGML type"):
        decode_blocks(int(T.Q8_K), np.zeros(300, np.uint8), 0, np.zeros(256, np.float32), 0, 1)
