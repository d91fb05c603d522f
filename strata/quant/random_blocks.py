"""Random but valid GGML blocks of a chosen magnitude, and rows quantized for synthetic models.

A block of any supported format is random bits except its float scale fields: those are set so
that every value is finite and the dequantized values have roughly the requested standard
deviation and a mean near zero. How the random integer fields spread the values is measured once
per format (gguf-py's dequantizer over a fixed random sample), not derived by hand.

Everything is vectorised numpy: the synthesizer writes tens of GB of weights this way.
"""

from __future__ import annotations

import functools

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from strata.quant.blocks import FLOAT_VALUE_DECODERS, block_decoder
from strata.quant.types import QuantType, quant_type

# Byte offsets of each format's fp16 scale fields: (multiplier fields "d", offset fields
# "m"/"dmin"). Every value is linear in these: x = d * X + m * Y for random-bit-dependent X, Y.
_F16_FIELDS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "Q8_0": ((0,), ()), "Q4_0": ((0,), ()), "Q4_1": ((0,), (2,)),
    "Q5_0": ((0,), ()), "Q5_1": ((0,), (2,)),
    "Q2_K": ((80,), (82,)), "Q3_K": ((108,), ()), "Q4_K": ((0,), (2,)), "Q5_K": ((0,), (2,)),
    "Q6_K": ((208,), ()),
    "IQ4_NL": ((0,), ()), "IQ4_XS": ((0,), ()), "IQ3_S": ((0,), ()), "IQ3_XXS": ((0,), ()),
    "IQ2_XXS": ((0,), ()), "IQ2_XS": ((0,), ()), "IQ2_S": ((0,), ()),
}
_E8M0_FIELD = {"MXFP4": 0}  # byte offset of the power-of-two shared scale

# Types gguf-py can quantize from float values (gguf 0.19).
_GGUF_QUANTIZES = frozenset({"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                             "MXFP4"})

_N_CALIBRATION_BLOCKS = 512
_F16_MAX = 65504.0


def _check_type(ggml_type: int | str) -> QuantType:
    q = quant_type(ggml_type)
    block_decoder(q.ggml_type)  # ValueError for a type Strata does not support
    return q


def _random_bytes(rng: np.random.Generator, n_bytes: int) -> np.ndarray:
    # The raw 64-bit stream is ~10x faster than Generator.integers(dtype=uint8).
    words = rng.bit_generator.random_raw((n_bytes + 7) // 8)  # [n_words] u64
    return words.view(np.uint8)[:n_bytes]  # [n_bytes] u8


@functools.cache
def _calibration(name: str) -> tuple[float, float]:
    """(m_ratio, unit_std): with d = k and m = m_ratio * k the values have mean ~0 and standard
    deviation ~k * unit_std. Measured with gguf-py's dequantizer on fixed random blocks."""
    q = quant_type(name)
    d_offs, m_offs = _F16_FIELDS[name]
    rng = np.random.default_rng(0x51A7A)
    raw = _random_bytes(rng, _N_CALIBRATION_BLOCKS * q.block_bytes).reshape(-1, q.block_bytes)
    one, zero = (np.array([v], dtype=np.float16).view(np.uint8) for v in (1.0, 0.0))  # [2] u8

    def values(d_bytes, m_bytes):
        blocks = raw.copy()
        for o in d_offs:
            blocks[:, o:o + 2] = d_bytes
        for o in m_offs:
            blocks[:, o:o + 2] = m_bytes
        return gguf_quants.dequantize(blocks, GGMLQuantizationType(q.ggml_type)).astype(np.float64)

    x = values(one, zero)
    if not m_offs:
        return 0.0, float(x.std())
    y = values(zero, one)
    m_ratio = -x.mean() / y.mean()
    return float(m_ratio), float((x + m_ratio * y).std())


def _fp16_bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).astype("<f2").view("<u2")


def _fill_f16_scales(blocks: np.ndarray, name: str, scale, rng) -> None:
    """Set the fp16 fields; `scale` is one number or one per block ([n_blocks] f64)."""
    d_offs, m_offs = _F16_FIELDS[name]
    m_ratio, unit_std = _calibration(name)
    k = np.asarray(scale, dtype=np.float64) / unit_std
    if np.any(k * max(1.0, abs(m_ratio)) > _F16_MAX):
        raise ValueError(f"{name}: scale {np.max(scale):g} needs an fp16 scale field past "
                         f"{_F16_MAX:g}")
    # A random sign per block (d and m flip together) keeps the mean at zero over blocks; it is
    # flipped in the fp16 bits, so a uniform scale is converted once, not per block.
    sign = (_random_bytes(rng, len(blocks)) & 1).astype("<u2") << 15  # [n_blocks] u16
    d = (_fp16_bits(k) ^ sign).view(np.uint8).reshape(-1, 2)  # [n_blocks, 2] u8
    m = (_fp16_bits(k * m_ratio) ^ sign).view(np.uint8).reshape(-1, 2)
    for o in d_offs:
        blocks[:, o:o + 2] = d
    for o in m_offs:
        blocks[:, o:o + 2] = m


def _fill_e8m0_scale(blocks: np.ndarray, name: str, scale) -> None:
    # E8M0 byte e >= 2 scales the doubled E2M1 values by 2**(e - 128); their std is ~5.4.
    unit_std = float(np.std(gguf_quants.MXFP4.kvalues))
    with np.errstate(divide="ignore"):
        e = np.rint(np.log2(np.asarray(scale, dtype=np.float64) / unit_std)) + 128
    blocks[:, _E8M0_FIELD[name]] = np.clip(e, 2, 254).astype(np.uint8)


def _random_quant_blocks(q: QuantType, n_blocks: int, scale, rng) -> np.ndarray:
    blocks = _random_bytes(rng, n_blocks * q.block_bytes).reshape(n_blocks, q.block_bytes)
    if q.name in _E8M0_FIELD:
        _fill_e8m0_scale(blocks, q.name, scale)
    else:
        _fill_f16_scales(blocks, q.name, scale, rng)
    return blocks  # [n_blocks, block_bytes] u8


def _uniform(rng: np.random.Generator, n_values: int, scale: float) -> np.ndarray:
    """n_values uniform on [-sqrt(3), sqrt(3)) * scale (mean 0, std scale) from raw random bits:
    several times faster than normal samples, and a weight's distribution does not matter."""
    bits = _random_bytes(rng, 4 * n_values).view("<u4")  # [n_values] u32
    np.right_shift(bits, 8, out=bits)  # 24 random bits: exact in float32
    out = np.empty(n_values, dtype=np.float32)  # [n_values] f32
    np.copyto(out, bits, casting="unsafe")
    # In place: a fresh array per step costs a page fault per 4 KiB, which dominates here.
    out *= np.float32(2.0 ** -24)
    out -= np.float32(0.5)
    out *= np.float32(2.0 * np.sqrt(3.0) * scale)
    return out


def _check_scale(scale: float) -> float:
    scale = float(scale)
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    return scale


def random_blocks(ggml_type: int | str, n_blocks: int, rng: np.random.Generator, *,
                  scale: float = 0.02) -> np.ndarray:
    """`n_blocks` random valid blocks: [n_blocks, block_bytes] uint8 (GGML geometry: a float
    type's block is one value).

    Dequantized, the values are finite with mean ~0 and standard deviation ~`scale` (within a
    small factor: the random sub-scales of K- and i-quants spread it). Float types hold uniform
    samples of that deviation.
    """
    q = _check_type(ggml_type)
    scale = _check_scale(scale)
    if n_blocks < 0:
        raise ValueError(f"n_blocks must be >= 0, got {n_blocks}")
    if q.ggml_type in FLOAT_VALUE_DECODERS:
        values = _uniform(rng, n_blocks, scale)  # [n_blocks] f32: one value per block
        return quantize_rows(values, q.ggml_type, rng).reshape(n_blocks, q.block_bytes)
    return _random_quant_blocks(q, n_blocks, scale, rng)


def quantize_rows(values: np.ndarray, ggml_type: int | str,
                  rng: np.random.Generator) -> np.ndarray:
    """Rows of float values in a GGML format: [n_rows, row_len] -> [n_rows, row_bytes] uint8
    (1-D in, 1-D out).

    Where gguf-py can quantize the type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4) the
    bytes are its quantization of `values`. Otherwise they are random valid blocks (`rng`) whose
    values have each row's standard deviation: the weights are then whatever `dequantize` says,
    not `values` — enough for synthetic models, which only need plausible magnitudes.
    """
    q = _check_type(ggml_type)
    values = np.asarray(values, dtype=np.float32)
    if values.ndim not in (1, 2):
        raise ValueError(f"{q.name}: values must be 1-D or 2-D rows, got shape {values.shape}")
    rows = values.reshape(-1, values.shape[-1])  # [n_rows, row_len] f32
    row_bytes = q.row_bytes(rows.shape[1])  # ValueError unless whole blocks
    if q.name in _GGUF_QUANTIZES:
        raw = gguf_quants.quantize(rows, GGMLQuantizationType(q.ggml_type))
        out = np.ascontiguousarray(raw).view(np.uint8).reshape(rows.shape[0], row_bytes)
    else:
        if not np.all(np.isfinite(rows)):
            raise ValueError(f"{q.name}: values must be finite")
        n_per_row = rows.shape[1] // q.block_size
        scale = np.repeat(rows.std(axis=1, dtype=np.float64), n_per_row)  # [n_blocks] f64
        out = _random_quant_blocks(q, len(scale), scale, rng).reshape(rows.shape[0], row_bytes)
    return out.reshape(row_bytes) if values.ndim == 1 else out
