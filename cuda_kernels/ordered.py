"""Global-memory operations on int32 words with a memory order at GPU scope, for the barrier
across the grid (`gridsync`): an acquire load, release and relaxed stores, an acq_rel add.

numba offers atomics (relaxed) and `threadfence` (`membar.gl`, a sequentially consistent fence
that every block pays in full); these say in the instruction itself what must be seen before
what, so a block arriving at a barrier publishes its writes with the add that counts it, and a
waiting block polls with plain loads instead of atomic read-modify-writes queued in the L2.

On a GPU (or when compiling PTX) each is one PTX instruction through inline assembly; under the
simulator (one thread at a time, every write seen at once) each is the plain access.
"""

from __future__ import annotations

from .intrinsics import SIMULATED

__all__ = ["add_acq_rel", "ld_acquire", "ld_acquire64", "red_release_add64", "st_relaxed",
           "st_release"]

if SIMULATED:
    def ld_acquire(a, i):
        """a[i]."""
        return int(a[i])

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

    def _u64(a, i):
        return (int(a[i]) & 0xFFFFFFFF) | (int(a[i + 1]) & 0xFFFFFFFF) << 32

    def ld_acquire64(a, i):
        """The unsigned 64-bit word of a[i], a[i + 1] (little-endian; i even)."""
        return _u64(a, i)

    def red_release_add64(a, i, v):
        """That 64-bit word += v."""
        w = (_u64(a, i) + int(v)) & 0xFFFFFFFFFFFFFFFF  # Python ints: no numpy overflow
        lo, hi = w & 0xFFFFFFFF, w >> 32
        a[i] = lo - (1 << 32) if lo >= 1 << 31 else lo
        a[i + 1] = hi - (1 << 32) if hi >= 1 << 31 else hi
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

    def _load_acquire(bits, ret_type, doc):
        @intrinsic
        def load(typingctx, a, i):
            if not _is_word(a, i):
                return None

            def codegen(context, builder, sig, args):
                addr = _addr(context, builder, sig.args[0], args[0], args[1])
                return _call(builder, ir.IntType(bits), [addr],
                             "{ .reg .u64 g; cvta.to.global.u64 g, $1; "
                             f"ld.acquire.gpu.global.b{bits} $0, [g]; }}",
                             f"={'r' if bits == 32 else 'l'},l")
            return ret_type(a, i), codegen
        load.__doc__ = doc
        return load

    ld_acquire = _load_acquire(32, types.int32, "a[i] by `ld.acquire.gpu`: what was written "
                               "before a release of this word is seen after it.")
    ld_acquire64 = _load_acquire(64, types.uint64, "The 64-bit word at a[i] (int32 words a[i], "
                                 "a[i + 1]; 8-byte aligned) by `ld.acquire.gpu`, as uint64.")

    def _write(op, value_type, doc):
        """An intrinsic (a, i, v) -> None: one PTX write `op` of v (as value_type) at a[i]."""
        bits = value_type.bitwidth

        @intrinsic
        def write(typingctx, a, i, v):
            if not (_is_word(a, i) and isinstance(v, types.Integer)):
                return None

            def codegen(context, builder, sig, args):
                addr = _addr(context, builder, sig.args[0], args[0], args[1])
                val = context.cast(builder, args[2], sig.args[2], value_type)
                _call(builder, ir.VoidType(), [addr, val], "{ .reg .u64 g; cvta.to.global.u64 "
                      f"g, $0; {op} [g], $1; }}", f"l,{'r' if bits == 32 else 'l'}")
                return context.get_dummy_value()
            return types.void(a, i, v), codegen
        write.__doc__ = doc
        return write

    st_release = _write("st.release.gpu.global.b32", types.int32,
                        "a[i] = v after every earlier write of this thread.")
    st_relaxed = _write("st.relaxed.gpu.global.b32", types.int32,
                        "a[i] = v, a strong store with no order of its own.")
    red_release_add64 = _write(
        "red.release.gpu.global.add.u64", types.uint64,
        "The 64-bit word at a[i] (int32 words a[i], a[i + 1]) += v by `red.release.gpu` (no "
        "value back: the thread goes on once its earlier writes are ordered before it, without "
        "a round trip for the sum).")

    @intrinsic
    def add_acq_rel(typingctx, a, i, v):
        """a[i] += v by `atom.acq_rel.gpu`; the old value. Release: this thread's earlier
        writes (and those it saw, e.g. its block's before a barrier) are seen by an acquire of
        the word; acquire: the releases before it are seen by this thread."""
        if not (_is_word(a, i) and isinstance(v, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            addr = _addr(context, builder, sig.args[0], args[0], args[1])
            val = context.cast(builder, args[2], sig.args[2], types.int32)
            return _call(builder, _I32, [addr, val], "{ .reg .u64 g; cvta.to.global.u64 g, $1; "
                         "atom.acq_rel.gpu.global.add.u32 $0, [g], $2; }", "=r,l,r")
        return types.int32(a, i, v), codegen
