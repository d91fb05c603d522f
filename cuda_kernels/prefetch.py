"""L2 prefetches of byte spans a kernel will read later in the same launch: the request goes out
now, no register waits for it, and the later load finds the bytes in the L2.

Where: the one-launch MoE (`moe_fused`) reads its down rows after the barrier across the grid
as a chain of dependent steps a warp, while the memory idles during a block's wait at the
barrier and its staging of h. Prefetches issued once the experts were resolved, during gate/up,
made it slower on the H200 (`bench/results/2026-12-04_kernels_moe_prefetch.json`: its phases
are throughput-bound). Issued at a block's barrier arrival they may fill the wait instead
(`moe_fused.PREFETCH_AT_ARRIVAL`, a variant for `bench/probes/moe_fused_variants.py`, off
until measured).

Two forms: `prefetch_l2` (`prefetch.global.L2`, one 128-byte line an instruction, any GPU) and
`bulk_prefetch_l2` (`cp.async.bulk.prefetch.L2.global`, a whole span in one instruction: sm_90
and later). Under the simulator both do nothing (a prefetch changes no value).
"""

from __future__ import annotations

from numba import cuda

from .intrinsics import SIMULATED

__all__ = ["LINE", "bulk_prefetch_l2", "prefetch_l2", "prefetch_spans"]

LINE = 128  # bytes of an L2 line, the span one `prefetch.global.L2` brings in

if SIMULATED:
    def prefetch_l2(a, off):
        """Nothing (the simulator has no cache)."""

    def bulk_prefetch_l2(a, off, n_bytes):
        """Nothing (the simulator has no cache)."""
else:  # pragma: no cover - compiled for the device (PTX check and GPU tests)
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    _I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)

    def _addr(context, builder, aryty, ary, off):
        data = context.make_array(aryty)(context, builder, value=ary).data
        off64 = builder.sext(off, _I64) if off.type.width < 64 else off
        return builder.ptrtoint(builder.gep(builder.bitcast(data, _I8.as_pointer()), [off64]),
                                _I64)

    def _ok(a, *ints):
        return isinstance(a, types.Array) and all(isinstance(i, types.Integer) for i in ints)

    @intrinsic
    def prefetch_l2(typingctx, a, off):
        """The L2 line holding byte `off` of a (a device or mapped host buffer)."""
        if not _ok(a, off):
            return None

        def codegen(context, builder, sig, args):
            addr = _addr(context, builder, sig.args[0], args[0], args[1])
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I64]),
                               "{ .reg .u64 g; cvta.to.global.u64 g, $0; prefetch.global.L2 [g]; }",
                               "l", side_effect=True)
            builder.call(asm, [addr])
            return context.get_dummy_value()
        return types.void(a, off), codegen

    @intrinsic
    def bulk_prefetch_l2(typingctx, a, off, n_bytes):
        """Bytes [off, off + n_bytes) of a: off 16-aligned in memory, n_bytes a multiple of 16."""
        if not _ok(a, off, n_bytes):
            return None

        def codegen(context, builder, sig, args):
            addr = _addr(context, builder, sig.args[0], args[0], args[1])
            size = args[2]
            size = builder.trunc(size, _I32) if size.type.width > 32 else size
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I64, _I32]),
                               "{ .reg .u64 g; cvta.to.global.u64 g, $0; "
                               "cp.async.bulk.prefetch.L2.global [g], $1; }",
                               "l,r", side_effect=True)
            builder.call(asm, [addr, size])
            return context.get_dummy_value()
        return types.void(a, off, n_bytes), codegen


@cuda.jit(device=True, inline="always")
def prefetch_spans(buf, s_where, s_base, k, rel, n_bytes, bulk):
    """Every thread of the block: the L2 lines of the k spans [s_base[e] + rel, + n_bytes) of buf
    whose s_where[e] == 0 (resident in buf; the others are not prefetched). bulk: one
    `cp.async.bulk` prefetch a span by thread e (its ends widened to 16 bytes within buf)."""
    t = cuda.threadIdx.x
    if n_bytes <= 0:
        return
    if bulk:
        if t < k and s_where[t] == 0:
            lo = (s_base[t] + rel) & ~15
            hi = min((s_base[t] + rel + n_bytes + 15) & ~15, buf.shape[0] & ~15)
            if hi > lo:
                bulk_prefetch_l2(buf, lo, hi - lo)
        return
    n_lines = (n_bytes + LINE - 1) // LINE + 1  # a span off the line grid touches one more
    for i in range(t, k * n_lines, cuda.blockDim.x):
        e = i // n_lines
        if s_where[e] == 0:
            start = s_base[e] + rel
            prefetch_l2(buf, min((start & ~(LINE - 1)) + (i - e * n_lines) * LINE,
                                 start + n_bytes - 1))
