"""Straight-line vector operations for the fused dot products, as numba intrinsics.

A numba loop that reads bytes and updates an accumulator array is vectorized by LLVM only behind
runtime alias checks, paid on every short inner loop (one per 32-value block), and its scalar
bookkeeping outweighs the arithmetic. These intrinsics emit the block's work as LLVM vector
instructions with no loop at all: load the block's bytes as one vector, unpack them, convert to
f32, multiply by the scale and the activations, add into 32 (or 64) accumulators. LLVM lowers the
vectors to whatever the CPU has (AVX-512, AVX2, NEON...).

Every function indexes with `intp` offsets and checks no bounds: callers guarantee them. `acc`,
`x`: float32 arrays; `row`: uint8 array.
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba import njit, types
from numba.core import config
from numba.extending import intrinsic

from strata.quant.scalars import f16_bits_to_f32

_F32 = ir.FloatType()
_I8 = ir.IntType(8)
_I32 = ir.IntType(32)


def _vec(t, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def _ptr(context, builder, aryty, ary, idx, elt):
    """Pointer to element `idx` of a numba array, cast to `elt*`."""
    a = context.make_array(aryty)(context, builder, ary)
    return builder.bitcast(builder.gep(a.data, [idx]), elt.as_pointer())


def _splat(builder, v, n: int, t):
    one = builder.insert_element(ir.Constant(_vec(t, n), ir.Undefined), v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(_vec(t, n), ir.Undefined),
                                  ir.Constant(_vec(_I32, n), [0] * n))


def _accumulate(context, builder, aryty, acc, lane, values):
    """acc[lane : lane + n] += values (an n x f32 vector)."""
    p = _ptr(context, builder, aryty, acc, lane, values.type)
    builder.store(builder.fadd(builder.load(p, align=4), values, flags=["fast"]), p, align=4)


def _load_bytes(context, builder, aryty, row, off, n: int):
    return builder.load(_ptr(context, builder, aryty, row, off, _vec(_I8, n)), align=1)


def _load_f32(context, builder, aryty, x, off, n: int):
    return builder.load(_ptr(context, builder, aryty, x, off, _vec(_F32, n)), align=4)


def _scaled(builder, q, scale, xv):
    """q (f32 vector) * scale (scalar) * xv."""
    s = _splat(builder, scale, q.type.count, _F32)
    return builder.fmul(builder.fmul(q, s, flags=["fast"]), xv, flags=["fast"])


@intrinsic
def fma_i8x32(typingctx, acc, lane, row, off, x, xo, scale):
    """acc[lane:lane+32] += scale * int8(row[off:off+32]) * x[xo:xo+32]   (Q8_0)."""
    sig = types.void(acc, types.intp, row, types.intp, x, types.intp, types.float32)

    def codegen(context, builder, signature, args):
        acc_a, lane_v, row_a, off_v, x_a, xo_v, sc = args
        at = signature.args
        q = builder.sitofp(_load_bytes(context, builder, at[2], row_a, off_v, 32), _vec(_F32, 32))
        xv = _load_f32(context, builder, at[4], x_a, xo_v, 32)
        _accumulate(context, builder, at[0], acc_a, lane_v, _scaled(builder, q, sc, xv))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def fma_u4x64(typingctx, acc, lane, row, off, x, xo, scale_lo, scale_hi):
    """32 bytes at row[off] hold 64 nibbles: low nibbles are values 0-31 (scale_lo, x[xo:+32]),
    high nibbles values 32-63 (scale_hi, x[xo+32:+32]); into acc[lane:lane+64]   (Q4_K)."""
    sig = types.void(acc, types.intp, row, types.intp, x, types.intp, types.float32,
                     types.float32)

    def codegen(context, builder, signature, args):
        acc_a, lane_v, row_a, off_v, x_a, xo_v, s_lo, s_hi = args
        at = signature.args
        b = _load_bytes(context, builder, at[2], row_a, off_v, 32)
        lo = builder.and_(b, ir.Constant(_vec(_I8, 32), [15] * 32))
        hi = builder.lshr(b, ir.Constant(_vec(_I8, 32), [4] * 32))
        x_lo = _load_f32(context, builder, at[4], x_a, xo_v, 32)
        xo_hi = builder.add(xo_v, ir.Constant(xo_v.type, 32))
        x_hi = _load_f32(context, builder, at[4], x_a, xo_hi, 32)
        f = _vec(_F32, 32)
        _accumulate(context, builder, at[0], acc_a, lane_v,
                    _scaled(builder, builder.uitofp(lo, f), s_lo, x_lo))
        _accumulate(context, builder, at[0], acc_a,
                    builder.add(lane_v, ir.Constant(lane_v.type, 32)),
                    _scaled(builder, builder.uitofp(hi, f), s_hi, x_hi))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def fma_q6x32(typingctx, acc, lane, row, ql, qh, nib, top, x, xo, scale_a, scale_b):
    """32 six-bit values q = ((row[ql+j] >> nib) & 15) | (((row[qh+j] >> top) & 3) << 4);
    values 0-15 times scale_a, 16-31 times scale_b, times x[xo:xo+32], into acc[lane:+32]
    (Q6_K without its -32 offset, which the caller takes out)."""
    sig = types.void(acc, types.intp, row, types.intp, types.intp, types.int64, types.int64,
                     x, types.intp, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        acc_a, lane_v, row_a, ql_v, qh_v, nib_v, top_v, x_a, xo_v, sa, sb = args
        at = signature.args
        v8 = _vec(_I8, 32)
        lo = _load_bytes(context, builder, at[2], row_a, ql_v, 32)
        hi = _load_bytes(context, builder, at[2], row_a, qh_v, 32)
        nib8 = _splat(builder, builder.trunc(nib_v, _I8), 32, _I8)
        top8 = _splat(builder, builder.trunc(top_v, _I8), 32, _I8)
        lo = builder.and_(builder.lshr(lo, nib8), ir.Constant(v8, [15] * 32))
        hi = builder.and_(builder.lshr(hi, top8), ir.Constant(v8, [3] * 32))
        q = builder.or_(lo, builder.shl(hi, ir.Constant(v8, [4] * 32)))
        qf = builder.uitofp(q, _vec(_F32, 32))
        s = builder.shuffle_vector(_splat(builder, sa, 32, _F32), _splat(builder, sb, 32, _F32),
                                   ir.Constant(_vec(_I32, 32), list(range(16)) +
                                               list(range(48, 64))))
        xv = _load_f32(context, builder, at[7], x_a, xo_v, 32)
        prod = builder.fmul(builder.fmul(qf, s, flags=["fast"]), xv, flags=["fast"])
        _accumulate(context, builder, at[0], acc_a, lane_v, prod)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def fma_h16x32(typingctx, acc, lane, row, off, x, xo):
    """acc[lane:lane+32] += f16(row[off : off+64] as 32 halves) * x[xo:xo+32]   (F16 rows)."""
    sig = types.void(acc, types.intp, row, types.intp, x, types.intp)

    def codegen(context, builder, signature, args):
        acc_a, lane_v, row_a, off_v, x_a, xo_v = args
        at = signature.args
        h = builder.load(_ptr(context, builder, at[2], row_a, off_v, _vec(ir.HalfType(), 32)),
                         align=1)
        w = builder.fpext(h, _vec(_F32, 32))
        xv = _load_f32(context, builder, at[4], x_a, xo_v, 32)
        _accumulate(context, builder, at[0], acc_a, lane_v, builder.fmul(w, xv, flags=["fast"]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _half_at(typingctx, row, off):
    sig = types.float32(row, types.intp)

    def codegen(context, builder, signature, args):
        row_a, off_v = args
        h = builder.load(_ptr(context, builder, signature.args[0], row_a, off_v, ir.HalfType()),
                         align=1)
        return builder.fpext(h, _F32)

    return sig, codegen


def _native_half() -> bool:
    """Whether LLVM converts halves in hardware here (x86 F16C, every AArch64): without it the
    conversion is a runtime-library call numba cannot resolve, so the bit-level path is used."""
    triple = llvm.get_process_triple()
    if triple.startswith(("aarch64", "arm64")):
        return True
    if not triple.startswith(("x86_64", "i686", "i386")):
        return False
    if config.CPU_NAME or config.CPU_FEATURES:  # a target chosen by the user: only what it says
        return "+f16c" in (config.CPU_FEATURES or "")
    return bool(llvm.get_host_cpu_features().get("f16c"))


NATIVE_HALF = _native_half()


@njit(cache=True)
def _half_bits_at(row, off):
    return f16_bits_to_f32((row[off] | (row[off + 1] << 8)) & 0xFFFF)


@njit(cache=True)
def _half_native_at(row, off):
    return _half_at(row, off)


# The fp16 at byte `off` of `row`, as float32 (exact either way).
half_at = _half_native_at if NATIVE_HALF else _half_bits_at
