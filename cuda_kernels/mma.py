"""Warp-level primitives numba lacks: the f16 tensor-core MMA, `ldmatrix` fragment loads,
`cp.async` global-to-shared copies, f16x2 packing and arithmetic, lane exchange.

On the GPU each primitive is one inline-PTX instruction (`@intrinsic` + `llvmlite.ir.InlineAsm`).
Under the CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`) inline PTX cannot run, so each name is bound
instead to a Python function with the same per-lane semantics (`mma_sim`): the 32 simulated
lanes of a warp meet at a barrier, exchange their fragments, and each gets back exactly the
values the hardware instruction would give it. Tiled kernels written against these names are therefore exercised by
the simulator tests fragment for fragment; only the instruction encoding is left to the PTX
compile check and the GPU tests.

Fragment layout of `mma_16816` (PTX ISA, m16n8k16, .row.col, f16 inputs, f32 accumulators), with
`g = lane >> 2` and `t = lane & 3`; a u32 register holds two f16, the lower index in the low half:
  A (16x16, row-major): a0 = A[g, 2t:2t+2], a1 = A[g+8, 2t:2t+2], a2 = A[g, 2t+8:2t+10],
                        a3 = A[g+8, 2t+8:2t+10]
  B (16x8, k-major):    b0 = B[2t:2t+2, g], b1 = B[2t+8:2t+10, g]
  C, D (16x8, f32):     c0, c1 = C[g, 2t], C[g, 2t+1]; c2, c3 = C[g+8, 2t], C[g+8, 2t+1]

`ldsm_x4(s, i)` (ldmatrix .x4): lane l names the shared-memory row (4 u32 words, 16-byte aligned)
starting at word i; lanes 8m..8m+7 give the 8 rows of matrix m, and every lane receives word
l & 3 of row l >> 2 of each matrix m as its m-th result: exactly the A fragment of a row-major
16x16 tile (rows 0-15 from lanes 0-15 at k 0, from lanes 16-31 at k 8) or the B fragments of two
8-column groups of a tile stored one column per row.
"""

from __future__ import annotations

import os

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

# ----------------------------------------------------------------------------------------------
# GPU: inline PTX.

if SIMULATED:
    from .mma_sim import (  # noqa: F401 (re-exported)
        cp_async16, cp_async16_at, cp_async_commit, cp_async_wait, cp_async_wait_group1, gaddr,
        gaddr1, h2_sub, h2_sub_fma, half2_hi, half2_lo, ldsm_x4, ldsm_x4_at, ldsm_x4_trans,
        ldsm_x4_trans_at, mma_16816, pack_half2, shfl_idx, shfl_xor, smem_u32, syncwarp,
        warp_all)
else:
    from llvmlite import ir
    from numba import cuda, types
    from numba.core import cgutils
    from numba.core.extending import intrinsic

    _F32 = ir.FloatType()
    _I32 = ir.IntType(32)
    _I64 = ir.IntType(64)

    def _addr(context, builder, aryty, ary, idx):
        """Generic address (i64) of element `idx` (a tuple of index values) of an array."""
        arr = context.make_array(aryty)(context, builder, value=ary)
        idx = [builder.sext(v, _I64) if v.type.width < 64 else v for v in idx]
        ptr = cgutils.get_item_pointer2(context, builder, arr.data, cgutils.unpack_tuple(
            builder, arr.shape, aryty.ndim), cgutils.unpack_tuple(builder, arr.strides,
                                                                  aryty.ndim),
            aryty.layout, idx)
        return builder.ptrtoint(ptr, _I64)

    def _ldsm_call(context, builder, ret, op: str, addr):
        """Emit ldmatrix `op` of the row at `addr`: a generic i64 address (converted to the
        shared window) or a 32-bit shared one; the four words as a tuple of type `ret`."""
        generic = addr.type.width == 64
        asm = ir.InlineAsm(
            ir.FunctionType(ir.LiteralStructType([_I32] * 4), [addr.type]),
            ("{ .reg .u64 s; cvta.to.shared.u64 s, $4; " f"{op} {{$0,$1,$2,$3}}, [s]; }}")
            if generic else f"{op} {{$0,$1,$2,$3}}, [$4];",
            "=r,=r,=r,=r," + ("l" if generic else "r") + ",~{memory}", side_effect=True)
        res = builder.call(asm, [addr])
        return context.make_tuple(builder, ret, [builder.extract_value(res, k) for k in range(4)])

    def _ldsm(op: str, what: str, addressed: bool = False):
        """An ldmatrix .m8n8.x4 intrinsic (`op`: its PTX mnemonic) reading a shared u32 array:
        this lane's row starts at word i of it, or (addressed) at 32-bit shared address i."""
        @intrinsic
        def ldsm(typingctx, arr, i):
            ret = types.UniTuple(types.uint32, 4)

            def codegen(context, builder, signature, args):
                addr = (context.cast(builder, args[1], signature.args[1], types.uint32)
                        if addressed else
                        _addr(context, builder, signature.args[0], args[0], [args[1]]))
                return _ldsm_call(context, builder, ret, op, addr)
            return ret(arr, i), codegen
        ldsm.__doc__ = (f"{what}: ldmatrix .m8n8.x4{' .trans' if 'trans' in op else ''}"
                        + (" of the row at a 32-bit shared address (see ldsm_x4)." if addressed
                           else "."))
        return ldsm

    ldsm_x4 = _ldsm("ldmatrix.sync.aligned.m8n8.x4.shared.b16", "A/B fragments")
    ldsm_x4_trans = _ldsm("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                          "transposed fragments (e.g. V)")

    # Addressed forms for hot loops: a kernel takes an array's 32-bit shared address once
    # (`smem_u32`) and a global row's address once a tile (`gaddr`), then passes sums of those and
    # constant offsets; `ldsm_x4` / `cp_async16` compute a 64-bit generic address from the
    # array's data pointer and strides at every call (about six integer instructions each,
    # which made up half of the GEMM's instructions). The array argument is only for the
    # simulator, which has no addresses (its smem_u32 is 0 and gaddr a byte offset).

    @intrinsic
    def smem_u32(typingctx, arr):
        """The 32-bit shared-window address of a shared array's first element."""
        def codegen(context, builder, signature, args):
            addr = _addr(context, builder, signature.args[0], args[0], [ir.Constant(_I64, 0)])
            asm = ir.InlineAsm(ir.FunctionType(_I32, [_I64]),
                               "{ .reg .u64 s; cvta.to.shared.u64 s, $1; cvt.u32.u64 $0, s; }",
                               "=r,l")
            return builder.call(asm, [addr])
        return types.uint32(arr), codegen

    @intrinsic
    def gaddr(typingctx, arr, row, col):
        """The generic (64-bit) address of arr[row, col] of a 2-d device array."""
        def codegen(context, builder, signature, args):
            return _addr(context, builder, signature.args[0], args[0], [args[1], args[2]])
        return types.uint64(arr, row, col), codegen

    @intrinsic
    def gaddr1(typingctx, arr, i):
        """The generic (64-bit) address of arr[i] of a 1-d device array."""
        def codegen(context, builder, signature, args):
            return _addr(context, builder, signature.args[0], args[0], [args[1]])
        return types.uint64(arr, i), codegen

    ldsm_x4_at = _ldsm("ldmatrix.sync.aligned.m8n8.x4.shared.b16", "A/B fragments", True)
    ldsm_x4_trans_at = _ldsm("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                             "transposed fragments (e.g. V)", True)

    @intrinsic
    def cp_async16_at(typingctx, dst, daddr, src, g, valid):
        """cp_async16 to 32-bit shared address `daddr` from generic address `g` (16 bytes;
        zeros when `valid` is false)."""
        def codegen(context, builder, signature, args):
            d = context.cast(builder, args[1], signature.args[1], types.uint32)
            gv = context.cast(builder, args[3], signature.args[3], types.uint64)
            n = builder.select(context.cast(builder, args[4], signature.args[4], types.boolean),
                               ir.Constant(_I32, 16), ir.Constant(_I32, 0))
            asm = ir.InlineAsm(
                ir.FunctionType(ir.VoidType(), [_I32, _I64, _I32]),
                "{ .reg .u64 g; cvta.to.global.u64 g, $1; "
                "cp.async.cg.shared.global [$0], [g], 16, $2; }",
                "r,l,r,~{memory}", side_effect=True)
            builder.call(asm, [d, gv, n])
            return context.get_dummy_value()
        return types.void(dst, daddr, src, g, valid), codegen

    @intrinsic
    def cp_async16(typingctx, dst, i, src, row, col, valid):
        """Start copying src[row, col:col+4] (16 bytes, global) to dst[i:i+4] (shared); zeros
        when `valid` is false (nothing is read). Complete after `cp_async_wait()`."""
        def codegen(context, builder, signature, args):
            d = _addr(context, builder, signature.args[0], args[0], [args[1]])
            s = _addr(context, builder, signature.args[2], args[2], [args[3], args[4]])
            n = builder.select(context.cast(builder, args[5], signature.args[5], types.boolean),
                               ir.Constant(_I32, 16), ir.Constant(_I32, 0))
            asm = ir.InlineAsm(
                ir.FunctionType(ir.VoidType(), [_I64, _I64, _I32]),
                "{ .reg .u64 s, g; cvta.to.shared.u64 s, $0; cvta.to.global.u64 g, $1; "
                "cp.async.cg.shared.global [s], [g], 16, $2; }",
                "l,l,r,~{memory}", side_effect=True)
            builder.call(asm, [d, s, n])
            return context.get_dummy_value()
        return types.void(dst, i, src, row, col, valid), codegen

    def _void_asm(ptx: str, doc: str):
        """An intrinsic () -> None issuing one PTX instruction that orders memory."""
        @intrinsic
        def op(typingctx):
            def codegen(context, builder, signature, args):
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), ptx, "~{memory}",
                                   side_effect=True)
                builder.call(asm, [])
                return context.get_dummy_value()
            return types.void(), codegen
        op.__doc__ = doc
        return op

    cp_async_wait = _void_asm(
        "cp.async.wait_all;",
        "Wait for this thread's cp.async copies (the block barrier then publishes them).")
    cp_async_commit = _void_asm(
        "cp.async.commit_group;",
        "Close this thread's cp.async copies issued since the last commit into one group (an "
        "empty group when there were none, so every thread's group count stays in step).")
    cp_async_wait_group1 = _void_asm(
        "cp.async.wait_group 1;",
        "Wait for all but this thread's newest cp.async group: a ring keeps one step's copies "
        "in flight while the step before it is consumed.")

    @intrinsic
    def h2_sub_fma(typingctx, w, sub, scale, add):
        """(w - sub) * scale + add on two f16 lanes held in u32 words (sub.f16x2, fma.rn.f16x2)."""
        def codegen(context, builder, signature, args):
            args = [context.cast(builder, v, ty, types.uint32)
                    for v, ty in zip(args, signature.args)]
            asm = ir.InlineAsm(ir.FunctionType(_I32, [_I32] * 4),
                               "{ .reg .b32 h; sub.rn.f16x2 h, $1, $2; fma.rn.f16x2 $0, h, $3, $4; }",
                               "=r,r,r,r,r")
            return builder.call(asm, args)
        return types.uint32(w, sub, scale, add), codegen

    @intrinsic
    def h2_sub(typingctx, a, b):
        """a - b on two f16 lanes held in u32 words (sub.rn.f16x2)."""
        def codegen(context, builder, signature, args):
            args = [context.cast(builder, v, ty, types.uint32)
                    for v, ty in zip(args, signature.args)]
            asm = ir.InlineAsm(ir.FunctionType(_I32, [_I32] * 2), "sub.rn.f16x2 $0, $1, $2;",
                               "=r,r,r")
            return builder.call(asm, args)
        return types.uint32(a, b), codegen

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

    @cuda.jit(device=True, inline="always")
    def syncwarp():
        """Barrier of the warp's 32 lanes, ordering their shared-memory accesses."""
        cuda.syncwarp(0xFFFFFFFF)

    @cuda.jit(device=True, inline="always")
    def warp_all(pred):
        """Whether `pred` holds in all 32 lanes (all must take part; one vote)."""
        return cuda.all_sync(0xFFFFFFFF, pred) != 0

    @cuda.jit(device=True, inline="always")
    def shfl_idx(value, src):
        """The value held by lane `src` (per-lane; all 32 lanes must take part)."""
        return cuda.shfl_sync(0xFFFFFFFF, value, src)
