"""Block decoders of every supported GGML format, with one signature, and their registry.

Every decoder is a numba `@njit(cache=True)` function

    decode_<fmt>(src, off, dst, dst_off) -> None

* `src`: uint8[::1], raw bytes (a row, a tensor, a whole mapped file: any C-contiguous buffer);
* `off`: byte offset of the block in `src`;
* `dst`: float32[::1];
* `dst_off`: index of the block's first value in `dst`;

and writes the block's `block_size` values to `dst[dst_off:dst_off + block_size]`. It allocates
nothing and checks no bounds: the caller guarantees `off + block_bytes <= len(src)` and
`dst_off + block_size <= len(dst)`. Call them from your own njit loops; pick one per type with
`block_decoder(ggml_type)` (block geometry included) or `BLOCK_DECODERS[ggml_type]`.
For a type known only at run time, `decode_block(ggml_type, src, off, dst, dst_off)` (one block)
and `decode_blocks(ggml_type, src, off, dst, dst_off, n_blocks)` (a run of blocks, switching on
the type once: ~3x faster per value) serve every type from one compiled function. numba's disk
cache cannot key functions generated per type (closures over a decoder), so a cached caller
should use these or name a decoder directly.

F32, F16 and BF16 are GGML blocks of one value; here their "block" is a group of 32 values
(`FLOAT_GROUP`), so `block_decoder` reports (32, 32 * value bytes). For float rows whose length is
not a multiple of 32 use `FLOAT_VALUE_DECODERS[t](src, off, dst, dst_off, n_values)`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gguf import GGMLQuantizationType as _T
from numba import njit

from strata.quant.decode_float import (
    FLOAT_GROUP, decode_bf16, decode_bf16_values, decode_f16, decode_f16_values, decode_f32,
    decode_f32_values,
)
from strata.quant.decode_iq import (
    decode_iq2_s, decode_iq2_xs, decode_iq2_xxs, decode_iq3_s, decode_iq3_xxs, decode_iq4_xs,
)
from strata.quant.decode_k import decode_q2_k, decode_q3_k, decode_q4_k, decode_q5_k, decode_q6_k
from strata.quant.decode_q import (
    decode_iq4_nl, decode_mxfp4, decode_q4_0, decode_q4_1, decode_q5_0, decode_q5_1, decode_q8_0,
)
from strata.quant.types import quant_type

__all__ = [
    "BLOCK_DECODERS", "FLOAT_GROUP", "FLOAT_VALUE_DECODERS", "BlockDecoder", "block_decoder",
    "decode_block", "decode_blocks",
    "decode_bf16", "decode_f16", "decode_f32", "decode_iq2_s", "decode_iq2_xs", "decode_iq2_xxs",
    "decode_iq3_s", "decode_iq3_xxs", "decode_iq4_nl", "decode_iq4_xs", "decode_mxfp4",
    "decode_q2_k", "decode_q3_k", "decode_q4_0", "decode_q4_1", "decode_q5_0", "decode_q5_1",
    "decode_q5_k", "decode_q6_k", "decode_q8_0",
]

# ggml type number -> block decoder (njit dispatcher with the common signature).
BLOCK_DECODERS: dict[int, Any] = {
    int(_T.F32): decode_f32,
    int(_T.F16): decode_f16,
    int(_T.BF16): decode_bf16,
    int(_T.Q8_0): decode_q8_0,
    int(_T.Q4_0): decode_q4_0,
    int(_T.Q4_1): decode_q4_1,
    int(_T.Q5_0): decode_q5_0,
    int(_T.Q5_1): decode_q5_1,
    int(_T.Q2_K): decode_q2_k,
    int(_T.Q3_K): decode_q3_k,
    int(_T.Q4_K): decode_q4_k,
    int(_T.Q5_K): decode_q5_k,
    int(_T.Q6_K): decode_q6_k,
    int(_T.IQ4_NL): decode_iq4_nl,
    int(_T.IQ4_XS): decode_iq4_xs,
    int(_T.IQ3_S): decode_iq3_s,
    int(_T.IQ3_XXS): decode_iq3_xxs,
    int(_T.IQ2_XXS): decode_iq2_xxs,
    int(_T.IQ2_XS): decode_iq2_xs,
    int(_T.IQ2_S): decode_iq2_s,
    int(_T.MXFP4): decode_mxfp4,
}

# ggml type number -> decoder of any count of values of a float format:
# (src, off, dst, dst_off, n_values).
FLOAT_VALUE_DECODERS: dict[int, Any] = {
    int(_T.F32): decode_f32_values,
    int(_T.F16): decode_f16_values,
    int(_T.BF16): decode_bf16_values,
}


class BlockDecoder(NamedTuple):
    """What a caller's loop needs: `decode` turns `block_bytes` bytes into `block_size` values."""

    block_size: int
    block_bytes: int
    decode: Any


def block_decoder(ggml_type: int | str) -> BlockDecoder:
    """(block_size, block_bytes, decoder) of a supported type, by GGML number or name.

    Raises ValueError for an unknown type or one Strata does not decode.
    """
    q = quant_type(ggml_type)
    decode = BLOCK_DECODERS.get(q.ggml_type)
    if decode is None:
        raise ValueError(f"GGML type {q.name} ({q.ggml_type}) has no Strata decoder "
                         f"(supported: {', '.join(_supported_names())})")
    if q.ggml_type in FLOAT_VALUE_DECODERS:
        return BlockDecoder(FLOAT_GROUP, FLOAT_GROUP * q.block_bytes, decode)
    return BlockDecoder(q.block_size, q.block_bytes, decode)


def _supported_names() -> list[str]:
    return [quant_type(t).name for t in BLOCK_DECODERS]


_F32, _F16, _BF16 = int(_T.F32), int(_T.F16), int(_T.BF16)
_Q8_0, _Q4_0, _Q4_1, _Q5_0, _Q5_1 = (int(_T.Q8_0), int(_T.Q4_0), int(_T.Q4_1), int(_T.Q5_0),
                                     int(_T.Q5_1))
_Q2_K, _Q3_K, _Q4_K, _Q5_K, _Q6_K = (int(_T.Q2_K), int(_T.Q3_K), int(_T.Q4_K), int(_T.Q5_K),
                                     int(_T.Q6_K))
_IQ4_NL, _IQ4_XS, _IQ3_S, _IQ3_XXS = int(_T.IQ4_NL), int(_T.IQ4_XS), int(_T.IQ3_S), int(_T.IQ3_XXS)
_IQ2_XXS, _IQ2_XS, _IQ2_S, _MXFP4 = int(_T.IQ2_XXS), int(_T.IQ2_XS), int(_T.IQ2_S), int(_T.MXFP4)


@njit(cache=True, nogil=True)
def decode_blocks(ggml_type, src, off, dst, dst_off, n_blocks):
    """Decode `n_blocks` consecutive blocks of type `ggml_type` (a runtime int) from byte `off`
    into `dst[dst_off:]`: the common signature with the type first and a count last.

    One compiled, disk-cached function serves every type; it branches once per call, and the
    per-block decoder is inlined into a tight loop (a per-block call through a type switch is
    about 3x slower). Float types count 32-value groups as blocks. Releases the GIL.
    """
    # One explicit loop per type: passing the decoder as a first-class function value would
    # embed a process-specific pointer wherever LLVM declines to inline, defeating the cache.
    if ggml_type == _Q8_0:
        for b in range(n_blocks):
            decode_q8_0(src, off + 34 * b, dst, dst_off + 32 * b)
    elif ggml_type == _Q4_K:
        for b in range(n_blocks):
            decode_q4_k(src, off + 144 * b, dst, dst_off + 256 * b)
    elif ggml_type == _Q6_K:
        for b in range(n_blocks):
            decode_q6_k(src, off + 210 * b, dst, dst_off + 256 * b)
    elif ggml_type == _Q5_K:
        for b in range(n_blocks):
            decode_q5_k(src, off + 176 * b, dst, dst_off + 256 * b)
    elif ggml_type == _Q4_0:
        for b in range(n_blocks):
            decode_q4_0(src, off + 18 * b, dst, dst_off + 32 * b)
    elif ggml_type == _Q4_1:
        for b in range(n_blocks):
            decode_q4_1(src, off + 20 * b, dst, dst_off + 32 * b)
    elif ggml_type == _Q5_0:
        for b in range(n_blocks):
            decode_q5_0(src, off + 22 * b, dst, dst_off + 32 * b)
    elif ggml_type == _Q5_1:
        for b in range(n_blocks):
            decode_q5_1(src, off + 24 * b, dst, dst_off + 32 * b)
    elif ggml_type == _Q2_K:
        for b in range(n_blocks):
            decode_q2_k(src, off + 84 * b, dst, dst_off + 256 * b)
    elif ggml_type == _Q3_K:
        for b in range(n_blocks):
            decode_q3_k(src, off + 110 * b, dst, dst_off + 256 * b)
    elif ggml_type == _MXFP4:
        for b in range(n_blocks):
            decode_mxfp4(src, off + 17 * b, dst, dst_off + 32 * b)
    elif ggml_type == _IQ4_NL:
        for b in range(n_blocks):
            decode_iq4_nl(src, off + 18 * b, dst, dst_off + 32 * b)
    elif ggml_type == _IQ4_XS:
        for b in range(n_blocks):
            decode_iq4_xs(src, off + 136 * b, dst, dst_off + 256 * b)
    elif ggml_type == _IQ3_S:
        for b in range(n_blocks):
            decode_iq3_s(src, off + 110 * b, dst, dst_off + 256 * b)
    elif ggml_type == _IQ3_XXS:
        for b in range(n_blocks):
            decode_iq3_xxs(src, off + 98 * b, dst, dst_off + 256 * b)
    elif ggml_type == _IQ2_XXS:
        for b in range(n_blocks):
            decode_iq2_xxs(src, off + 66 * b, dst, dst_off + 256 * b)
    elif ggml_type == _IQ2_XS:
        for b in range(n_blocks):
            decode_iq2_xs(src, off + 74 * b, dst, dst_off + 256 * b)
    elif ggml_type == _IQ2_S:
        for b in range(n_blocks):
            decode_iq2_s(src, off + 82 * b, dst, dst_off + 256 * b)
    elif ggml_type == _F16:
        for b in range(n_blocks):
            decode_f16(src, off + 64 * b, dst, dst_off + 32 * b)
    elif ggml_type == _BF16:
        for b in range(n_blocks):
            decode_bf16(src, off + 64 * b, dst, dst_off + 32 * b)
    elif ggml_type == _F32:
        for b in range(n_blocks):
            decode_f32(src, off + 128 * b, dst, dst_off + 32 * b)
    else:
        raise ValueError("decode_blocks: unsupported GGML type")


@njit(cache=True, nogil=True)
def decode_block(ggml_type, src, off, dst, dst_off):
    """Decode one block of type `ggml_type` (a runtime int): the common signature with the type
    first. For runs of blocks prefer `decode_blocks`, which switches on the type once."""
    if ggml_type == _Q8_0:
        decode_q8_0(src, off, dst, dst_off)
    elif ggml_type == _Q4_K:
        decode_q4_k(src, off, dst, dst_off)
    elif ggml_type == _Q6_K:
        decode_q6_k(src, off, dst, dst_off)
    elif ggml_type == _Q5_K:
        decode_q5_k(src, off, dst, dst_off)
    elif ggml_type == _Q4_0:
        decode_q4_0(src, off, dst, dst_off)
    elif ggml_type == _Q4_1:
        decode_q4_1(src, off, dst, dst_off)
    elif ggml_type == _Q5_0:
        decode_q5_0(src, off, dst, dst_off)
    elif ggml_type == _Q5_1:
        decode_q5_1(src, off, dst, dst_off)
    elif ggml_type == _Q2_K:
        decode_q2_k(src, off, dst, dst_off)
    elif ggml_type == _Q3_K:
        decode_q3_k(src, off, dst, dst_off)
    elif ggml_type == _MXFP4:
        decode_mxfp4(src, off, dst, dst_off)
    elif ggml_type == _IQ4_NL:
        decode_iq4_nl(src, off, dst, dst_off)
    elif ggml_type == _IQ4_XS:
        decode_iq4_xs(src, off, dst, dst_off)
    elif ggml_type == _IQ3_S:
        decode_iq3_s(src, off, dst, dst_off)
    elif ggml_type == _IQ3_XXS:
        decode_iq3_xxs(src, off, dst, dst_off)
    elif ggml_type == _IQ2_XXS:
        decode_iq2_xxs(src, off, dst, dst_off)
    elif ggml_type == _IQ2_XS:
        decode_iq2_xs(src, off, dst, dst_off)
    elif ggml_type == _IQ2_S:
        decode_iq2_s(src, off, dst, dst_off)
    elif ggml_type == _F16:
        decode_f16(src, off, dst, dst_off)
    elif ggml_type == _BF16:
        decode_bf16(src, off, dst, dst_off)
    elif ggml_type == _F32:
        decode_f32(src, off, dst, dst_off)
    else:
        raise ValueError("decode_block: unsupported GGML type")

