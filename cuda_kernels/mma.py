"""Warp-level primitives numba lacks: the f16 tensor-core MMA, f16x2 packing, lane exchange.

On the GPU each primitive is one inline-PTX instruction (`@intrinsic` + `llvmlite.ir.InlineAsm`).
Under the CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`) inline PTX cannot run, so each name is bound
instead to a Python function with the same per-lane semantics: the 32 simulated lanes of a warp
meet at a barrier, exchange their fragments, and each gets back exactly the values the hardware
instruction would give it. Tiled kernels written against these names are therefore exercised by
the simulator tests fragment for fragment; only the instruction encoding is left to the PTX
compile check and the GPU tests.

Fragment layout of `mma_16816` (PTX ISA, m16n8k16, .row.col, f16 inputs, f32 accumulators), with
`g = lane >> 2` and `t = lane & 3`; a u32 register holds two f16, the lower index in the low half:
  A (16x16, row-major): a0 = A[g, 2t:2t+2], a1 = A[g+8, 2t:2t+2], a2 = A[g, 2t+8:2t+10],
                        a3 = A[g+8, 2t+8:2t+10]
  B (16x8, k-major):    b0 = B[2t:2t+2, g], b1 = B[2t+8:2t+10, g]
  C, D (16x8, f32):     c0, c1 = C[g, 2t], C[g, 2t+1]; c2, c3 = C[g+8, 2t], C[g+8, 2t+1]
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

# ----------------------------------------------------------------------------------------------
# Simulator: lanes of one simulated warp meet at a barrier to exchange values.


class _WarpExchange:
    """All-gather among the 32 lanes of one simulated warp; a thread computes the shared result."""

    def __init__(self):
        self.slots = [None] * 32
        self.result = None
        self.barrier = threading.Barrier(32, timeout=120)

    def run(self, lane, value, combine):
        """Every lane passes its `value`; one lane computes `combine(slots)`; all get the result."""
        self.slots[lane] = value
        if self.barrier.wait() == 0:
            self.result = combine(self.slots)
        self.barrier.wait()
        return self.result


_exchanges: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_exchanges_lock = threading.Lock()


def _warp_exchange():
    """(exchange of the calling simulated thread's warp, its lane). Blocks must be whole warps."""
    me = threading.current_thread()
    manager = me._manager  # the simulator's BlockManager: one per block launch
    warp = me.thread_id // 32
    with _exchanges_lock:
        per_block = _exchanges.setdefault(manager, {})
        ex = per_block.get(warp)
        if ex is None:
            ex = per_block[warp] = _WarpExchange()
    return ex, me.thread_id % 32


_LANE = np.arange(32)
_G, _T = _LANE >> 2, _LANE & 3
# Rows/columns of the 8 halves each lane holds of A, the 4 of B, the 4 accumulators of C.
_A_ROW = np.stack([_G, _G, _G + 8, _G + 8, _G, _G, _G + 8, _G + 8], axis=1)
_A_COL = np.stack([2 * _T, 2 * _T + 1] * 2 + [2 * _T + 8, 2 * _T + 9] * 2, axis=1)
_B_ROW = np.stack([2 * _T, 2 * _T + 1, 2 * _T + 8, 2 * _T + 9], axis=1)
_B_COL = np.stack([_G] * 4, axis=1)
_C_ROW = np.stack([_G, _G, _G + 8, _G + 8], axis=1)
_C_COL = np.stack([2 * _T, 2 * _T + 1, 2 * _T, 2 * _T + 1], axis=1)


def _mma_combine(slots):
    regs = np.array([s[:6] for s in slots], dtype=np.uint32)  # [32 lanes, a0..a3 b0 b1]
    halves_a = regs[:, :4].view(np.float16).astype(np.float64)  # [32, 8]
    halves_b = regs[:, 4:6].view(np.float16).astype(np.float64)  # [32, 4]
    acc = np.array([s[6:] for s in slots], dtype=np.float32).astype(np.float64)  # [32, 4]
    a = np.zeros((16, 16))
    b = np.zeros((16, 8))
    c = np.zeros((16, 8))
    a[_A_ROW, _A_COL] = halves_a
    b[_B_ROW, _B_COL] = halves_b
    c[_C_ROW, _C_COL] = acc
    d = (a @ b + c).astype(np.float32)
    return d[_C_ROW, _C_COL]  # [32, 4]


def _mma_16816_sim(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    ex, lane = _warp_exchange()
    d = ex.run(lane, (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3), _mma_combine)
    return np.float32(d[lane, 0]), np.float32(d[lane, 1]), np.float32(d[lane, 2]), \
        np.float32(d[lane, 3])


def _shfl_xor_sim(value, lane_mask):
    ex, lane = _warp_exchange()
    values = ex.run(lane, value, list)
    return values[lane ^ lane_mask]


def _pack_half2_sim(lo, hi):
    pair = np.array([lo, hi], dtype=np.float32).astype(np.float16)
    return np.uint32(pair.view(np.uint32)[0])


def _half2_lo_sim(word):
    return np.float32(np.array([word], dtype=np.uint32).view(np.float16)[0])


def _half2_hi_sim(word):
    return np.float32(np.array([word], dtype=np.uint32).view(np.float16)[1])


# ----------------------------------------------------------------------------------------------
# GPU: inline PTX.

if SIMULATED:
    mma_16816 = _mma_16816_sim
    shfl_xor = _shfl_xor_sim
    pack_half2 = _pack_half2_sim
    half2_lo = _half2_lo_sim
    half2_hi = _half2_hi_sim
else:
    from llvmlite import ir
    from numba import cuda, types
    from numba.core.extending import intrinsic

    _F32 = ir.FloatType()
    _I32 = ir.IntType(32)

    @intrinsic
    def mma_16816(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A @ B + C for one 16x16x8 warp tile: f16 inputs (u32 pairs), f32 accumulators."""
        u32, f32 = types.uint32, types.float32
        sig = types.UniTuple(f32, 4)(u32, u32, u32, u32, u32, u32, f32, f32, f32, f32)

        def codegen(context, builder, signature, args):
            args = [context.cast(builder, v, ty, to)
                    for v, ty, to in zip(args, signature.args, sig.args)]
            fnty = ir.FunctionType(ir.LiteralStructType([_F32] * 4), [_I32] * 6 + [_F32] * 4)
            asm = ir.InlineAsm(
                fnty,
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
                "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
            res = builder.call(asm, args)
            parts = [builder.extract_value(res, i) for i in range(4)]
            return context.make_tuple(builder, signature.return_type, parts)

        return sig, codegen

    @intrinsic
    def pack_half2(typingctx, lo, hi):
        """Two f32 rounded (to nearest even) into one u32 holding f16 `lo` (low) and `hi`."""
        sig = types.uint32(types.float32, types.float32)

        def codegen(context, builder, signature, args):
            args = [context.cast(builder, v, ty, types.float32)
                    for v, ty in zip(args, signature.args)]
            fnty = ir.FunctionType(_I32, [_F32, _F32])
            asm = ir.InlineAsm(fnty, "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f")
            return builder.call(asm, args)

        return sig, codegen

    def _half_of(which):
        ptx = ("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; cvt.f32.f16 $0, %s; }" % which)

        @intrinsic
        def half(typingctx, word):
            sig = types.float32(types.uint32)

            def codegen(context, builder, signature, args):
                v = context.cast(builder, args[0], signature.args[0], types.uint32)
                asm = ir.InlineAsm(ir.FunctionType(_F32, [_I32]), ptx, "=f,r")
                return builder.call(asm, [v])

            return sig, codegen

        return half

    half2_lo = _half_of("lo")
    half2_hi = _half_of("hi")

    @cuda.jit(device=True, inline="always")
    def shfl_xor(value, lane_mask):
        """The value held by lane `lane ^ lane_mask` (all 32 lanes must take part)."""
        return cuda.shfl_xor_sync(0xFFFFFFFF, value, lane_mask)
