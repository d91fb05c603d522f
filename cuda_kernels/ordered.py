"""Global-memory operations on int32 words with a memory order at GPU scope, for the barrier
across the grid (`gridsync`): an acquire load, release and relaxed stores, an acq_rel add; and
for words other blocks of the same launch poll (`moe_fused`'s tagged h): a relaxed add, a
relaxed store of a float32 word's bits and a relaxed load of four words.

numba offers atomics (relaxed) and `threadfence` (`membar.gl`, a sequentially consistent fence
that every block pays in full); these say in the instruction itself what must be seen before
what, so a block arriving at a barrier publishes its writes with the add that counts it, and a
waiting block polls with plain loads instead of atomic read-modify-writes queued in the L2.

On a GPU (or when compiling PTX) each is one PTX instruction through inline assembly; under the
simulator (one thread at a time, every write seen at once) each is the plain access.
"""

from __future__ import annotations

import numpy as np

from .intrinsics import SIMULATED

__all__ = ["add_acq_rel", "add_relaxed", "ld_acquire", "ld_relaxed", "ld_relaxed_u32x4",
           "st_relaxed", "st_relaxed_bits", "st_release"]

if SIMULATED:
    def ld_acquire(a, i):
        """a[i]."""
        return int(a[i])

    ld_relaxed = ld_acquire

    def st_release(a, i, v):
        """a[i] = v."""
        a[i] = v

    def st_relaxed(a, i, v):
        """a[i] = v."""
        a[i] = v

    def add_acq_rel(a, i, v):
        """a[i] += v; the old value."""
        old = int(a[i])
        a[i] = old + v
        return old

    add_relaxed = add_acq_rel

    def st_relaxed_bits(a, i, bits):
        """a[i] = the float32 whose bit pattern is bits (a: float32)."""
        a[i] = np.uint32(int(bits) & 0xFFFFFFFF).view(np.float32)

    def ld_relaxed_u32x4(a, i):
        """The bit patterns of a[i:i+4] (a: float32 or int32) as four ints."""
        w = np.ascontiguousarray(a[i:i + 4]).view(np.uint32)
        return int(w[0]), int(w[1]), int(w[2]), int(w[3])
else:  # pragma: no cover - compiled for the device (PTX check and GPU tests)
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    _I32, _I64 = ir.IntType(32), ir.IntType(64)

    def _addr(context, builder, aryty, ary, i):
        data = context.make_array(aryty)(context, builder, value=ary).data
        idx = builder.sext(i, _I64) if i.type.width < 64 else i
        return builder.ptrtoint(builder.gep(data, [idx]), _I64)

    def _is_word(a, i):
        return (isinstance(a, types.Array) and a.dtype == types.int32
                and isinstance(i, types.Integer))

    def _call(builder, ret, args, asm, constraint):
        # side effects and a memory clobber: never hoisted out of a polling loop, and no other
        # memory access moved across it by the compiler
        fn = ir.InlineAsm(ir.FunctionType(ret, [a.type for a in args]), asm,
                          constraint + ",~{memory}", side_effect=True)
        return builder.call(fn, args)

    def _load(order):
        @intrinsic
        def load(typingctx, a, i):
            if not _is_word(a, i):
                return None

            def codegen(context, builder, sig, args):
                addr = _addr(context, builder, sig.args[0], args[0], args[1])
                return _call(builder, _I32, [addr], "{ .reg .u64 g; cvta.to.global.u64 g, "
                             f"$1; ld.{order}.gpu.global.b32 $0, [g]; }}", "=r,l")
            return types.int32(a, i), codegen
        return load

    # a[i]. acquire: what was written before a release of this word is seen after it. relaxed:
    # no order (a word a kernel before this one wrote: the launch boundary orders it)
    ld_acquire = _load("acquire")
    ld_relaxed = _load("relaxed")

    def _store(order):
        @intrinsic
        def store(typingctx, a, i, v):
            if not (_is_word(a, i) and isinstance(v, types.Integer)):
                return None

            def codegen(context, builder, sig, args):
                addr = _addr(context, builder, sig.args[0], args[0], args[1])
                val = context.cast(builder, args[2], sig.args[2], types.int32)
                _call(builder, ir.VoidType(), [addr, val], "{ .reg .u64 g; cvta.to.global.u64 "
                      f"g, $0; st.{order}.gpu.global.b32 [g], $1; }}", "l,r")
                return context.get_dummy_value()
            return types.void(a, i, v), codegen
        return store

    st_release = _store("release")  # a[i] = v after every earlier write of this thread
    st_relaxed = _store("relaxed")  # a[i] = v, a strong store with no order of its own

    def _add(order):
        @intrinsic
        def add(typingctx, a, i, v):
            if not (_is_word(a, i) and isinstance(v, types.Integer)):
                return None

            def codegen(context, builder, sig, args):
                addr = _addr(context, builder, sig.args[0], args[0], args[1])
                val = context.cast(builder, args[2], sig.args[2], types.int32)
                return _call(builder, _I32, [addr, val], "{ .reg .u64 g; cvta.to.global.u64 "
                             f"g, $1; atom.{order}.gpu.global.add.u32 $0, [g], $2; }}",
                             "=r,l,r")
            return types.int32(a, i, v), codegen
        return add

    # a[i] += v, the old value. acq_rel: this thread's earlier writes (and those it saw, e.g.
    # its block's before a barrier) are seen by an acquire of the word, and the releases before
    # it are seen by this thread. relaxed: no order (a count that publishes nothing: a block's
    # arrival whose data carries its own tags)
    add_acq_rel = _add("acq_rel")
    add_relaxed = _add("relaxed")

    def _is_float_word(a, i):
        return (isinstance(a, types.Array) and a.dtype == types.float32
                and isinstance(i, types.Integer))

    @intrinsic
    def st_relaxed_bits(typingctx, a, i, bits):
        """a[i] = the float32 of bit pattern `bits` by `st.relaxed.gpu` (a: float32): a word
        another block polls with relaxed loads sees it whole."""
        if not (_is_float_word(a, i) and isinstance(bits, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            addr = _addr(context, builder, sig.args[0], args[0], args[1])
            val = context.cast(builder, args[2], sig.args[2], types.uint32)
            _call(builder, ir.VoidType(), [addr, val], "{ .reg .u64 g; cvta.to.global.u64 g, $0; "
                  "st.relaxed.gpu.global.b32 [g], $1; }", "l,r")
            return context.get_dummy_value()
        return types.void(a, i, bits), codegen

    @intrinsic
    def ld_relaxed_u32x4(typingctx, a, i):
        """The bit patterns of a[i:i+4] (a: float32 or int32, i a multiple of 4, the array
        16-byte aligned) by one `ld.relaxed.gpu` of four words, as four uint32: read at the L2
        each time (a polling loop never sees a stale L1 line), each word whole."""
        if not (isinstance(a, types.Array) and a.dtype in (types.float32, types.int32)
                and isinstance(i, types.Integer)):
            return None
        ret = types.UniTuple(types.uint32, 4)

        def codegen(context, builder, sig, args):
            addr = _addr(context, builder, sig.args[0], args[0], args[1])
            sty = ir.LiteralStructType([_I32] * 4)
            res = _call(builder, sty, [addr], "{ .reg .u64 g; cvta.to.global.u64 g, $4; "
                        "ld.relaxed.gpu.global.v4.b32 {$0, $1, $2, $3}, [g]; }",
                        "=r,=r,=r,=r,l")
            vals = [builder.extract_value(res, j) for j in range(4)]
            return context.make_tuple(builder, ret, vals)
        return ret(a, i), codegen
