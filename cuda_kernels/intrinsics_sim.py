"""The simulator's bodies of `intrinsics` (NUMBA_ENABLE_CUDASIM=1): plain Python computing what
each device intrinsic computes, imported by `intrinsics` in place of the intrinsics.

The warp helpers gather every lane's value through the simulator's block barrier (it has no warp
shuffles), so every live thread of the block must call them the same number of times.
"""

from __future__ import annotations

import struct
import threading

import numpy as np

# Bit casts through struct: a fifth of numpy's one-element array round trip, and kernels under
# the simulator call them millions of times (12% of the engine test's time went to u2f alone).
# struct's float formats go through a C double, exact for every finite value but free to quiet
# a signalling NaN: inf and NaN patterns take numpy's bit-exact path.
_U32, _F32 = struct.Struct("<I"), struct.Struct("<f")
_U16, _F16 = struct.Struct("<H"), struct.Struct("<e")
_I8X4 = struct.Struct("<4b")
_PRMT_PLANS: dict = {}  # prmt selector -> (the 4 source byte indices, whether any replicates)

__all__ = [
    "ld_u8", "ld_u16", "ld_u32", "ld_u32_any", "ld_nc_u32x4", "ld_x4", "ld_i64x2", "prmt", "h2f",
    "u2f", "f2u", "dp4a", "warp_sum", "warp_max", "warp_bcast", "warp_argmax", "warp_suffix_sum",
    "ld_nc_u32x2", "funnel_r", "ld_f32_at", "ld_u32_at", "st_x4", "quad_sum", "quad_max", "ld_w4",
    "rint_i32",
]


def ld_u8(a, off):
    """Byte `off` of a uint8 array as an int."""
    return int(a[off])


# The simulated loads check the alignment the device instruction needs (relative to the
# array start: device allocations are 256-byte aligned) and touch exactly the bytes the
# device would, so CI catches misaligned and out-of-bounds accesses.
def _aligned(off, n):
    if int(off) % n:
        raise IndexError(f"misaligned {8 * n}-bit load at byte offset {off}")


def ld_u16(a, off):
    """Little-endian u16 at byte `off` (2-aligned)."""
    _aligned(off, 2)
    return int(a[off]) | (int(a[off + 1]) << 8)


def _inside(a, off, n):
    """The n bytes at `off` as a little-endian int, read as one slice of the 1-d uint8 ndarray
    behind `a` (an ndarray, or the simulator's in-kernel wrapper of a device array) where they
    lie wholly inside it; else None (the caller reads byte by byte: other arrays, ends)."""
    item = getattr(a, "_item", None)
    ary = getattr(item, "_ary", None) if item is not None else a
    if (type(ary) is np.ndarray and ary.dtype == np.uint8 and ary.ndim == 1
            and 0 <= off and off + n <= ary.shape[0]):
        return int.from_bytes(ary[off:off + n].tobytes(), "little")
    return None


def ld_u32(a, off):
    """Little-endian u32 at byte `off` (4-aligned). An aligned word that starts inside the
    array may run past its end (the device reads it within the same page): those bytes
    read as 0 here; a word starting past the end is an error."""
    _aligned(off, 4)
    off = int(off)
    v = _inside(a, off, 4)  # one slice, not four reads through the wrapper
    if v is not None:
        return v
    if off < 0:
        raise IndexError(f"u32 load at byte offset {off}")
    if off + 3 >= len(a) and off < len(a):
        return sum(int(a[off + i]) << (8 * i) for i in range(len(a) - off))
    return (int(a[off]) | (int(a[off + 1]) << 8) | (int(a[off + 2]) << 16)
            | (int(a[off + 3]) << 24))


def ld_u32_any(a, off):
    """Little-endian u32 at any byte offset: the aligned word holding byte `off`, and the next
    one only when `off` is misaligned (so it never reads past the 4 bytes' own word)."""
    off = int(off)
    base = off & ~3
    lo = ld_u32(a, base)
    if off & 3 == 0:
        return lo
    s = 8 * (off & 3)
    return ((lo >> s) | (ld_u32(a, base + 4) << (32 - s))) & 0xFFFFFFFF


def ld_nc_u32x4(a, off):
    """Four little-endian u32 at a 16-aligned byte offset of a read-only global buffer."""
    _aligned(off, 16)
    off = int(off)
    v = _inside(a, off, 16)
    if v is not None:
        return v & 0xFFFFFFFF, (v >> 32) & 0xFFFFFFFF, (v >> 64) & 0xFFFFFFFF, v >> 96
    return (ld_u32(a, off), ld_u32(a, off + 4), ld_u32(a, off + 8), ld_u32(a, off + 12))


def ld_x4(x, i):
    """x[i:i+4] of a float32 or float16 array as four float32 (i a multiple of 4)."""
    _aligned(i, 4)
    return (np.float32(x[i]), np.float32(x[i + 1]), np.float32(x[i + 2]), np.float32(x[i + 3]))


def ld_i64x2(x, i):
    """x[i], x[i+1] of an int64 array (i even: one 16-byte load on the GPU)."""
    _aligned(i, 2)
    return np.int64(x[i]), np.int64(x[i + 1])


def _prmt_plan(sel):
    nibs = [(sel >> (4 * k)) & 0xF for k in range(4)]
    plan = (tuple(n & 7 for n in nibs), any(n & 8 for n in nibs), tuple(nibs))
    _PRMT_PLANS[sel] = plan
    return plan


def prmt(a, b, sel):
    """PTX prmt.b32 (default mode): byte k of the result is byte (sel >> 4k) & 7 of the
    8 bytes b:a (a the low word); where bit 3 of that selector is set, the byte's sign bit
    replicated instead (0x00 or 0xFF)."""
    sel = int(sel) & 0xFFFF
    plan = _PRMT_PLANS.get(sel) or _prmt_plan(sel)
    both = _U32.pack(int(a) & 0xFFFFFFFF) + _U32.pack(int(b) & 0xFFFFFFFF)
    i0, i1, i2, i3 = plan[0]
    if not plan[1]:
        return both[i0] | (both[i1] << 8) | (both[i2] << 16) | (both[i3] << 24)
    out = 0
    for k in range(4):
        nib = plan[2][k]
        byte = both[nib & 7]
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * k)
    return out


def h2f(bits):
    """The IEEE half whose bit pattern is the low 16 bits of `bits`, as float32."""
    b = int(bits) & 0xFFFF
    if (b & 0x7C00) == 0x7C00:
        return np.float32(np.array([b], dtype=np.uint16).view(np.float16)[0])
    return np.float32(_F16.unpack(_U16.pack(b))[0])


def u2f(bits):
    """The float32 whose bit pattern is `bits`."""
    b = int(bits) & 0xFFFFFFFF
    if (b & 0x7F800000) == 0x7F800000:
        return np.array([b], dtype=np.uint32).view(np.float32)[0]
    return np.float32(_F32.unpack(_U32.pack(b))[0])


def f2u(x):
    """The bit pattern of float32 `x` as an int."""
    v = np.float32(x)
    u = _U32.unpack(_F32.pack(v))[0]
    if (u & 0x7F800000) == 0x7F800000:  # inf or NaN: numpy's bits (a NaN's payload as it is)
        return int(np.array([v], dtype=np.float32).view(np.uint32)[0])
    return u


def dp4a(a, b, c):
    """c + the dot product of the four signed bytes of a and of b."""
    a0, a1, a2, a3 = _I8X4.unpack(_U32.pack(int(a) & 0xFFFFFFFF))
    b0, b1, b2, b3 = _I8X4.unpack(_U32.pack(int(b) & 0xFFFFFFFF))
    return int(c) + a0 * b0 + a1 * b1 + a2 * b2 + a3 * b3


def _warp_gather(v):
    """Every lane's `v` of the caller's warp, in lane order (simulator only).

    One block barrier: values are keyed by the gather's sequence number, so a thread past
    it writes its next value under a new key; a thread drops its previous value only here,
    past this barrier, which every thread reached after reading that value."""
    t = threading.current_thread()
    mgr = t._manager
    store = mgr.__dict__.setdefault("_strata_warp", {})
    seq = t.__dict__.get("_strata_seq", 0)
    t._strata_seq = seq + 1
    store[(seq, t.thread_id)] = v
    t.syncthreads()
    store.pop((seq - 1, t.thread_id), None)
    warp0 = t.thread_id - t.thread_id % 32
    return [store[(seq, w)] for w in range(warp0, warp0 + 32) if (seq, w) in store]


def warp_sum(v):
    """Sum of `v` over the warp, in every lane."""
    vals = _warp_gather(v)
    s = vals[0]
    for x in vals[1:]:
        s = s + x
    return s


def warp_max(v):
    """Max of `v` over the warp, in every lane."""
    return max(_warp_gather(v))


def warp_bcast(v, lane):
    """Lane `lane`'s `v`, in every lane."""
    return _warp_gather(v)[lane]


def warp_argmax(v, i):
    """(max v, its i) over the warp, ties to the smaller i, in every lane."""
    pairs = _warp_gather((v, i))
    best = pairs[0]
    for p in pairs[1:]:
        if p[0] > best[0] or (p[0] == best[0] and p[1] < best[1]):
            best = p
    return best


def warp_suffix_sum(v):
    """Sum of `v` over this lane and every higher lane."""
    t = threading.current_thread()
    vals = _warp_gather(v)
    lane = t.thread_id % 32
    s = vals[lane]
    for x in vals[lane + 1:]:
        s = s + x
    return s


def ld_nc_u32x2(a, off):
    """Two little-endian u32 at an 8-aligned byte offset of a read-only global buffer. The
    8 bytes may run past the array's end (the device reads them within the same aligned
    chunk): those read as 0; a chunk starting past the end is an error."""
    _aligned(off, 8)
    off = int(off)
    v = _inside(a, off, 8)
    if v is not None:
        return v & 0xFFFFFFFF, v >> 32
    return (ld_u32(a, off), ld_u32(a, off + 4) if off + 4 < len(a) else 0)


def funnel_r(lo, hi, sh):
    """The low word of the 64-bit hi:lo shifted right by sh bits (0 <= sh <= 32)."""
    both = (int(lo) & 0xFFFFFFFF) | ((int(hi) & 0xFFFFFFFF) << 32)
    return (both >> min(int(sh), 32)) & 0xFFFFFFFF


def ld_f32_at(a, byte_off):
    """The float32 at byte offset `byte_off` (4-aligned) of a 4-byte-element array."""
    _aligned(byte_off, 4)
    return np.float32(a[int(byte_off) >> 2])


def ld_u32_at(a, byte_off):
    """The u32 at byte offset `byte_off` (4-aligned) of a 4-byte-element array."""
    _aligned(byte_off, 4)
    w = a[int(byte_off) >> 2]
    if isinstance(w, np.floating):  # a float32 array's bits, as the GPU's load reads them
        return int(np.float32(w).view(np.uint32))
    return int(w)


def st_x4(xs, i, v0, v1, v2, v3):
    """xs[i:i+4] = v0..v3 on a float32 or uint32 array (i a multiple of 4)."""
    _aligned(i, 4)
    xs[i], xs[i + 1], xs[i + 2], xs[i + 3] = v0, v1, v2, v3


def quad_sum(v):
    """Sum of `v` over this lane's aligned group of 4 lanes, in each of them."""
    t = threading.current_thread()
    vals = _warp_gather(v)
    q0 = (t.thread_id % 32) & ~3
    s = vals[q0]
    for x in vals[q0 + 1:q0 + 4]:
        s = s + x
    return s


def quad_max(v):
    """Max of `v` over this lane's aligned group of 4 lanes, in each of them."""
    t = threading.current_thread()
    vals = _warp_gather(v)
    q0 = (t.thread_id % 32) & ~3
    return max(vals[q0:q0 + 4])


def ld_w4(x, i):
    """x[i:i+4] of a uint32 array as four ints (i a multiple of 4: one 16-byte load)."""
    _aligned(i, 4)
    return int(x[i]), int(x[i + 1]), int(x[i + 2]), int(x[i + 3])


def rint_i32(v):
    """float32 v rounded to the nearest integer, ties to even (|v| < 2^31)."""
    return int(np.rint(np.float32(v)))
