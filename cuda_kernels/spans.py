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

from .intrinsics import funnel_r, ld_nc_u32x2


@cuda.jit(device=True, inline="always")
def _base8(off):
    return off - (off & 7)


@cuda.jit(device=True, inline="always")
def span2(w, off):
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
def span4(w, off):
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
def span8(w, off):
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
