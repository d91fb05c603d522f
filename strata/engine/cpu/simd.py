"""Straight-line vector operations for the fused dot products, as numba intrinsics.

A numba loop that reads bytes and updates an accumulator array is vectorized by LLVM only behind
runtime alias checks, paid on every short inner loop (one per 32-value block), and its scalar
bookkeeping outweighs the arithmetic. These intrinsics emit the block's work as LLVM vector
instructions with no loop at all: load the block's bytes as one vector, unpack them, convert to
f32, multiply by the scale and the activations, add into 32 (or 64) accumulators. LLVM lowers the
vectors to whatever the CPU has (AVX-512, AVX2, NEON...).

`fma_*` accumulate a block's values times activations; `put_*` store its values (decoding a row
for a batch of tokens). Every function indexes with `intp` offsets and checks no bounds: callers
guarantee them. `acc`, `buf`, `x`: float32 arrays; `row`: uint8 array.
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


def _times(builder, q, scale):
    return builder.fmul(q, _splat(builder, scale, q.type.count, _F32), flags=["fast"])


def _store(context, builder, aryty, buf, at, values):
    """buf[at : at + n] = values."""
    builder.store(values, _ptr(context, builder, aryty, buf, at, values.type), align=4)


def _plus(builder, v, k: int):
    return builder.add(v, ir.Constant(v.type, k))


# -- the values of one block's bytes, as f32 vectors (unscaled) --------------------------------

def _int8s(context, builder, rowty, row, off):
    """32 signed bytes -> f32x32."""
    return builder.sitofp(_load_bytes(context, builder, rowty, row, off, 32), _vec(_F32, 32))


def _nibbles(context, builder, rowty, row, off):
    """32 bytes -> (low nibbles, high nibbles), each f32x32."""
    b = _load_bytes(context, builder, rowty, row, off, 32)
    lo = builder.and_(b, ir.Constant(_vec(_I8, 32), [15] * 32))
    hi = builder.lshr(b, ir.Constant(_vec(_I8, 32), [4] * 32))
    f = _vec(_F32, 32)
    return builder.uitofp(lo, f), builder.uitofp(hi, f)


def _six_bits(context, builder, rowty, row, ql, qh, nib, top):
    """q = ((row[ql+j] >> nib) & 15) | (((row[qh+j] >> top) & 3) << 4), j < 32 -> f32x32."""
    v8 = _vec(_I8, 32)
    lo = _load_bytes(context, builder, rowty, row, ql, 32)
    hi = _load_bytes(context, builder, rowty, row, qh, 32)
    lo = builder.and_(builder.lshr(lo, _splat(builder, builder.trunc(nib, _I8), 32, _I8)),
                      ir.Constant(v8, [15] * 32))
    hi = builder.and_(builder.lshr(hi, _splat(builder, builder.trunc(top, _I8), 32, _I8)),
                      ir.Constant(v8, [3] * 32))
    q = builder.or_(lo, builder.shl(hi, ir.Constant(v8, [4] * 32)))
    return builder.uitofp(q, _vec(_F32, 32))


def _two_scales(builder, sa, sb):
    """f32x32: sa in lanes 0-15, sb in 16-31."""
    return builder.shuffle_vector(_splat(builder, sa, 32, _F32), _splat(builder, sb, 32, _F32),
                                  ir.Constant(_vec(_I32, 32), list(range(16)) +
                                              list(range(48, 64))))


def _halves(context, builder, rowty, row, off):
    """32 fp16 at byte off -> f32x32 (hardware conversion: see NATIVE_HALF)."""
    h = builder.load(_ptr(context, builder, rowty, row, off, _vec(ir.HalfType(), 32)), align=1)
    return builder.fpext(h, _vec(_F32, 32))


# -- accumulate: acc[lane : lane + n] += values * x[xo : xo + n] -------------------------------

_I = types.intp
_F = types.float32


@intrinsic
def fma_i8x32(typingctx, acc, lane, row, off, x, xo, scale):
    """acc[lane:+32] += scale * int8(row[off:off+32]) * x[xo:+32]   (Q8_0)."""
    sig = types.void(acc, _I, row, _I, x, _I, _F)

    def codegen(context, builder, signature, args):
        acc_a, lane_v, row_a, off_v, x_a, xo_v, sc = args
        at = signature.args
        q = _int8s(context, builder, at[2], row_a, off_v)
        xv = _load_f32(context, builder, at[4], x_a, xo_v, 32)
        _accumulate(context, builder, at[0], acc_a, lane_v, _scaled(builder, q, sc, xv))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def fma_h16x32(typingctx, acc, lane, row, off, x, xo):
    """acc[lane:+32] += (32 fp16 at byte off of row) * x[xo:+32]   (F16 rows)."""
    sig = types.void(acc, _I, row, _I, x, _I)

    def codegen(context, builder, signature, args):
        acc_a, lane_v, row_a, off_v, x_a, xo_v = args
        at = signature.args
        w = _halves(context, builder, at[2], row_a, off_v)
        xv = _load_f32(context, builder, at[4], x_a, xo_v, 32)
        _accumulate(context, builder, at[0], acc_a, lane_v, builder.fmul(w, xv, flags=["fast"]))
        return context.get_dummy_value()

    return sig, codegen


def k4_unpack(builder, q):
    """Q4_K/Q5_K's 12 packed scale bytes (an i8x12 vector) -> (scales, minimums), each i32x8.
    Scale/min k < 4 are the low 6 bits of bytes k / k+4; k >= 4 take 4 bits from byte k+4
    (low / high nibble) and their top 2 bits from the spare top bits of bytes k-4 / k."""
    v32 = _vec(_I32, 8)

    def pick(idx):
        both = ir.Constant(_vec(_I8, 12), ir.Undefined)
        return builder.zext(builder.shuffle_vector(q, both, ir.Constant(v32, idx)), v32)

    def const(vals):
        return ir.Constant(v32, vals)

    def top2(idx):  # bits 6-7 of bytes idx as bits 4-5 (lanes k < 4: zero, shifted out)
        return builder.shl(builder.lshr(pick(idx), const([8] * 4 + [6] * 4)), const([4] * 8))

    sc = builder.or_(builder.and_(pick([0, 1, 2, 3, 8, 9, 10, 11]), const([63] * 4 + [15] * 4)),
                     top2([0, 0, 0, 0, 0, 1, 2, 3]))
    mn = builder.or_(builder.and_(builder.lshr(pick([4, 5, 6, 7, 8, 9, 10, 11]),
                                               const([0] * 4 + [4] * 4)), const([63] * 8)),
                     top2([0, 0, 0, 0, 4, 5, 6, 7]))
    return sc, mn


# -- decode: buf[at : at + n] = the block's values ---------------------------------------------

@intrinsic
def put_i8x32(typingctx, buf, at, row, off, scale):
    """buf[at:+32] = scale * int8(row[off:off+32])   (Q8_0)."""
    sig = types.void(buf, _I, row, _I, _F)

    def codegen(context, builder, signature, args):
        buf_a, at_v, row_a, off_v, sc = args
        q = _int8s(context, builder, signature.args[2], row_a, off_v)
        _store(context, builder, signature.args[0], buf_a, at_v, _times(builder, q, sc))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def put_u4x64(typingctx, buf, at, row, off, scale_lo, scale_hi, min_lo, min_hi):
    """buf[at:+32] = scale_lo * low nibbles - min_lo; buf[at+32:+32] = scale_hi * high
    nibbles - min_hi   (Q4_K)."""
    sig = types.void(buf, _I, row, _I, _F, _F, _F, _F)

    def codegen(context, builder, signature, args):
        buf_a, at_v, row_a, off_v, s_lo, s_hi, m_lo, m_hi = args
        lo, hi = _nibbles(context, builder, signature.args[2], row_a, off_v)
        for v, s, m, where in ((lo, s_lo, m_lo, at_v), (hi, s_hi, m_hi, _plus(builder, at_v, 32))):
            val = builder.fsub(_times(builder, v, s), _splat(builder, m, 32, _F32),
                               flags=["fast"])
            _store(context, builder, signature.args[0], buf_a, where, val)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def put_q6x32(typingctx, buf, at, row, ql, qh, nib, top, scale_a, scale_b):
    """buf[at:+32] = scale * (q - 32), scale_a for values 0-15, scale_b for 16-31   (Q6_K)."""
    sig = types.void(buf, _I, row, _I, _I, types.int64, types.int64, _F, _F)

    def codegen(context, builder, signature, args):
        buf_a, at_v, row_a, ql_v, qh_v, nib_v, top_v, sa, sb = args
        q = _six_bits(context, builder, signature.args[2], row_a, ql_v, qh_v, nib_v, top_v)
        q = builder.fsub(q, ir.Constant(_vec(_F32, 32), [32.0] * 32), flags=["fast"])
        val = builder.fmul(q, _two_scales(builder, sa, sb), flags=["fast"])
        _store(context, builder, signature.args[0], buf_a, at_v, val)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def put_h16x32(typingctx, buf, at, row, off):
    """buf[at:+32] = 32 fp16 at byte off of row, as f32   (F16 rows)."""
    sig = types.void(buf, _I, row, _I)

    def codegen(context, builder, signature, args):
        buf_a, at_v, row_a, off_v = args
        w = _halves(context, builder, signature.args[2], row_a, off_v)
        _store(context, builder, signature.args[0], buf_a, at_v, w)
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


@intrinsic
def _u16_at(typingctx, row, off):
    sig = types.int64(row, types.intp)

    def codegen(context, builder, signature, args):
        row_a, off_v = args
        p = _ptr(context, builder, signature.args[0], row_a, off_v, ir.IntType(16))
        return builder.zext(builder.load(p, align=1), ir.IntType(64))

    return sig, codegen


@njit(cache=True)
def _half_bits_at(row, off):
    return f16_bits_to_f32(_u16_at(row, off))


@njit(cache=True)
def _half_native_at(row, off):
    return _half_at(row, off)


# The fp16 at byte `off` of `row`, as float32 (exact either way). `off` counts bytes from the
# array's first element whatever its rank (a C-contiguous 2-D array of rows works too).
half_at = _half_native_at if NATIVE_HALF else _half_bits_at
