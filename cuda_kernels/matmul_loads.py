"""Split weight-row loaders for the tensor-core GEMM: `fetch` issues a k step's global loads into
registers, `decode` later turns them into the step's 16 f16-pair words in shared memory.

Formats with a split loader: Q4_K, Q5_K, Q6_K (and its planar layout), Q8_0, IQ4_XS (the others
decode through dq32).

The tile loop fetches step k+1 before it issues step k's MMAs and decodes after them, so the
loads' latency hides behind tensor-core work (the generic path, a format's `dq32`, loads and
decodes in one go after the MMAs). A loader serves one format at 32 values per step (kch=1):

* ``fetch(wbuf, boff, kt, raw, part)``: loads for step kt of the row at byte `boff` into `raw`
  (u32, registers), keeping words an earlier step already loaded;
* ``decode(raw, kt, part, sB, dst)``: writes the step's values of this thread's part (of
  `parts` threads sharing the row) as f16 pairs, the row's 32 values going to sB[dst:dst+16]
  (dst a multiple of 4 words, 16-byte aligned), four words a store: a warp's 4-byte stores to its
  rows (80 bytes apart) fell in 8 banks, 4 ways conflicted, and its 16-byte stores fill whole
  wavefronts.

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

from strata.quant.planar import Q6_K_P8

from .intrinsics import funnel_r, h2f, ld_nc_u32x2, ld_nc_u32x4, ld_u32, prmt, st_x4
from .levels import iq4_levels, iq4_xs_scale
from .mma import h2_sub_fma, pack_half2
from .planar import q6_k_fields, q6_k_p8_fields

MAGIC2 = np.uint32(0x64006400)  # two halves of 1024.0
MAGIC4 = np.uint32(0x64646464)  # prmt source of the 0x64 high bytes
MAGIC2_Q8 = np.uint32(0x64806480)  # two halves of 1152.0 = 1024 + 128
MAGIC2_Q6 = np.uint32(0x64206420)  # two halves of 1056.0 = 1024 + 32
ZERO2 = np.uint32(0)


def _loader16(pairs: bool):
    """A device function raw[at:at+4] = the 16 bytes at `off` (4-byte aligned) of wbuf: one
    vector load when 16-byte aligned, with `pairs` two when 8-byte aligned (IQ4_XS's 136-byte
    super-blocks alternate), else four words."""
    @cuda.jit(device=True, inline="always")
    def ld16(wbuf, off, raw, at):
        if off & 15 == 0:
            a, b, c, d = ld_nc_u32x4(wbuf, off)
        elif pairs and off & 7 == 0:
            a, b = ld_nc_u32x2(wbuf, off)
            c, d = ld_nc_u32x2(wbuf, off + 8)
        else:
            a, b, c, d = ld_u32(wbuf, off), ld_u32(wbuf, off + 4), ld_u32(wbuf, off + 8), \
                ld_u32(wbuf, off + 12)
        raw[at] = a
        raw[at + 1] = b
        raw[at + 2] = c
        raw[at + 3] = d
    return ld16


_ld16 = _loader16(False)   # the K-quants' rows: 16-byte aligned in an aligned matrix
_ld16_8 = _loader16(True)


@cuda.jit(device=True, inline="always")
def _k4_scale_min(raw, jb):
    """(scale, -min) of sub-block jb as f16 pairs, from a Q4_K / Q5_K head in raw[0:4] (d, dmin,
    then 12 bytes of 6-bit scales and minimums)."""
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
    return pack_half2(dl, dl), pack_half2(-ml, -ml)


def q4k_loader(parts: int):
    """Q4_K (fetch, decode, raw words) for `parts` threads per weight row (1 or 2): part p
    decodes values 16p.. of its row's 32 (16 / parts words of quants each)."""
    return _k_loader(parts, fifth=False)


def q5k_loader(parts: int):
    """Q5_K (fetch, decode, raw words) for `parts` threads per weight row: Q4_K's with a fifth
    bit. Super-blocks of 176 bytes (d, dmin, 12 scale bytes, qh[32], qs[128]; 16-byte aligned
    in an aligned matrix): the part's qh words come with the head at a super-block's first step
    (bit jb of qh[l] is value l's fifth bit in sub-block jb, for all eight steps). A 5-bit q
    becomes the half 1024 + q, then as Q4_K."""
    return _k_loader(parts, fifth=True)


def _k_loader(parts: int, fifth: bool):
    """Q4_K's loader, or with `fifth` Q5_K's (see both)."""
    NQ = 8 // parts  # quant words per thread (and, for Q5_K, fifth-bit words)
    SB, QS = (176, 48) if fifth else (144, 16)  # super-block bytes, offset of qs

    @cuda.jit(device=True, inline="always")
    def fetch(wbuf, boff, kt, raw, part):
        o = boff + (kt >> 3) * SB
        if kt & 7 == 0:
            _ld16(wbuf, o, raw, 0)
            if fifth:
                for h in range(NQ // 4):
                    _ld16(wbuf, o + 16 + 4 * NQ * part + 16 * h, raw, 4 + NQ + 4 * h)
        if kt & 1 == 0:
            qo = o + QS + 32 * ((kt & 7) >> 1) + 4 * NQ * part
            for h in range(NQ // 4):
                _ld16(wbuf, qo + 16 * h, raw, 4 + 4 * h)

    @cuda.jit(device=True, inline="always")
    def decode(raw, kt, part, sB, dst):
        jb = kt & 7
        scale2, neg2 = _k4_scale_min(raw, jb)
        nib = 4 * (jb & 1)
        d0 = dst + 2 * NQ * part
        for t in range(NQ // 2):  # two quant words, four quants each: one 16-byte store
            m = (raw[4 + 2 * t] >> nib) & 0x0F0F0F0F  # four quants, one per byte
            n = (raw[5 + 2 * t] >> nib) & 0x0F0F0F0F
            if fifth:
                m |= ((raw[4 + NQ + 2 * t] >> jb) & 0x01010101) << 4
                n |= ((raw[5 + NQ + 2 * t] >> jb) & 0x01010101) << 4
            st_x4(sB, d0 + 4 * t,
                  h2_sub_fma(prmt(m, MAGIC4, 0x4140), MAGIC2, scale2, neg2),
                  h2_sub_fma(prmt(m, MAGIC4, 0x4342), MAGIC2, scale2, neg2),
                  h2_sub_fma(prmt(n, MAGIC4, 0x4140), MAGIC2, scale2, neg2),
                  h2_sub_fma(prmt(n, MAGIC4, 0x4342), MAGIC2, scale2, neg2))

    return fetch, decode, 4 + (2 * NQ if fifth else NQ)


def q8_0_loader(parts: int):
    """Q8_0 (fetch, decode, raw words) for `parts` threads per weight row: a 34-byte block is
    one step. Blocks sit at 2-byte alignment, so the part's 16 or 32 quant bytes are read as
    whole words from the word holding their first byte (one more word when that byte is not
    word-aligned, never past the block's 4-byte-rounded end) and realigned by funnel shifts;
    each int8 q becomes the half 1152 + q (bits 0x6400 | (q + 128)), 1152 is subtracted exactly
    and fma.rn.f16x2 scales by d: the correctly rounded f16 of d * q."""
    NQ = 8 // parts  # quant words per thread

    @cuda.jit(device=True, inline="always")
    def fetch(wbuf, boff, kt, raw, part):
        o = boff + kt * 34
        s = o + 2 + 4 * NQ * part  # first quant byte of this part
        a = s & ~3
        raw[0] = ld_u32(wbuf, o & ~3)  # holds d
        for i in range(NQ):
            raw[1 + i] = ld_u32(wbuf, a + 4 * i)
        raw[1 + NQ] = 0
        if s & 3:
            raw[1 + NQ] = ld_u32(wbuf, a + 4 * NQ)
        raw[2 + NQ] = s & 3

    @cuda.jit(device=True, inline="always")
    def decode(raw, kt, part, sB, dst):
        sh = raw[2 + NQ]  # 0 or 2: the quant bytes' offset in their first word
        d = h2f(raw[0] >> (16 - 8 * sh))  # d precedes the quants: the other half of its word
        d2 = pack_half2(d, d)
        d0 = dst + 2 * NQ * part
        for t in range(NQ // 2):  # two quant words: one 16-byte store
            m = funnel_r(raw[1 + 2 * t], raw[2 + 2 * t], 8 * sh) ^ 0x80808080  # bytes q + 128
            n = funnel_r(raw[2 + 2 * t], raw[3 + 2 * t], 8 * sh) ^ 0x80808080
            st_x4(sB, d0 + 4 * t,
                  h2_sub_fma(prmt(m, MAGIC4, 0x4140), MAGIC2_Q8, d2, ZERO2),
                  h2_sub_fma(prmt(m, MAGIC4, 0x4342), MAGIC2_Q8, d2, ZERO2),
                  h2_sub_fma(prmt(n, MAGIC4, 0x4140), MAGIC2_Q8, d2, ZERO2),
                  h2_sub_fma(prmt(n, MAGIC4, 0x4342), MAGIC2_Q8, d2, ZERO2))

    return fetch, decode, 3 + NQ


def q6k_loader(parts: int, planar: bool = False):
    """Q6_K (fetch, decode, raw words) for `parts` threads per weight row. Super-blocks (210
    bytes) sit at 2-byte alignment: the part's low-nibble (ql) and high-bit (qh) bytes are read as
    whole words and realigned by funnel shifts (the extra word stays inside the super-block), the
    step's scale bytes and d from the words holding them. A 6-bit q becomes the half 1024 + q,
    1056 is subtracted exactly (q - 32), and fma.rn.f16x2 scales by d * scale rounded to f16.
    `planar`: the planar layout (`strata.quant.planar`): ql, qh and scales word-aligned (shift 0,
    the extra word inside the group), d's word shifted in `fetch`."""
    NQ = 8 // parts  # quant words per thread
    HALVES = 2 // parts  # 16-value halves (each with its own scale) per thread

    @cuda.jit(device=True, inline="always")
    def fetch(wbuf, boff, kt, raw, part):
        o = boff + (kt >> 3) * 210
        jb = kt & 7
        if planar:
            ql, qh, sc, d = q6_k_p8_fields(o)
            raw[0] = ld_u32(wbuf, d & ~3) >> (8 * (d & 3))  # d in the low half
            raw[2] = 0
        else:
            ql, qh, sc, d = q6_k_fields(o)
            raw[0] = ld_u32(wbuf, d & ~3)  # holds d
            raw[2] = o & 3
        lo = ql + 64 * (jb >> 2) + 32 * (jb & 1) + 4 * NQ * part  # this part's ql bytes
        hi = qh + 32 * (jb >> 2) + 4 * NQ * part  # and its qh bytes
        raw[1] = ld_u32(wbuf, (sc + 2 * jb) & ~3)  # holds the step's two scale bytes
        for i in range(NQ + 1):
            raw[3 + i] = ld_u32(wbuf, (lo & ~3) + 4 * i)
            raw[4 + NQ + i] = ld_u32(wbuf, (hi & ~3) + 4 * i)

    @cuda.jit(device=True, inline="always")
    def decode(raw, kt, part, sB, dst):
        jb = kt & 7
        sh = raw[2]  # 0 or 2: every field's byte offset in its first word
        d = h2f(raw[0] >> (8 * sh))
        lsh = 4 * ((jb >> 1) & 1)  # ql nibble: high for the sub-blocks 2, 3, 6, 7 of 8
        hsh = 2 * (jb & 3)  # qh bit pair
        for hh in range(HALVES):
            sc = int((raw[1] >> (8 * ((sh + 2 * jb) & 3) + 8 * (part * HALVES + hh))) & 0xFF)
            dl = d * float32(sc - ((sc & 0x80) << 1))  # the int8 scale (signed arithmetic)
            dl2 = pack_half2(dl, dl)
            d0 = dst + 2 * NQ * part + 8 * hh
            for t in range(2):  # two quant words: one 16-byte store
                i = 4 * hh + 2 * t
                ql = funnel_r(raw[3 + i], raw[4 + i], 8 * sh)
                qh = funnel_r(raw[4 + NQ + i], raw[5 + NQ + i], 8 * sh)
                m = ((ql >> lsh) & 0x0F0F0F0F) | (((qh >> hsh) & 0x03030303) << 4)
                ql = funnel_r(raw[4 + i], raw[5 + i], 8 * sh)
                qh = funnel_r(raw[5 + NQ + i], raw[6 + NQ + i], 8 * sh)
                n = ((ql >> lsh) & 0x0F0F0F0F) | (((qh >> hsh) & 0x03030303) << 4)
                st_x4(sB, d0 + 4 * t,
                      h2_sub_fma(prmt(m, MAGIC4, 0x4140), MAGIC2_Q6, dl2, ZERO2),
                      h2_sub_fma(prmt(m, MAGIC4, 0x4342), MAGIC2_Q6, dl2, ZERO2),
                      h2_sub_fma(prmt(n, MAGIC4, 0x4140), MAGIC2_Q6, dl2, ZERO2),
                      h2_sub_fma(prmt(n, MAGIC4, 0x4342), MAGIC2_Q6, dl2, ZERO2))

    return fetch, decode, 5 + 2 * NQ


@cuda.jit(device=True, inline="always")
def _i8x4_f16(b, scale2):
    """Two f16x2 words: the four int8 bytes of b times scale2 (as Q8_0's: each byte placed
    under 1024 + 128, 1152 subtracted exactly, one rounding in the fma)."""
    m = b ^ 0x80808080
    return (h2_sub_fma(prmt(m, MAGIC4, 0x4140), MAGIC2_Q8, scale2, ZERO2),
            h2_sub_fma(prmt(m, MAGIC4, 0x4342), MAGIC2_Q8, scale2, ZERO2))


def iq4_xs_loader(parts: int):
    """IQ4_XS (fetch, decode, raw words) for `parts` threads per weight row. A step is one
    32-value sub-block jb of a 136-byte super-block (fp16 d, 16 bits of high scale bits, 32 of
    low, then 8 x 16 quant bytes: byte i holds values i (low nibble) and 16 + i (high)). The
    8-byte head is loaded at a super-block's first step, the sub-block's 16 quant bytes at
    every step (by every part: part 0 decodes the low nibbles, values 0..15, part 1 the high).
    Levels come four at a time from byte permutes (`levels.iq4_levels`) as int8, widen to f16
    exactly as Q8_0's bytes do, and fma.rn.f16x2 scales them by d * (ls - 32) rounded to f16."""

    @cuda.jit(device=True, inline="always")
    def fetch(wbuf, boff, kt, raw, part):
        o = boff + (kt >> 3) * 136
        if kt & 7 == 0:
            raw[0] = ld_u32(wbuf, o)       # d | scales_h << 16
            raw[1] = ld_u32(wbuf, o + 4)   # scales_l
        _ld16_8(wbuf, o + 8 + 16 * (kt & 7), raw, 2)

    @cuda.jit(device=True, inline="always")
    def decode(raw, kt, part, sB, dst):
        jb = kt & 7
        dh = raw[0]
        ls = iq4_xs_scale(dh, raw[1], jb)
        dl = h2f(dh & 0xFFFF) * (float32(ls) - float32(32.0))  # ls unsigned: no int subtract
        dl2 = pack_half2(dl, dl)
        for t in range(2):  # quant words 2t, 2t + 1: values 8t .. 8t + 7 (low nibbles), + 16
            la, ha = iq4_levels(raw[2 + 2 * t])
            lb, hb = iq4_levels(raw[3 + 2 * t])
            if parts == 1 or part == 0:
                w0, w1 = _i8x4_f16(la, dl2)
                w2, w3 = _i8x4_f16(lb, dl2)
                st_x4(sB, dst + 4 * t, w0, w1, w2, w3)
            if parts == 1 or part == 1:
                w0, w1 = _i8x4_f16(ha, dl2)
                w2, w3 = _i8x4_f16(hb, dl2)
                st_x4(sB, dst + 8 + 4 * t, w0, w1, w2, w3)

    return fetch, decode, 6


def q6k_p8_loader(parts: int):
    """`q6k_loader` of the planar layout."""
    return q6k_loader(parts, planar=True)


LOADERS = {int(T.Q4_K): q4k_loader, int(T.Q5_K): q5k_loader, int(T.Q6_K): q6k_loader,
           Q6_K_P8.ggml_type: q6k_p8_loader, int(T.Q8_0): q8_0_loader,
           int(T.IQ4_XS): iq4_xs_loader}


def split_loader(ggml_type: int):
    """The loader factory (parts -> (fetch, decode, raw words)) of a format that has one, else
    None (the kernel uses the format's dq32)."""
    return LOADERS.get(int(ggml_type))


__all__ = ["split_loader", "q4k_loader", "q5k_loader", "q6k_loader", "q6k_p8_loader",
           "q8_0_loader", "iq4_xs_loader"]
