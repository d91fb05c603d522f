"""Integer dot products of K-quant super-blocks with 8-bit activations, as numba intrinsics.

The activations are quantized once per matmul (`idot.quantize_x8`): x[i] ~ dx[i // 32] * qx[i]
with qx int8. A weight sub-block's unsigned codes times its 32 activation bytes are summed in
32-bit integers: `vpdpbusd` where the CPU has VNNI (four byte products per 32-bit lane per
instruction), else widening to 16 bits and pairwise multiply-adds (`pmaddwd` on x86). One f32
multiply-add per sub-block then applies weight scale * activation scale. The formats' offsets
(Q4_K/Q5_K minimums, Q6_K's -32) are taken out against sums of 16 quantized activations (`qs16`,
f32), so a dot product is the dequantized row times the quantized activations.

Each intrinsic handles the super-block at byte `o` of `w` (flat: `w` may be the whole 2-D matrix,
so no row view is made per row) whose activations are super-block `b` of qx, and adds its share of
the dot product into eight f32 accumulators acc[lane:lane+8]; the caller sums them when the row
ends. Offsets are `intp` and unchecked: callers guarantee them. `row`: uint8, `qx`: int8, `dx`, `qs16`, `acc`: float32.
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import config
from numba.extending import intrinsic

from strata.engine.cpu.simd import (
    _F32,
    _I8,
    _I32,
    _load_bytes,
    _load_f32,
    _ptr,
    _splat,
    _vec,
    k4_unpack,
)

_I16 = ir.IntType(16)
_I = types.intp
_F = types.float32
_V8I32 = _vec(_I32, 8)
_V8F32 = _vec(_F32, 8)
_INTP = ir.IntType(64)


def _has_vnni() -> bool:
    """Whether LLVM may emit the 256-bit byte dot product (AVX-VNNI, or AVX512-VNNI with VL)."""
    if not llvm.get_process_triple().startswith("x86_64"):
        return False
    if config.CPU_NAME or config.CPU_FEATURES:  # a target chosen by the user: only what it says
        feats = config.CPU_FEATURES or ""
        return "+avxvnni" in feats or ("+avx512vnni" in feats and "+avx512vl" in feats)
    f = llvm.get_host_cpu_features()
    return bool(f.get("avxvnni") or (f.get("avx512vnni") and f.get("avx512vl")))


VNNI = _has_vnni()


def _dot4_vnni(builder, u, s):
    """u: unsigned i8x32, s: signed i8x32 -> i32x8, lane k = sum of products 4k..4k+3."""
    fnty = ir.FunctionType(_V8I32, [_V8I32, _V8I32, _V8I32])
    fn = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.256", fnty=fnty)
    zero = ir.Constant(_V8I32, [0] * 8)
    return builder.call(fn, [zero, builder.bitcast(u, _V8I32), builder.bitcast(s, _V8I32)])


def _pairs(builder, v, n: int):
    """Sum of adjacent lanes of an n-lane vector -> n/2 lanes."""
    idx = _vec(_I32, n // 2)
    ev = builder.shuffle_vector(v, v, ir.Constant(idx, list(range(0, n, 2))))
    od = builder.shuffle_vector(v, v, ir.Constant(idx, list(range(1, n, 2))))
    return builder.add(ev, od)


def _dot4_generic(builder, u, s):
    """`_dot4_vnni` for any CPU: codes < 128 and int8 activations widened to i16, products
    summed in pairs in 32 bits (the pmaddwd pattern), then pairs of pairs."""
    a = builder.sext(builder.zext(u, _vec(_I16, 32)), _vec(_I32, 32))
    b = builder.sext(builder.sext(s, _vec(_I16, 32)), _vec(_I32, 32))
    return _pairs(builder, _pairs(builder, builder.mul(a, b), 32), 16)


# How far ahead of the super-block being computed its row's bytes are requested. Measured on the
# 2-core Xeon (one thread, random experts of the 30B shape, Q4_K_M): none 6.4 GB/s, 1 KiB 8.4,
# 2 KiB 9.2, 4 KiB 10.1.
PREFETCH_BYTES = 4096


def _prefetch_ahead(context, builder, aryty, ary, o, n_bytes: int):
    """Ask for the lines of the super-block PREFETCH_BYTES ahead of byte o (a row streams from
    memory: the hardware prefetcher alone leaves the core waiting). Past the end is harmless."""
    fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), _I32, _I32, _I32])
    fn = builder.module.declare_intrinsic("llvm.prefetch", [ir.IntType(8).as_pointer()], fnty)
    for line in range(0, n_bytes, 64):
        p = _ptr(context, builder, aryty, ary,
                 builder.add(o, ir.Constant(o.type, PREFETCH_BYTES + line)), ir.IntType(8))
        builder.call(fn, [p, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


def _lane(builder, v, k: int, n: int = 8):
    """Lane k of v broadcast to n lanes."""
    return builder.shuffle_vector(v, v, ir.Constant(_vec(_I32, n), [k] * n))


def _pick(builder, v, idx):
    return builder.shuffle_vector(v, v, ir.Constant(_vec(_I32, len(idx)), idx))


def _fmul(builder, *vs):
    out = vs[0]
    for v in vs[1:]:
        out = builder.fmul(out, v, flags=["fast"])
    return out


def _tree_sum(builder, vs):
    """Pairwise sum (short dependency chains)."""
    while len(vs) > 1:
        vs = [builder.fadd(vs[i], vs[i + 1], flags=["fast"]) if i + 1 < len(vs) else vs[i]
              for i in range(0, len(vs), 2)]
    return vs[0]


def _accumulate8(context, builder, aryty, acc, lane, v):
    p = _ptr(context, builder, aryty, acc, lane, v.type)
    builder.store(builder.fadd(builder.load(p, align=4), v, flags=["fast"]), p, align=4)


def _mul_const(builder, v, k):
    return builder.mul(v, ir.Constant(v.type, k))


def _qs32(context, builder, qsty, qs_a, g):
    """f32x8: sums of 32 quantized activations, from the 16 sums of 16 at qs16[g]."""
    xs = _load_f32(context, builder, qsty, qs_a, g, 16)
    return builder.fadd(_pick(builder, xs, list(range(0, 16, 2))),
                        _pick(builder, xs, list(range(1, 16, 2))), flags=["fast"])


def _sub_products(builder, dot4, codes, qxs, scales):
    """sum over sub-blocks j of f32(dot4(codes[j], qxs[j])) * lane j of scales (f32x8)."""
    terms = [builder.fmul(builder.sitofp(dot4(builder, c, q), _V8F32), _lane(builder, scales, j),
                          flags=["fast"]) for j, (c, q) in enumerate(zip(codes, qxs))]
    return _tree_sum(builder, terms)


def _make_k4(dot4, five: bool):
    """The Q4_K (five=False) or Q5_K super-block intrinsic."""
    qs_at = 48 if five else 16

    def k4_idot(typingctx, acc, lane, row, o, b, d, dmin, qx, dx, qs16):
        sig = types.void(acc, _I, row, _I, _I, _F, _F, qx, dx, qs16)

        def codegen(context, builder, signature, args):
            acc_a, lane_v, row_a, o, b_v, d_v, dmin_v, qx_a, dx_a, qs_a = args
            at = signature.args
            _prefetch_ahead(context, builder, at[2], row_a, o, qs_at + 128)
            sc, mn = k4_unpack(builder, _load_bytes(context, builder, at[2], row_a,
                                                    builder.add(o, ir.Constant(o.type, 4)), 12))
            dxv = _load_f32(context, builder, at[8], dx_a, _mul_const(builder, b_v, 8), 8)
            scales = _fmul(builder, builder.uitofp(sc, _V8F32), _splat(builder, d_v, 8, _F32), dxv)
            mins = _fmul(builder, builder.uitofp(mn, _V8F32), _splat(builder, dmin_v, 8, _F32),
                         _qs32(context, builder, at[9], qs_a, _mul_const(builder, b_v, 16)))
            v8 = _vec(_I8, 32)
            if five:
                qh = _load_bytes(context, builder, at[2], row_a,
                                 builder.add(o, ir.Constant(o.type, 16)), 32)
            codes, qxs = [], []
            xo = _mul_const(builder, b_v, 256)
            for c in range(4):  # 32 bytes: low nibbles are sub-block 2c, high ones 2c+1
                q = _load_bytes(context, builder, at[2], row_a,
                                builder.add(o, ir.Constant(o.type, qs_at + 32 * c)), 32)
                pair = [builder.and_(q, ir.Constant(v8, [15] * 32)),
                        builder.lshr(q, ir.Constant(v8, [4] * 32))]
                for j in range(2):
                    code = pair[j]
                    if five:  # bit 2c+j of each qh byte is the fifth bit
                        bit = builder.and_(builder.lshr(qh, ir.Constant(v8, [2 * c + j] * 32)),
                                           ir.Constant(v8, [1] * 32))
                        code = builder.or_(code, builder.shl(bit, ir.Constant(v8, [4] * 32)))
                    codes.append(code)
                    qxs.append(_load_bytes(context, builder, at[7], qx_a,
                                           builder.add(xo, ir.Constant(xo.type, 64 * c + 32 * j)),
                                           32))
            dots = _sub_products(builder, dot4, codes, qxs, scales)
            _accumulate8(context, builder, at[0], acc_a, lane_v,
                         builder.fsub(dots, mins, flags=["fast"]))
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(k4_idot)


def _make_q6(dot4):
    """The Q6_K super-block intrinsic: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8
    scales (one per 16 values), fp16 d; value = d * scale * (q - 32). Quarter k (32 values) of
    half h takes the low (k < 2) or high nibbles of ql[64h + 32(k%2) ..] and bits 2k..2k+1 of
    qh[32h ..]; its scales are 8h + 2k and 8h + 2k + 1."""

    def q6_idot(typingctx, acc, lane, row, o, b, d, qx, dx, qs16):
        sig = types.void(acc, _I, row, _I, _I, _F, qx, dx, qs16)

        def codegen(context, builder, signature, args):
            acc_a, lane_v, row_a, o, b_v, d_v, qx_a, dx_a, qs_a = args
            at = signature.args

            def at_o(k):
                return builder.add(o, ir.Constant(o.type, k))

            _prefetch_ahead(context, builder, at[2], row_a, o, 210)
            f16 = _vec(_F32, 16)
            sc = builder.sitofp(_load_bytes(context, builder, at[2], row_a, at_o(192), 16), f16)
            dxv = _load_f32(context, builder, at[7], dx_a, _mul_const(builder, b_v, 8), 8)
            dx16 = _pick(builder, dxv, [i // 2 for i in range(16)])  # scale m: activations m//2
            scales = _fmul(builder, sc, _splat(builder, d_v, 16, _F32), dx16)
            xs = _load_f32(context, builder, at[8], qs_a, _mul_const(builder, b_v, 16), 16)
            offs16 = builder.fmul(sc, xs, flags=["fast"])  # the -32's share, 16 values each
            offs = builder.fadd(_pick(builder, offs16, list(range(8))),
                                _pick(builder, offs16, list(range(8, 16))), flags=["fast"])
            offs = builder.fmul(offs, _splat(builder, builder.fmul(d_v, ir.Constant(_F32, 32.0)),
                                             8, _F32), flags=["fast"])
            v8 = _vec(_I8, 32)
            xo = _mul_const(builder, b_v, 256)
            terms = []
            for h in range(2):
                ql = [_load_bytes(context, builder, at[2], row_a, at_o(64 * h + 32 * i), 32)
                      for i in range(2)]
                qh = _load_bytes(context, builder, at[2], row_a, at_o(128 + 32 * h), 32)
                for k in range(4):
                    lo = ql[k & 1]
                    lo = builder.and_(lo, ir.Constant(v8, [15] * 32)) if k < 2 else \
                        builder.lshr(lo, ir.Constant(v8, [4] * 32))
                    hi = builder.and_(builder.lshr(qh, ir.Constant(v8, [2 * k] * 32)),
                                      ir.Constant(v8, [3] * 32))
                    code = builder.or_(lo, builder.shl(hi, ir.Constant(v8, [4] * 32)))
                    q = _load_bytes(context, builder, at[6], qx_a,
                                    builder.add(xo, ir.Constant(xo.type, 128 * h + 32 * k)), 32)
                    s = 8 * h + 2 * k  # lanes 0-3 hold values 0-15, lanes 4-7 values 16-31
                    pick = _pick(builder, scales, [s] * 4 + [s + 1] * 4)
                    terms.append(builder.fmul(builder.sitofp(dot4(builder, code, q), _V8F32),
                                              pick, flags=["fast"]))
            dots = _tree_sum(builder, terms)
            _accumulate8(context, builder, at[0], acc_a, lane_v,
                         builder.fsub(dots, offs, flags=["fast"]))
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(q6_idot)


@intrinsic
def sum8(typingctx, acc):
    """acc[0] + ... + acc[7] as a vector tree (a scalar loop is a chain of 8 dependent adds)."""
    sig = _F(acc)

    def codegen(context, builder, signature, args):
        v = _load_f32(context, builder, signature.args[0], args[0], ir.Constant(_INTP, 0), 8)
        for n in (4, 2, 1):
            v = builder.fadd(_pick(builder, v, list(range(n))),
                             _pick(builder, v, list(range(n, 2 * n))), flags=["fast"])
        return builder.extract_element(v, ir.Constant(_I32, 0))

    return sig, codegen


# The kernels the CPU runs, and the portable ones (the tests check both against each other).
_DOT4 = _dot4_vnni if VNNI else _dot4_generic
q4_k_idot = _make_k4(_DOT4, five=False)
q5_k_idot = _make_k4(_DOT4, five=True)
q6_k_idot = _make_q6(_DOT4)
q4_k_idot_generic = _make_k4(_dot4_generic, five=False)
q5_k_idot_generic = _make_k4(_dot4_generic, five=True)
q6_k_idot_generic = _make_q6(_dot4_generic)
