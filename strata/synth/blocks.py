"""Random valid GGML blocks of a chosen value spread, and pools that stream them fast.

A block is random bits with its fp16 scale fields set: any bits are a valid block of these
formats, and the scale decides the magnitude. The dequantized standard deviation per unit of
scale is measured once per type (through gguf-py), so a tensor asks for the spread it wants.

Writing a 100 GB model cannot afford fresh random numbers for every byte (numpy makes ~2 GB/s on
one core, less than a fast disk), so large tensors are cut from a pool of blocks made once per
(type, spread): each piece is a window starting at a random block, so no two tensors, experts or
rows read the same bytes at the same offset.
"""

from __future__ import annotations

import functools

import numpy as np
from gguf import GGMLQuantizationType, quants

from strata.quant.types import quant_type

# type -> (byte offset of the scale `d`, offset of a second field or -1, that field / d)
_SCALE_FIELDS: dict[str, tuple[int, int, float]] = {
    "Q8_0": (0, -1, 0.0), "Q4_0": (0, -1, 0.0), "Q5_0": (0, -1, 0.0),
    "Q4_1": (0, 2, -7.5), "Q5_1": (0, 2, -15.5),  # min centres the unsigned quants
    "Q4_K": (0, 2, 7.5), "Q5_K": (0, 2, 15.5),  # dmin, with each min set equal to its scale
    "Q6_K": (208, -1, 0.0), "IQ4_NL": (0, -1, 0.0), "IQ4_XS": (0, -1, 0.0),
    "IQ3_S": (0, -1, 0.0),
}
BLOCK_TYPES = ("F32", "F16", *_SCALE_FIELDS)
POOL_BYTES_MAX = 32 << 20
SCALE_JITTER = 0.25  # log-normal spread of block scales around the tensor's scale


def _center_k_mins(blocks: np.ndarray) -> None:
    """Q4_K / Q5_K: copy each sub-block's 6-bit scale into its min, so that with
    dmin = d * (levels - 1) / 2 every sub-block is symmetric around zero."""
    sc = blocks[:, 4:16]
    sc[:, 4:8] = sc[:, 0:4]
    low = sc[:, 8:12] & 0x0F
    sc[:, 8:12] = low | (low << 4)


def _raw_blocks(type_name: str, n_blocks: int, rng: np.random.Generator,
                scale: float) -> np.ndarray:
    q = quant_type(type_name)
    n_words = -(-n_blocks * q.block_bytes // 8)
    blocks = rng.bit_generator.random_raw(n_words).view(np.uint8)[:n_blocks * q.block_bytes]
    blocks = blocks.reshape(n_blocks, q.block_bytes)
    d_off, m_off, m_ratio = _SCALE_FIELDS[type_name]
    d = (scale * np.exp(SCALE_JITTER * rng.standard_normal(n_blocks))).astype(np.float16)
    blocks[:, d_off:d_off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    if type_name in ("Q4_K", "Q5_K"):
        _center_k_mins(blocks)
    if m_off >= 0:
        m = (d.astype(np.float32) * m_ratio).astype(np.float16)
        blocks[:, m_off:m_off + 2] = m.view(np.uint8).reshape(n_blocks, 2)
    return blocks


@functools.lru_cache(maxsize=None)
def unit_std(type_name: str) -> float:
    """Dequantized standard deviation of this module's blocks made with scale 1."""
    blocks = _raw_blocks(type_name, 2048, np.random.default_rng(12345), 1.0)
    return float(quants.dequantize(blocks, GGMLQuantizationType[type_name]).std())


def random_blocks(type_name: str, n_blocks: int, rng: np.random.Generator, *,
                  std: float) -> np.ndarray:
    """`n_blocks` random valid blocks whose values have about `std` spread:
    [n_blocks, block_bytes] uint8 (for F32 / F16, one value per 'block')."""
    if type_name in ("F32", "F16"):
        vals = rng.standard_normal(n_blocks, dtype=np.float32) * np.float32(std)
        dt = np.float32 if type_name == "F32" else np.float16
        return vals.astype(dt).view(np.uint8).reshape(n_blocks, -1)
    if type_name not in _SCALE_FIELDS:
        raise ValueError(f"no random block generator for {type_name} "
                         f"(available: {', '.join(BLOCK_TYPES)})")
    return _raw_blocks(type_name, n_blocks, rng, std / unit_std(type_name))


class BlockPool:
    """Blocks of one (type, spread), made once; `window` hands out random runs of them."""

    def __init__(self, type_name: str, std: float, n_blocks: int, rng: np.random.Generator):
        self.type_name = type_name
        self.blocks = random_blocks(type_name, n_blocks, rng, std=std)  # [n_blocks, block_bytes]
        self.rng = rng

    @property
    def n_blocks(self) -> int:
        return self.blocks.shape[0]

    def window(self, n: int) -> np.ndarray:
        """`n` consecutive blocks from a random start: a view, [n, block_bytes] uint8."""
        if n > self.n_blocks:
            raise ValueError(f"window of {n} blocks from a pool of {self.n_blocks}")
        start = int(self.rng.integers(0, self.n_blocks - n + 1))
        return self.blocks[start:start + n]


def pool_blocks_for(type_name: str, largest_tensor_bytes: int) -> int:
    """Pool size (blocks) for tensors up to `largest_tensor_bytes`: twice the largest, so that
    windows of a whole small tensor still start at many places, capped at `POOL_BYTES_MAX`."""
    q = quant_type(type_name)
    want = min(POOL_BYTES_MAX, 2 * largest_tensor_bytes)
    return max(2, want // q.block_bytes)
