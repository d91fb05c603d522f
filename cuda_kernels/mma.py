"""Warp-level primitives numba lacks: the f16 tensor-core MMA, `ldmatrix` fragment loads,
`cp.async` global-to-shared copies, f16x2 packing and arithmetic, lane exchange.

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

`ldsm_x4(s, i)` (ldmatrix .x4): lane l names the shared-memory row (4 u32 words, 16-byte aligned)
starting at word i; lanes 8m..8m+7 give the 8 rows of matrix m, and every lane receives word
l & 3 of row l >> 2 of each matrix m as its m-th result: exactly the A fragment of a row-major
16x16 tile (rows 0-15 from lanes 0-15 at k 0, from lanes 16-31 at k 8) or the B fragments of two
8-column groups of a tile stored one column per row.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref

import numpy as np

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

# ----------------------------------------------------------------------------------------------
# Simulator: lanes of one simulated warp meet at a barrier to exchange values.


class _WarpExchange:
    """All-gather among the 32 lanes of one simulated warp. Each lane writes its slot and takes a
    ticket; the lane holding the exchange's last ticket computes the shared result and wakes the
    other 31, each blocked on a lock of its own. A wake-up is one lock release per waiting lane
    (a `threading.Barrier` re-takes one shared condition lock per lane on the way out: about
    twice the CPU per exchange, which is what the simulator's tensor-core tiles spend their time
    on). `next()` on an `itertools.count` is atomic under the GIL, so tickets need no lock.

    Safe to reuse at once: a woken lane may write its next slot, since this exchange's result
    already exists; the next result is computed only when every lane has arrived again, that is
    after each has read this one."""

    def __init__(self):
        self.slots = [None] * 32
        self.result = None
        self.tickets = itertools.count()
        self.wake = [threading.Lock() for _ in range(32)]
        for lock in self.wake:
            lock.acquire()

    def run(self, lane, value, combine):
        """Every lane passes its `value`; the last to arrive computes `combine(slots)` (the same
        function from every lane of one exchange); all get the result."""
        self.slots[lane] = value
        if next(self.tickets) % 32 == 31:
            result = self.result = combine(self.slots)
            for other, lock in enumerate(self.wake):
                if other != lane:
                    lock.release()
            return result
        if not self.wake[lane].acquire(timeout=_TIMEOUT_S):
            raise RuntimeError(f"simulated warp exchange: lane {lane} waited {_TIMEOUT_S} s for "
                               "the other lanes (do all 32 lanes of the warp take part?)")
        return self.result


_TIMEOUT_S = 120
_exchanges: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_exchanges_lock = threading.Lock()


def _warp_exchange():
    """(exchange of the calling simulated thread's warp, its lane). Blocks must be whole warps.
    The pair is kept on the thread (one simulated thread per CUDA thread and launch)."""
    me = threading.current_thread()
    pair = getattr(me, "_strata_warp", None)
    if pair is None:
        manager = me._manager  # the simulator's BlockManager: one per block launch
        warp = me.thread_id // 32
        with _exchanges_lock:
            per_block = _exchanges.setdefault(manager, {})
            ex = per_block.get(warp)
            if ex is None:
                ex = per_block[warp] = _WarpExchange()
        pair = me._strata_warp = (ex, me.thread_id % 32)
    return pair


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


def _ldsm_combine(slots):
    out = np.zeros((32, 4), dtype=np.uint32)
    for lane in range(32):
        for m in range(4):
            arr, i = slots[8 * m + (lane >> 2)]
            out[lane, m] = arr[i + (lane & 3)]
    return out


def _ldsm_sim(combine):
    """The simulator's ldmatrix x4 whose fragments `combine` deals out."""
    def ldsm(arr, i):
        ex, lane = _warp_exchange()
        w = ex.run(lane, (arr, int(i)), combine)
        return np.uint32(w[lane, 0]), np.uint32(w[lane, 1]), np.uint32(w[lane, 2]), \
            np.uint32(w[lane, 3])
    return ldsm


# ldmatrix .trans (e.g. V fragments): lane l names a row as for `ldsm_x4`; it receives, of each
# matrix m, the halves (row 2t, column g) and (row 2t + 1, column g), g = l >> 2, t = l & 3.


def _ldsm_trans_combine(slots):
    out = np.zeros((32, 4), dtype=np.uint32)
    lanes = np.arange(32)
    g, t = lanes >> 2, lanes & 3
    for m in range(4):
        rows = np.array([[arr[i + w] for w in range(4)] for arr, i in slots[8 * m:8 * m + 8]],
                        dtype=np.uint32).view(np.uint16)  # [8 rows, 8 columns] f16 bits
        out[:, m] = rows[2 * t, g].astype(np.uint32) | (rows[2 * t + 1, g].astype(np.uint32) << 16)
    return out


def _cp_async16_sim(dst, i, src, row, col, valid):
    for w in range(4):
        dst[i + w] = src[row, col + w] if valid else np.uint32(0)


def _cp_async_wait_sim():
    return None


def _smem_u32_sim(arr):
    """The simulator's shared 'address' of an array is 0: the addressed intrinsics take the
    array beside the address and read a byte offset from its first element."""
    return 0


def _gaddr_sim(arr, row, col):
    return int(row) * arr.strides[0] + int(col) * arr.strides[1]


def _gaddr1_sim(arr, i):
    return int(i) * arr.strides[0]


def _ldsm_x4_at_sim(arr, addr):
    return ldsm_x4(arr, int(addr) // 4)


def _ldsm_x4_trans_at_sim(arr, addr):
    return ldsm_x4_trans(arr, int(addr) // 4)


def _cp_async16_at_sim(dst, daddr, src, gaddr, valid):
    i, g = int(daddr) // 4, int(gaddr)
    if src.ndim == 1:  # a byte array (gaddr1): four little-endian words from byte g
        b = [int(src[g + k]) if valid else 0 for k in range(16)] if src.itemsize == 1 else None
        if b is None:
            raise TypeError("the simulator's cp_async16_at reads 1-d arrays of bytes only")
        for w in range(4):
            dst[i + w] = np.uint32(b[4 * w] | b[4 * w + 1] << 8 | b[4 * w + 2] << 16
                                   | b[4 * w + 3] << 24)
        return
    row, col = g // src.strides[0], (g % src.strides[0]) // src.strides[1]
    for w in range(4):
        dst[i + w] = src[row, col + w] if valid else np.uint32(0)


def _syncwarp_sim():
    """A barrier of the simulated warp's 32 lanes (the simulator has no `syncwarp`)."""
    ex, lane = _warp_exchange()
    ex.run(lane, 0, list)


def _cp_async_commit_sim():  # the simulator's copies complete at once: groups are no-ops
    return None


def _cp_async_wait_group1_sim():
    return None


def _halves(word):
    return np.array([word], dtype=np.uint32).view(np.float16).astype(np.float64)  # [2]


def _h2_sub_fma_sim(w, sub, scale, add):
    """(w - sub) * scale + add on f16 pairs; the subtraction exact (as the kernels use it)."""
    v = (_halves(w) - _halves(sub)) * _halves(scale) + _halves(add)
    return np.uint32(v.astype(np.float16).view(np.uint32)[0])


def _h2_sub_sim(a, b):
    """a - b on f16 pairs (rounded to f16)."""
    v = _halves(a) - _halves(b)
    return np.uint32(v.astype(np.float16).view(np.uint32)[0])


def _shfl_idx_sim(value, src):
    ex, lane = _warp_exchange()
    values = ex.run(lane, value, list)
    return values[int(src) & 31]


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
    ldsm_x4 = _ldsm_sim(_ldsm_combine)
    ldsm_x4_trans = _ldsm_sim(_ldsm_trans_combine)
    cp_async16 = _cp_async16_sim
    cp_async_wait = _cp_async_wait_sim
    cp_async_commit = _cp_async_commit_sim
    smem_u32 = _smem_u32_sim
    gaddr = _gaddr_sim
    gaddr1 = _gaddr1_sim
    ldsm_x4_at = _ldsm_x4_at_sim
    ldsm_x4_trans_at = _ldsm_x4_trans_at_sim
    cp_async16_at = _cp_async16_at_sim
    cp_async_wait_group1 = _cp_async_wait_group1_sim
    h2_sub_fma = _h2_sub_fma_sim
    h2_sub = _h2_sub_sim
    shfl_idx = _shfl_idx_sim
    syncwarp = _syncwarp_sim
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
    def shfl_idx(value, src):
        """The value held by lane `src` (per-lane; all 32 lanes must take part)."""
        return cuda.shfl_sync(0xFFFFFFFF, value, src)
