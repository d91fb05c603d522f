"""Little-endian scalar fields read straight from a block's bytes (njit helpers).

Every decoder reads its bytes and scales through these, from a `uint8[::1]` buffer at a byte
offset, so blocks need no alignment and no array views are made inside the hot loops.

Indices are converted to unsigned (`U`) before indexing: numba wraps negative signed indices
around, and that per-access check keeps LLVM from vectorizing the decode loops (about 3x slower).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.quant.tables import F16_REBIAS

U = np.uintp  # index conversion: see the module docstring


@njit(cache=True)
def byte(src, i):
    """The byte at index i (i >= 0), as an int."""
    return np.int64(src[U(i)])


@njit(cache=True)
def sbyte(src, i):
    """The byte at index i read as a signed int8, as an int."""
    return np.int64(np.int8(src[U(i)]))


@njit(cache=True)
def u16_at(src, off):
    """The little-endian uint16 at byte `off`, as an int."""
    return byte(src, off) | (byte(src, off + 1) << 8)


@njit(cache=True)
def u32_at(src, off):
    """The little-endian uint32 at byte `off`, as an int."""
    return (byte(src, off) | (byte(src, off + 1) << 8)
            | (byte(src, off + 2) << 16) | (byte(src, off + 3) << 24))


@njit(cache=True)
def f16_bits_to_f32(h):
    """An IEEE half (bits in an int) as float32, exactly as numpy's float16 -> float32."""
    bits = (h & 0x7FFF) << 13
    if bits >= 0x0F800000:  # exponent 31: infinity or NaN keeps its payload
        f = np.uint32(bits | 0x7F800000).view(np.float32)
    else:  # normal or subnormal: one exact power-of-two multiply re-biases the exponent
        f = np.uint32(bits).view(np.float32) * F16_REBIAS
    if h & 0x8000:
        f = -f
    return f


@njit(cache=True)
def f16_at(src, off):
    """The fp16 at byte `off`, as float32."""
    return f16_bits_to_f32(u16_at(src, off))


@njit(cache=True)
def bf16_at(src, off):
    """The bfloat16 at byte `off`, as float32 (its bits are the top half of an fp32)."""
    return np.uint32(u16_at(src, off) << 16).view(np.float32)


@njit(cache=True)
def f32_at(src, off):
    """The float32 at byte `off`."""
    return np.uint32(u32_at(src, off)).view(np.float32)


@njit(cache=True)
def e8m0_half_at(src, off):
    """MXFP4's shared scale byte (a power of two, E8M0) as float32, halved to pair with the
    doubled E2M1 table. Exponents 0 and 1 land in the fp32 subnormal range."""
    e = byte(src, off)
    if e < 2:
        bits = 0x00200000 << e
    else:
        bits = (e - 1) << 23
    return np.uint32(bits).view(np.float32)

