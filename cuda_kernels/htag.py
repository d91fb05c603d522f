"""h's tag: the MoE's h entries (silu(gate x) * (up x), one per expert row) carry a 2-bit tag in
their two lowest mantissa bits, so a block of the one-launch MoE (`moe_fused`) can tell an entry
another block wrote in this launch from the one a launch before left there, with no barrier
across the grid: it polls the entries themselves (each word written and read whole).

Every writer of h writes the tag: 0 outside the one-launch kernel, and that kernel alternates 1
and 2 from one launch to the next (`launch_tag`, from the launch count it keeps in its state), so
what an earlier launch left never carries this launch's tag. The lane down kernels' stagings
clear the two bits (the others read only what writers of tag 0 wrote), so the one launch and the
two launches it replaces read the same values (the bits are worth 2^-22 of an entry at most; the
8-bit x of gate/up rounds far more). The buffer must hold no tag 1 or 2 before the first
one-launch use: zero, or written by any MoE launch. The one launch uses it only where
`moe_fused.TAGGED_H` is set (off by default: slower on the H200 as first written).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .intrinsics import SIMULATED, f2u, ld_x4, u2f
from .ordered import ld_relaxed_u32x4
from .xstage import put_quad, wide_stager

KEEP = np.uint32(0xFFFFFFFC)  # an entry's value bits
TAG = np.uint32(3)            # its tag bits
POLL_NS = np.uint32(32)       # a polling thread's pause between reads of an entry not yet written


@cuda.jit(device=True, inline="always")
def h_bits(v, tag):
    """The bit pattern of h entry v written with `tag` (0..3)."""
    return (f2u(v) & KEEP) | np.uint32(tag)


@cuda.jit(device=True, inline="always")
def h_plain(v):
    """h entry v as a launch outside the one-launch kernel writes it (tag 0)."""
    return u2f(f2u(v) & KEEP)


@cuda.jit(device=True, inline="always")
def launch_tag(count):
    """The tag of the one-launch kernel's launch number `count` (1, 2, 1, ...)."""
    return 1 + (count & 1)


@cuda.jit(device=True, inline="always")
def _ok(w0, w1, w2, w3, tag):
    """Whether the four words carry `tag`."""
    return ((w0 & TAG) == tag and (w1 & TAG) == tag and (w2 & TAG) == tag
            and (w3 & TAG) == tag)


@cuda.jit(device=True, inline="always")
def _values(w0, w1, w2, w3):
    return u2f(w0 & KEEP), u2f(w1 & KEEP), u2f(w2 & KEEP), u2f(w3 & KEEP)


@cuda.jit(device=True, inline="always")
def stage_h_polled(h, n_vals, xs, a, pa, b, pb, sums, sums_off, tag, check):
    """`stage_h6` (`xstage.wide_stager`'s six at a time) of h[:n_vals] with the tags cleared: each thread's six quads
    read at once (relaxed loads: at the L2, never a stale L1 line), then, where `check` (every
    entry is written in this launch), those not yet carrying `tag` read again, all at once, until
    each does: a round trip a round, however many quads are late (one quad after another took
    up to six in a row once the last entries landed). The whole block calls this; the same
    values and sums, in the same order, as `stage_h`."""
    n_quads = n_vals >> 2
    last = n_quads - 1
    bd = cuda.blockDim.x
    q = cuda.threadIdx.x
    while q < n_quads + cuda.threadIdx.x:
        # a quad past the end reads the last one again (in bounds) and is never stored
        i0 = 4 * min(q, last)
        i1 = 4 * min(q + bd, last)
        i2 = 4 * min(q + 2 * bd, last)
        i3 = 4 * min(q + 3 * bd, last)
        i4 = 4 * min(q + 4 * bd, last)
        i5 = 4 * min(q + 5 * bd, last)
        a0, a1, a2, a3 = ld_relaxed_u32x4(h, i0)
        b0, b1, b2, b3 = ld_relaxed_u32x4(h, i1)
        c0, c1, c2, c3 = ld_relaxed_u32x4(h, i2)
        d0, d1, d2, d3 = ld_relaxed_u32x4(h, i3)
        e0, e1, e2, e3 = ld_relaxed_u32x4(h, i4)
        f0, f1, f2, f3 = ld_relaxed_u32x4(h, i5)
        ok_a = not check or _ok(a0, a1, a2, a3, tag)
        ok_b = not check or _ok(b0, b1, b2, b3, tag)
        ok_c = not check or _ok(c0, c1, c2, c3, tag)
        ok_d = not check or _ok(d0, d1, d2, d3, tag)
        ok_e = not check or _ok(e0, e1, e2, e3, tag)
        ok_f = not check or _ok(f0, f1, f2, f3, tag)
        while not (ok_a and ok_b and ok_c and ok_d and ok_e and ok_f):
            if not SIMULATED:  # the simulator runs a launch's phases in turn: never polls
                cuda.nanosleep(POLL_NS)
            if not ok_a:
                a0, a1, a2, a3 = ld_relaxed_u32x4(h, i0)
            if not ok_b:
                b0, b1, b2, b3 = ld_relaxed_u32x4(h, i1)
            if not ok_c:
                c0, c1, c2, c3 = ld_relaxed_u32x4(h, i2)
            if not ok_d:
                d0, d1, d2, d3 = ld_relaxed_u32x4(h, i3)
            if not ok_e:
                e0, e1, e2, e3 = ld_relaxed_u32x4(h, i4)
            if not ok_f:
                f0, f1, f2, f3 = ld_relaxed_u32x4(h, i5)
            ok_a = _ok(a0, a1, a2, a3, tag)
            ok_b = _ok(b0, b1, b2, b3, tag)
            ok_c = _ok(c0, c1, c2, c3, tag)
            ok_d = _ok(d0, d1, d2, d3, tag)
            ok_e = _ok(e0, e1, e2, e3, tag)
            ok_f = _ok(f0, f1, f2, f3, tag)
        v0, v1, v2, v3 = _values(a0, a1, a2, a3)
        put_quad(xs, q, n_quads, v0, v1, v2, v3, a, pa, b, pb, sums, sums_off)
        v0, v1, v2, v3 = _values(b0, b1, b2, b3)
        put_quad(xs, q + bd, n_quads, v0, v1, v2, v3, a, pa, b, pb, sums, sums_off)
        v0, v1, v2, v3 = _values(c0, c1, c2, c3)
        put_quad(xs, q + 2 * bd, n_quads, v0, v1, v2, v3, a, pa, b, pb, sums, sums_off)
        v0, v1, v2, v3 = _values(d0, d1, d2, d3)
        put_quad(xs, q + 3 * bd, n_quads, v0, v1, v2, v3, a, pa, b, pb, sums, sums_off)
        v0, v1, v2, v3 = _values(e0, e1, e2, e3)
        put_quad(xs, q + 4 * bd, n_quads, v0, v1, v2, v3, a, pa, b, pb, sums, sums_off)
        v0, v1, v2, v3 = _values(f0, f1, f2, f3)
        put_quad(xs, q + 5 * bd, n_quads, v0, v1, v2, v3, a, pa, b, pb, sums, sums_off)
        q += 6 * bd


@cuda.jit(device=True, inline="always")
def _plain4(x, i):
    v0, v1, v2, v3 = ld_x4(x, i)
    return h_plain(v0), h_plain(v1), h_plain(v2), h_plain(v3)


# the down launch's staging of what gate/up wrote, four quads a thread at a time, and six (the
# one-launch kernel with its barrier: 8 x 768 values in one round of 256 threads)
stage_h = wide_stager(4, _plain4)
stage_h6 = wide_stager(6, _plain4)
