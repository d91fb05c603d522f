"""Loads of a few contiguous bytes at an even (not word-aligned) offset of a read-only global
buffer, as little-endian u32 words: the blocks of most GGML formats (34, 110, 210 bytes...) sit
at 2-byte boundaries, so a lane's slice of one cannot be read with a single aligned vector load.

Each loader reads the 8-byte-aligned words covering the span with `ld.global.nc.v2.u32` (never a
word holding none of the span's bytes, so never past a buffer's end), then moves the span down to
word 0: one select per word for the 4-byte half and a funnel shift for the 2-byte remainder, both
on lane-varying amounts, so no register array is indexed at run time.
"""

from __future__ import annotations

from numba import cuda

from .intrinsics import funnel_r, ld_nc_u32, ld_nc_u32x2

# Width of the loads a span is read with: 8 (the 8-byte-aligned `ld.global.nc.v2.u32` words
# covering it, a select per word on the span's 4-byte half and a funnel shift) or 4 (the
# 4-byte-aligned words covering it, `ld.global.nc.u32`, and the funnel shift alone: more load
# instructions, fewer integer ones). Read at import.
SPAN_LOAD_BYTES = 8


@cuda.jit(device=True, inline="always")
def _base8(off):
    return off - (off & 7)


@cuda.jit(device=True, inline="always")
def _base4(off):
    return off - (off & 3)


@cuda.jit(device=True, inline="always")
def _span2_w4(w, off):
    b = _base4(off)
    a0 = ld_nc_u32(w, b)
    a1 = ld_nc_u32(w, b + 4)
    a2 = ld_nc_u32(w, _base4(off + 7))  # b + 8 only when off is not 4-aligned
    sh = (off & 3) * 8
    return funnel_r(a0, a1, sh), funnel_r(a1, a2, sh)


@cuda.jit(device=True, inline="always")
def _span4_w4(w, off):
    b = _base4(off)
    a0 = ld_nc_u32(w, b)
    a1 = ld_nc_u32(w, b + 4)
    a2 = ld_nc_u32(w, b + 8)
    a3 = ld_nc_u32(w, b + 12)
    a4 = ld_nc_u32(w, _base4(off + 15))
    sh = (off & 3) * 8
    return funnel_r(a0, a1, sh), funnel_r(a1, a2, sh), funnel_r(a2, a3, sh), funnel_r(a3, a4, sh)


@cuda.jit(device=True, inline="always")
def _span8_w4(w, off):
    b = _base4(off)
    a0 = ld_nc_u32(w, b)
    a1 = ld_nc_u32(w, b + 4)
    a2 = ld_nc_u32(w, b + 8)
    a3 = ld_nc_u32(w, b + 12)
    a4 = ld_nc_u32(w, b + 16)
    a5 = ld_nc_u32(w, b + 20)
    a6 = ld_nc_u32(w, b + 24)
    a7 = ld_nc_u32(w, b + 28)
    a8 = ld_nc_u32(w, _base4(off + 31))
    sh = (off & 3) * 8
    return (funnel_r(a0, a1, sh), funnel_r(a1, a2, sh), funnel_r(a2, a3, sh),
            funnel_r(a3, a4, sh), funnel_r(a4, a5, sh), funnel_r(a5, a6, sh),
            funnel_r(a6, a7, sh), funnel_r(a7, a8, sh))


@cuda.jit(device=True, inline="always")
def _span2_w8(w, off):
    """The 8 bytes at `off` (even) of `w` as 2 u32."""
    a0, a1 = ld_nc_u32x2(w, _base8(off))
    a2, a3 = ld_nc_u32x2(w, _base8(off + 7))
    hi = (off & 4) != 0
    sh = (off & 3) * 8
    v0 = a1 if hi else a0
    v1 = a2 if hi else a1
    v2 = a3 if hi else a2
    return funnel_r(v0, v1, sh), funnel_r(v1, v2, sh)


@cuda.jit(device=True, inline="always")
def _span4_w8(w, off):
    """The 16 bytes at `off` (even) of `w` as 4 u32."""
    b = _base8(off)
    a0, a1 = ld_nc_u32x2(w, b)
    a2, a3 = ld_nc_u32x2(w, b + 8)
    a4, a5 = ld_nc_u32x2(w, _base8(off + 15))
    hi = (off & 4) != 0
    sh = (off & 3) * 8
    v0 = a1 if hi else a0
    v1 = a2 if hi else a1
    v2 = a3 if hi else a2
    v3 = a4 if hi else a3
    v4 = a5 if hi else a4
    return (funnel_r(v0, v1, sh), funnel_r(v1, v2, sh), funnel_r(v2, v3, sh),
            funnel_r(v3, v4, sh))


@cuda.jit(device=True, inline="always")
def _span8_w8(w, off):
    """The 32 bytes at `off` (even) of `w` as 8 u32."""
    b = _base8(off)
    a0, a1 = ld_nc_u32x2(w, b)
    a2, a3 = ld_nc_u32x2(w, b + 8)
    a4, a5 = ld_nc_u32x2(w, b + 16)
    a6, a7 = ld_nc_u32x2(w, b + 24)
    a8, a9 = ld_nc_u32x2(w, _base8(off + 31))
    hi = (off & 4) != 0
    sh = (off & 3) * 8
    v0 = a1 if hi else a0
    v1 = a2 if hi else a1
    v2 = a3 if hi else a2
    v3 = a4 if hi else a3
    v4 = a5 if hi else a4
    v5 = a6 if hi else a5
    v6 = a7 if hi else a6
    v7 = a8 if hi else a7
    v8 = a9 if hi else a8
    return (funnel_r(v0, v1, sh), funnel_r(v1, v2, sh), funnel_r(v2, v3, sh),
            funnel_r(v3, v4, sh), funnel_r(v4, v5, sh), funnel_r(v5, v6, sh),
            funnel_r(v6, v7, sh), funnel_r(v7, v8, sh))


# span2(w, off), span4, span8: the 8, 16, 32 bytes at `off` (even) of `w` as 2, 4, 8 u32
if SPAN_LOAD_BYTES == 4:
    span2, span4, span8 = _span2_w4, _span4_w4, _span8_w4
else:
    span2, span4, span8 = _span2_w8, _span4_w8, _span8_w8
