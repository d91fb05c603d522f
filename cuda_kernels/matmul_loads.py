"""Split weight-row loaders for the tensor-core GEMM: `fetch` issues a k step's global loads into
registers, `decode` later turns them into the step's 16 f16-pair words in shared memory.

The tile loop fetches step k+1 before it issues step k's MMAs and decodes after them, so the
loads' latency hides behind tensor-core work (the generic path, a format's `dq32`, loads and
decodes in one go after the MMAs). A loader serves one format at 32 values per step (kch=1):

* ``fetch(wbuf, boff, kt, raw)``: loads for step kt of the row at byte `boff` into `raw`
  (u32 [RAW_WORDS], registers), keeping words an earlier step already loaded;
* ``decode(raw, kt, sB, dst)``: writes sB[dst:dst+16] = the step's 32 values as f16 pairs.

Q4_K (144-byte super-blocks of 256 values, layout in `qformats_k`): the 16-byte head (d, dmin,
12 scale bytes) is loaded at a super-block's first step, the 32 quant bytes shared by groups
2i and 2i+1 at even steps (16-byte vector loads when the row is 16-byte aligned, which every
Q4_K row of an aligned matrix is: 144 = 9 * 16). Values decode with f16x2 arithmetic: each
nibble becomes the half 1024 + q (bits 0x6400 | q), 1024 is subtracted exactly, and one
fma.rn.f16x2 applies the sub-block's scale and min (both rounded to f16 first).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32

from .intrinsics import h2f, ld_nc_u32x4, ld_u32, prmt
from .mma import h2_sub_fma, pack_half2

RAW_WORDS = 12
MAGIC2 = np.uint32(0x64006400)  # two halves of 1024.0
MAGIC4 = np.uint32(0x64646464)  # prmt source of the 0x64 high bytes


@cuda.jit(device=True, inline="always")
def _ld16(wbuf, off, raw, at):
    """raw[at:at+4] = the 16 bytes at `off` (one vector load when 16-byte aligned)."""
    if off & 15 == 0:
        a, b, c, d = ld_nc_u32x4(wbuf, off)
    else:
        a, b, c, d = ld_u32(wbuf, off), ld_u32(wbuf, off + 4), ld_u32(wbuf, off + 8), \
            ld_u32(wbuf, off + 12)
    raw[at] = a
    raw[at + 1] = b
    raw[at + 2] = c
    raw[at + 3] = d


@cuda.jit(device=True, inline="always")
def q4k_fetch(wbuf, boff, kt, raw):
    o = boff + (kt >> 3) * 144
    if kt & 7 == 0:
        _ld16(wbuf, o, raw, 0)
    if kt & 1 == 0:
        qo = o + 16 + 32 * ((kt & 7) >> 1)
        _ld16(wbuf, qo, raw, 4)
        _ld16(wbuf, qo + 16, raw, 8)


@cuda.jit(device=True, inline="always")
def q4k_decode(raw, kt, sB, dst):
    jb = kt & 7
    s0, s1 = raw[1], raw[2]
    if jb < 4:
        sh = 8 * jb
        sc = (s0 >> sh) & 63
        mn = (s1 >> sh) & 63
    else:
        sh = 8 * (jb - 4)
        hi = raw[3] >> sh
        sc = (hi & 0xF) | (((s0 >> sh) >> 6) & 3) << 4
        mn = ((hi >> 4) & 0xF) | (((s1 >> sh) >> 6) & 3) << 4
    dm = raw[0]
    dl = h2f(dm & 0xFFFF) * float32(sc)
    ml = h2f(dm >> 16) * float32(mn)
    scale2 = pack_half2(dl, dl)
    neg2 = pack_half2(-ml, -ml)
    nib = 4 * (jb & 1)
    for t in range(8):
        m = (raw[4 + t] >> nib) & 0x0F0F0F0F  # four quants, one per byte
        sB[dst + 2 * t] = h2_sub_fma(prmt(m, MAGIC4, 0x4140), MAGIC2, scale2, neg2)
        sB[dst + 2 * t + 1] = h2_sub_fma(prmt(m, MAGIC4, 0x4342), MAGIC2, scale2, neg2)


LOADERS = {int(T.Q4_K): (q4k_fetch, q4k_decode)}


def split_loader(ggml_type: int):
    """(fetch, decode) of a format with a split loader, else None (the kernel uses dq32)."""
    return LOADERS.get(int(ggml_type))


__all__ = ["RAW_WORDS", "split_loader", "q4k_fetch", "q4k_decode"]
