"""Low-level device helpers the kernels share: typed loads from byte buffers, bit casts, dp4a,
warp reductions.

Each helper has two bodies with one meaning. On a GPU (or when compiling PTX) they are numba
intrinsics that emit the exact instruction (a 4-byte load, `cvt.f32.f16`, `dp4a`, a 16-byte
`ld.global.nc.v4.u32`, warp shuffles). Under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, the
CI test mode) intrinsics cannot run, so each is a plain Python function computing the same value
(`intrinsics_sim`); the simulator has no warp shuffles at all, so the warp reductions are
emulated with a per-block scratch and the simulator's barrier. Integer helpers return values that never rely on wrapping, so
Python ints (simulator) and numba's int64 arithmetic (GPU) agree.

Contract for the emulated warp helpers: every live thread of the block calls them the same number of
times (the kernels keep reductions out of divergent branches).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, config

SIMULATED = bool(config.ENABLE_CUDASIM)
FULL_MASK = 0xFFFFFFFF

__all__ = [
    "SIMULATED", "prmt", "byte_to_f32", "ld_u8", "ld_u16", "ld_u32", "ld_u32_any", "ld_nc_u32x4",
    "ld_x4", "ld_i64x2", "h2f", "u2f", "f2u",
    "dp4a", "warp_sum", "warp_max", "warp_bcast", "warp_argmax", "warp_suffix_sum", "block_sum",
    "block_max", "ld_nc_u32x2", "funnel_r", "ld_f32_at", "ld_u32_at", "quad_sum", "st_x4",
    "ld_w4", "quad_max", "rint_i32",
]


if SIMULATED:
    from .intrinsics_sim import (  # noqa: F401 (re-exported)
        ld_u8, ld_u16, ld_u32, ld_u32_any, ld_nc_u32x4, ld_x4, ld_i64x2, prmt, h2f, u2f, f2u,
        dp4a, warp_sum, warp_max, warp_bcast, warp_argmax, warp_suffix_sum, ld_nc_u32x2, funnel_r,
        ld_f32_at, ld_u32_at, st_x4, quad_sum, quad_max, ld_w4, rint_i32)
else:  # pragma: no cover - compiled for the device (PTX check and GPU tests)
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    _I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)

    def _byte_ptr(context, builder, aryty, ary, off):
        data = context.make_array(aryty)(context, builder, value=ary).data
        off64 = builder.sext(off, _I64) if off.type.width < 64 else off
        return builder.gep(builder.bitcast(data, _I8.as_pointer()), [off64])

    def _loader(width, align):
        llty = ir.IntType(width)
        nbty = {8: types.uint8, 16: types.uint16, 32: types.uint32}[width]

        @intrinsic
        def load(typingctx, a, off):
            if not (isinstance(a, types.Array) and isinstance(off, types.Integer)):
                return None

            def codegen(context, builder, sig, args):
                ptr = _byte_ptr(context, builder, sig.args[0], args[0], args[1])
                return builder.load(builder.bitcast(ptr, llty.as_pointer()), align=align)
            return nbty(a, off), codegen
        return load

    _ld_u8 = _loader(8, 1)  # raw loads: no negative-index wraparound code
    _ld_u16 = _loader(16, 2)
    _ld_u32 = _loader(32, 4)

    @intrinsic
    def _fshr(typingctx, lo, hi, s):
        # (hi:lo) >> s, low word; the NVVM front end rejects llvm.fshr, so the PTX is written out.
        def codegen(context, builder, sig, args):
            vals = [builder.trunc(v, _I32) if v.type.width > 32 else v for v in args]
            asm = ir.InlineAsm(ir.FunctionType(_I32, [_I32] * 3),
                               "shf.r.clamp.b32 $0, $1, $2, $3;", "=r,r,r,r")
            return builder.call(asm, vals)
        return types.uint32(lo, hi, s), codegen

    @intrinsic
    def ld_nc_u32x4(typingctx, a, off):
        """Four u32 at a 16-aligned byte offset, one `ld.global.nc.v4.u32`."""
        ret = types.UniTuple(types.uint32, 4)

        def codegen(context, builder, sig, args):
            ptr = _byte_ptr(context, builder, sig.args[0], args[0], args[1])
            addr = builder.ptrtoint(ptr, _I64)
            sty = ir.LiteralStructType([_I32] * 4)
            asm = ir.InlineAsm(
                ir.FunctionType(sty, [_I64]),
                "{ .reg .u64 g; cvta.to.global.u64 g, $4; ld.global.nc.v4.u32 {$0,$1,$2,$3}, [g]; }",
                "=r,=r,=r,=r,l")
            res = builder.call(asm, [addr])
            vals = [builder.extract_value(res, i) for i in range(4)]
            return context.make_tuple(builder, ret, vals)
        return ret(a, off), codegen

    @intrinsic
    def ld_x4(typingctx, x, i):
        """x[i:i+4] of a float32 (16-aligned) or float16 (8-aligned) array as four float32."""
        if not (isinstance(x, types.Array) and x.dtype in (types.float32, types.float16)):
            return None
        ret = types.UniTuple(types.float32, 4)
        is_half = x.dtype == types.float16

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, value=args[0]).data
            idx = builder.sext(args[1], _I64) if args[1].type.width < 64 else args[1]
            elt = ir.HalfType() if is_half else ir.FloatType()
            vty = ir.VectorType(elt, 4)
            ptr = builder.bitcast(builder.gep(data, [idx]), vty.as_pointer())
            vec = builder.load(ptr, align=8 if is_half else 16)
            vals = [builder.extract_element(vec, ir.Constant(_I32, k)) for k in range(4)]
            if is_half:
                vals = [builder.fpext(v, ir.FloatType()) for v in vals]
            return context.make_tuple(builder, ret, vals)
        return ret(x, i), codegen

    def _vector_load(elt, ll_elt, n):
        """An intrinsic (x, i) -> x[i:i+n] of an `elt` array whose start is 16-byte aligned,
        n * size 16 bytes, i a multiple of n: one 16-byte load, and no negative-index
        wraparound arithmetic (numba adds it to every x[i] of a signed i it cannot prove
        non-negative)."""
        ret = types.UniTuple(elt, n)

        @intrinsic
        def load(typingctx, x, i):
            if not (isinstance(x, types.Array) and x.dtype == elt):
                return None

            def codegen(context, builder, sig, args):
                data = context.make_array(sig.args[0])(context, builder, value=args[0]).data
                idx = builder.sext(args[1], _I64) if args[1].type.width < 64 else args[1]
                vty = ir.VectorType(ll_elt, n)
                ptr = builder.bitcast(builder.gep(data, [idx]), vty.as_pointer())
                vec = builder.load(ptr, align=16)
                vals = [builder.extract_element(vec, ir.Constant(_I32, k)) for k in range(n)]
                return context.make_tuple(builder, ret, vals)
            return ret(x, i), codegen
        return load

    ld_i64x2 = _vector_load(types.int64, _I64, 2)
    ld_w4 = _vector_load(types.uint32, _I32, 4)

    @intrinsic
    def _prmt(typingctx, a, b, sel):
        def codegen(context, builder, sig, args):
            vals = [builder.trunc(v, _I32) if v.type.width > 32 else v for v in args]
            asm = ir.InlineAsm(ir.FunctionType(_I32, [_I32] * 3), "prmt.b32 $0, $1, $2, $3;",
                               "=r,r,r,r")
            return builder.call(asm, vals)
        return types.uint32(a, b, sel), codegen

    @cuda.jit(device=True, inline="always")
    def prmt(a, b, sel):
        return _prmt(a, b, sel)

    @intrinsic
    def h2f(typingctx, bits):
        """The IEEE half whose bit pattern is the low 16 bits of `bits`, as float32."""
        def codegen(context, builder, sig, args):
            v = args[0]
            v = builder.trunc(v, _I16) if v.type.width > 16 else v
            return builder.fpext(builder.bitcast(v, ir.HalfType()), ir.FloatType())
        return types.float32(bits), codegen

    @intrinsic
    def u2f(typingctx, bits):
        """The float32 whose bit pattern is `bits`."""
        def codegen(context, builder, sig, args):
            v = args[0]
            v = builder.trunc(v, _I32) if v.type.width > 32 else v
            return builder.bitcast(v, ir.FloatType())
        return types.float32(bits), codegen

    @intrinsic
    def f2u(typingctx, x):
        """The bit pattern of float32 `x`."""
        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], _I32)
        return types.uint32(types.float32), codegen

    @intrinsic
    def _dp4a(typingctx, a, b, c):
        def codegen(context, builder, sig, args):
            vals = [builder.trunc(v, _I32) if v.type.width > 32 else v for v in args]
            asm = ir.InlineAsm(ir.FunctionType(_I32, [_I32] * 3),
                               "dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r")
            return builder.call(asm, vals)
        return types.int32(a, b, c), codegen

    @cuda.jit(device=True, inline="always")
    def ld_u8(a, off):
        return np.int32(_ld_u8(a, off))

    @cuda.jit(device=True, inline="always")
    def ld_u16(a, off):
        return _ld_u16(a, off)

    @cuda.jit(device=True, inline="always")
    def ld_u32(a, off):
        return _ld_u32(a, off)

    @cuda.jit(device=True, inline="always")
    def ld_u32_any(a, off):
        # the next word only when misaligned (else re-read the same one): never past the end
        base = off & ~3
        sh = off & 3
        return _fshr(_ld_u32(a, base), _ld_u32(a, base + (4 if sh else 0)), sh * 8)

    @cuda.jit(device=True, inline="always")
    def dp4a(a, b, c):
        return _dp4a(a, b, c)

    @cuda.jit(device=True, inline="always")
    def warp_sum(v):
        v += cuda.shfl_xor_sync(FULL_MASK, v, 16)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 8)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 4)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 2)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 1)
        return v

    @cuda.jit(device=True, inline="always")
    def warp_max(v):
        v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 16))
        v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 8))
        v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 4))
        v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 2))
        v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 1))
        return v

    @cuda.jit(device=True, inline="always")
    def warp_bcast(v, lane):
        return cuda.shfl_sync(FULL_MASK, v, lane)

    @cuda.jit(device=True, inline="always")
    def _argmax_step(v, i, off):
        ov = cuda.shfl_xor_sync(FULL_MASK, v, off)
        oi = cuda.shfl_xor_sync(FULL_MASK, i, off)
        if ov > v or (ov == v and oi < i):
            return ov, oi
        return v, i

    @cuda.jit(device=True, inline="always")
    def warp_argmax(v, i):
        v, i = _argmax_step(v, i, 16)
        v, i = _argmax_step(v, i, 8)
        v, i = _argmax_step(v, i, 4)
        v, i = _argmax_step(v, i, 2)
        v, i = _argmax_step(v, i, 1)
        return v, i

    @cuda.jit(device=True, inline="always")
    def warp_suffix_sum(v):
        lane = cuda.laneid
        for off in (1, 2, 4, 8, 16):
            o = cuda.shfl_down_sync(FULL_MASK, v, off)
            if lane + off < 32:
                v += o
        return v

    @intrinsic
    def ld_nc_u32x2(typingctx, a, off):
        """Two u32 at an 8-aligned byte offset, one `ld.global.nc.v2.u32`."""
        ret = types.UniTuple(types.uint32, 2)

        def codegen(context, builder, sig, args):
            ptr = _byte_ptr(context, builder, sig.args[0], args[0], args[1])
            addr = builder.ptrtoint(ptr, _I64)
            sty = ir.LiteralStructType([_I32] * 2)
            asm = ir.InlineAsm(
                ir.FunctionType(sty, [_I64]),
                "{ .reg .u64 g; cvta.to.global.u64 g, $2; ld.global.nc.v2.u32 {$0,$1}, [g]; }",
                "=r,=r,l")
            res = builder.call(asm, [addr])
            vals = [builder.extract_value(res, i) for i in range(2)]
            return context.make_tuple(builder, ret, vals)
        return ret(a, off), codegen

    @cuda.jit(device=True, inline="always")
    def funnel_r(lo, hi, sh):
        return _fshr(lo, hi, sh)

    def _word_loader(result_type):
        @intrinsic
        def load(typingctx, a, off):
            if not (isinstance(a, types.Array) and isinstance(off, types.Integer)):
                return None

            def codegen(context, builder, sig, args):
                ptr = _byte_ptr(context, builder, sig.args[0], args[0], args[1])
                llty = ir.FloatType() if result_type == types.float32 else _I32
                return builder.load(builder.bitcast(ptr, llty.as_pointer()), align=4)
            return result_type(a, off), codegen
        return load

    ld_f32_at = _word_loader(types.float32)
    ld_u32_at = _word_loader(types.uint32)

    @intrinsic
    def st_x4(typingctx, xs, i, v0, v1, v2, v3):
        """xs[i:i+4] = v0..v3, one 16-byte store (a float32 or uint32 array, global or shared,
        16-byte aligned; i a multiple of 4). A warp's 16-byte stores to rows of 80 bytes fill
        whole shared-memory wavefronts, where four 4-byte stores to the same rows conflict."""
        if not (isinstance(xs, types.Array) and xs.dtype in (types.float32, types.uint32)):
            return None
        elt = xs.dtype

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, value=args[0]).data
            idx = builder.sext(args[1], _I64) if args[1].type.width < 64 else args[1]
            ll = ir.FloatType() if elt == types.float32 else _I32
            vty = ir.VectorType(ll, 4)
            vec = ir.Constant(vty, ir.Undefined)
            for k in range(4):
                v = context.cast(builder, args[2 + k], sig.args[2 + k], elt)
                vec = builder.insert_element(vec, v, ir.Constant(_I32, k))
            ptr = builder.bitcast(builder.gep(data, [idx]), vty.as_pointer())
            builder.store(vec, ptr, align=16)
            return context.get_dummy_value()
        return types.void(xs, i, v0, v1, v2, v3), codegen

    @cuda.jit(device=True, inline="always")
    def quad_sum(v):
        v += cuda.shfl_xor_sync(FULL_MASK, v, 1)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 2)
        return v

    @cuda.jit(device=True, inline="always")
    def quad_max(v):
        v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 1))
        v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 2))
        return v

    @intrinsic
    def rint_i32(typingctx, v):
        """float32 v rounded to the nearest integer, ties to even: one `cvt.rni.s32.f32` (an
        add of 1.5 * 2^23 would do it too, but NVVM may fuse the multiply before it into an
        FMA, and then round a different value than the CPU engine's `np.rint(x * inv)`)."""
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(_I32, [ir.FloatType()]),
                               "cvt.rni.s32.f32 $0, $1;", "=r,f")
            return builder.call(asm, [args[0]])
        return types.int32(types.float32), codegen


@cuda.jit(device=True, inline="always")
def block_sum(v, scratch):
    """Sum of `v` over the block, in every thread. `scratch`: a shared float32 array of >= 32
    entries the caller owns; every thread of the block must call this (it synchronises)."""
    lane = cuda.threadIdx.x & 31
    n_warps = (cuda.blockDim.x + 31) >> 5
    s = warp_sum(v)
    if lane == 0:
        scratch[cuda.threadIdx.x >> 5] = s
    cuda.syncthreads()
    t = scratch[lane] if lane < n_warps else np.float32(0.0)
    t = warp_sum(t)
    cuda.syncthreads()
    return t


@cuda.jit(device=True, inline="always")
def block_max(v, scratch):
    """Max of `v` over the block, in every thread (same rules as block_sum)."""
    lane = cuda.threadIdx.x & 31
    n_warps = (cuda.blockDim.x + 31) >> 5
    s = warp_max(v)
    if lane == 0:
        scratch[cuda.threadIdx.x >> 5] = s
    cuda.syncthreads()
    t = scratch[lane] if lane < n_warps else scratch[0]
    t = warp_max(t)
    cuda.syncthreads()
    return t


MAGIC_2P23 = 0x4B000000       # float32 bits of 2^23: OR-ing a byte u into its low bits gives 2^23+u
F_2P23 = np.float32(8388608.0)


@cuda.jit(device=True, inline="always")
def byte_to_f32(w, b, bias):
    """Byte b (a compile-time 0..3) of word w, as float32, minus `bias` (float32, 2^23 + offset):
    one byte permute and one add, no integer-to-float conversion."""
    return u2f(prmt(w, MAGIC_2P23, 0x7440 | b)) - bias


if SIMULATED:
    # the device body, kept: tests/unit/test_intrinsics_sim.py holds the one below to it
    byte_to_f32_device = byte_to_f32

    def byte_to_f32(w, b, bias):
        """The simulator's byte_to_f32: the same float32 (2^23 + the byte, minus bias) without
        the permute and the bit cast, which took a tenth of the engine test's time."""
        return np.float32(8388608.0 + ((int(w) >> (8 * b)) & 0xFF)) - bias
