"""Decoders of the plain float formats F32, F16 and BF16.

GGML stores these with a block of one value. One call per value would make the caller's loop pay a
call per value, so the common block signature decodes a group of `FLOAT_GROUP` (32) values, the
same granularity as Q8_0/Q4_0. A row whose length is not a multiple of 32 (rare: 1-D norm weights
of odd models) uses the `*_values` decoders, which take the count as a fifth argument.
"""

from __future__ import annotations

from numba import njit

from strata.quant.scalars import U, bf16_at, f16_at, f32_at

FLOAT_GROUP = 32  # values per "block" of a float format in the common decoder signature


@njit(cache=True)
def decode_f32_values(src, off, dst, dst_off, n_values):
    """Decode `n_values` float32 starting at byte `off` into `dst[dst_off:]`."""
    for i in range(n_values):
        dst[U(dst_off + i)] = f32_at(src, off + 4 * i)


@njit(cache=True)
def decode_f16_values(src, off, dst, dst_off, n_values):
    """Decode `n_values` fp16 starting at byte `off` into `dst[dst_off:]` as float32."""
    for i in range(n_values):
        dst[U(dst_off + i)] = f16_at(src, off + 2 * i)


@njit(cache=True)
def decode_bf16_values(src, off, dst, dst_off, n_values):
    """Decode `n_values` bf16 starting at byte `off` into `dst[dst_off:]` as float32."""
    for i in range(n_values):
        dst[U(dst_off + i)] = bf16_at(src, off + 2 * i)


@njit(cache=True)
def decode_f32(src, off, dst, dst_off):
    """32 float32 values (128 bytes) -> dst[dst_off:dst_off+32]."""
    decode_f32_values(src, off, dst, dst_off, FLOAT_GROUP)


@njit(cache=True)
def decode_f16(src, off, dst, dst_off):
    """32 fp16 values (64 bytes) -> dst[dst_off:dst_off+32]."""
    decode_f16_values(src, off, dst, dst_off, FLOAT_GROUP)


@njit(cache=True)
def decode_bf16(src, off, dst, dst_off):
    """32 bf16 values (64 bytes) -> dst[dst_off:dst_off+32]."""
    decode_bf16_values(src, off, dst, dst_off, FLOAT_GROUP)
