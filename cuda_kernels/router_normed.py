"""The MoE router of one decode token in one launch: the FFN's RMSNorm, the router's logits and
the softmax top-k, which were three launches (`rms_norm`, `matvec_float`, `route`) per layer.

Block r computes logit r. Every block sums x^2 over the raw residual x itself, with the same
threads, loads and reduction tree, so the norm's scale is bit-identical in every block, and
issues its row's first weight loads before that sum's reduction; each block then forms
xn = x * scale * norm_w on the fly while it dots its weight row (16-byte read-only loads of W,
x and norm_w, 1-4 warps per row: `matvec_f32`'s chunk dots and warp count) and block 0 also
writes xn to `normed_out` for the MoE launch that follows. The last block to finish (a device
counter: each block adds 1 after a fence; the block that reads n_rows - 1 is the last) routes
the token with `router.route_block` (the whole block ranks the logits) and sets the counter
back to 0, so the kernel replays in a CUDA graph with no host write between. That last block's
routing is the launch's serial tail: on the H200 it took ~3.7 us of a ~7.6 us launch, ~2 us of
it ranking every logit against every other (`bench/probes/phase_stamps.py --only
route_phases`), before `route_block` ranked within groups of 32 first.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, types

from .intrinsics import SIMULATED, block_sum
from .launch import check_array, register_ptx
from .matvec_f32 import (CHUNK_BYTES, MAX_WARPS, UNROLL, VALUE_BYTES, _check_aligned,
                         float_format, ld_nc_f32x4, load_chunks4, n_warps, put_warp_sum,
                         wdot_f16, wdot_f32)
from .qformats import get_format
from .router import MAX_CAND, MAX_EXPERTS, MAX_K, route_block

F0 = np.float32(0.0)
F1 = np.float32(1.0)
ALIGN16 = None if SIMULATED else 16  # route_block's 16-byte shared reads (simulator: none)


@cuda.jit(device=True, inline="always")
def normed4(x, norm_w, i, scale):
    """xn[i:i+4] = x * scale * norm_w (the product order block 0 writes `normed_out` in)."""
    x0, x1, x2, x3 = ld_nc_f32x4(x, i)
    w0, w1, w2, w3 = ld_nc_f32x4(norm_w, i)
    return x0 * scale * w0, x1 * scale * w1, x2 * scale * w2, x3 * scale * w3


def _factory(name: str):
    per_chunk = CHUNK_BYTES // VALUE_BYTES[name]  # 4 (F32) or 8 (F16) values per chunk
    is_f16 = name == "F16"  # a compile-time constant: the branch folds away

    @cuda.jit(device=True, inline="always")
    def normed_dot(wc, x, norm_w, i, scale):
        x0, x1, x2, x3 = normed4(x, norm_w, i, scale)
        if is_f16:
            x4, x5, x6, x7 = normed4(x, norm_w, i + 4, scale)
            return wdot_f16(wc, x0, x1, x2, x3, x4, x5, x6, x7)
        return wdot_f32(wc, x0, x1, x2, x3)

    @cuda.jit
    def router_normed_kernel(x, norm_w, eps, w, n_cols, normed_out, logits, k, norm_topk, ids,
                             weights, done, route):
        # x, norm_w, normed_out: [n_cols] f32; w: [n_rows, n_cols] F32|F16 as u8; logits:
        # [1, n_rows] f32; ids: [k] i32; weights: [k] f32; done: [>= 1] i32 (0 between
        # launches). Block b: logit b; the grid is n_rows blocks. route False (the same in
        # every block): the logits only, no count, nothing routed (the MoE routes them).
        scratch = cuda.shared.array(32, types.float32)
        part = cuda.shared.array(MAX_WARPS, types.float32)
        last_flag = cuda.shared.array(1, types.int32)
        s_val = cuda.shared.array(MAX_EXPERTS, types.float32)  # routing (route_block)
        s_key = cuda.shared.array(MAX_EXPERTS, types.int64, alignment=ALIGN16)
        s_cand = cuda.shared.array(MAX_CAND, types.int64, alignment=ALIGN16)
        s_id = cuda.shared.array(MAX_K, types.int32)
        s_top = cuda.shared.array(MAX_K, types.float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        n_threads = cuda.blockDim.x
        n_rows = logits.shape[1]
        n_chunks = n_cols // per_chunk
        last = n_chunks - 1
        off = row * n_chunks * CHUNK_BYTES
        ss = F0  # same threads, loads and tree in every block: the same scale bits
        for i in range(4 * tid, n_cols, 4 * n_threads):
            x0, x1, x2, x3 = ld_nc_f32x4(x, i)
            ss += x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3
        # the row's first chunks do not depend on the norm: in flight while it is reduced (not
        # before x's loads: a load's data comes back in issue order, behind every earlier miss)
        c0 = tid
        w0, w1, w2, w3 = load_chunks4(w, off, min(c0, last), n_threads, last)
        scale = F1 / math.sqrt(block_sum(ss, scratch) / np.float32(n_cols) + eps)
        if row == 0:
            for i in range(4 * tid, n_cols, 4 * n_threads):
                y0, y1, y2, y3 = normed4(x, norm_w, i, scale)
                normed_out[i] = y0
                normed_out[i + 1] = y1
                normed_out[i + 2] = y2
                normed_out[i + 3] = y3
        acc = F0
        while c0 < n_chunks:
            c1 = c0 + n_threads
            c2 = c1 + n_threads
            c3 = c2 + n_threads
            acc += normed_dot(w0, x, norm_w, per_chunk * c0, scale)
            if c1 < n_chunks:
                acc += normed_dot(w1, x, norm_w, per_chunk * c1, scale)
            if c2 < n_chunks:
                acc += normed_dot(w2, x, norm_w, per_chunk * c2, scale)
            if c3 < n_chunks:
                acc += normed_dot(w3, x, norm_w, per_chunk * c3, scale)
            c0 += UNROLL * n_threads
            if c0 < n_chunks:
                w0, w1, w2, w3 = load_chunks4(w, off, c0, n_threads, last)
        put_warp_sum(part, tid >> 5, acc, tid & 31)
        cuda.syncthreads()
        if tid == 0:
            s = part[0]
            for j in range(1, n_threads >> 5):  # warp order, as matvec_float sums
                s += part[j]
            logits[0, row] = s
            if route:
                cuda.threadfence()  # the logit is visible to every block before the count says so
                last_flag[0] = cuda.atomic.add(done, 0, 1) == n_rows - 1
        if not route:
            return
        cuda.syncthreads()
        if last_flag[0]:  # uniform over the block: every thread takes part in route_block
            cuda.threadfence()  # then read the other blocks' logits
            route_block(logits, 0, n_rows, k, norm_topk, ids, weights, s_val, s_key, s_cand,
                        s_id, s_top, scratch)
            if tid == 0:
                done[0] = 0  # every block has counted: ready for the next launch
    return router_normed_kernel


_CACHE: dict[str, object] = {}


def kernel_for(name: str):
    """The compiled-on-first-use kernel for the router's format ("F32" or "F16")."""
    k = _CACHE.get(name)
    if k is None:
        k = _CACHE[name] = _factory(name)
    return k


def takes(ggml_type, n_cols: int) -> bool:
    """Whether `router_normed` takes router rows of `ggml_type` and `n_cols` values (F32 rows of
    a multiple of 4, F16 rows of a multiple of 8: whole 16-byte chunks)."""
    name = float_format(ggml_type)
    return name is not None and n_cols > 0 and n_cols % (CHUNK_BYTES // VALUE_BYTES[name]) == 0


def _ptr(a) -> int:
    if SIMULATED:
        return np.asarray(getattr(a, "_ary", a)).__array_interface__["data"][0]
    return a.__cuda_array_interface__["data"][0]


def _check(x, norm_w, w, name, normed_out, logits, ids, weights, done) -> tuple[int, int, int]:
    """(n_cols, n_rows, k) of valid arguments, else ValueError naming what is wrong."""
    check_array("x", x, np.float32)
    if len(x.shape) != 1:
        raise ValueError(f"x: shape {tuple(x.shape)}, expected [n_embd] (one token)")
    n_cols = x.shape[0]
    per_chunk = CHUNK_BYTES // VALUE_BYTES[name]
    if n_cols <= 0 or n_cols % per_chunk:
        raise ValueError(f"x: {n_cols} columns, {name} rows take a positive multiple of "
                         f"{per_chunk}")
    check_array("norm_w", norm_w, np.float32, (n_cols,))
    check_array("normed_out", normed_out, np.float32, (n_cols,))
    if _ptr(normed_out) == _ptr(x):  # block 0 would overwrite x under the other blocks' reads
        raise ValueError("normed_out must not be x: the other blocks still read x")
    check_array("logits", logits, np.float32)
    if len(logits.shape) != 1 or not 1 <= logits.shape[0] <= MAX_EXPERTS:
        raise ValueError(f"logits: shape {tuple(logits.shape)}, expected [n_expert] with "
                         f"n_expert in 1..{MAX_EXPERTS}")
    n_rows = logits.shape[0]
    check_array("ids", ids, np.int32)
    k = ids.shape[0] if len(ids.shape) == 1 else -1
    if not 1 <= k <= min(MAX_K, n_rows):
        raise ValueError(f"ids: shape {tuple(ids.shape)}, expected [k] with k in "
                         f"1..{min(MAX_K, n_rows)} ({n_rows} experts)")
    check_array("weights", weights, np.float32, (k,))
    check_array("done", done, np.int32)
    if len(done.shape) != 1 or done.shape[0] < 1:
        raise ValueError(f"done: shape {tuple(done.shape)}, expected [>= 1] int32")
    check_array("w", w, np.uint8)
    need = n_rows * n_cols * VALUE_BYTES[name]
    if w.size < need:
        raise ValueError(f"w: {w.size} bytes, {name} [{n_rows}, {n_cols}] needs {need}")
    for label, a in (("w", w), ("x", x), ("norm_w", norm_w)):
        _check_aligned(label, a)
    return n_cols, n_rows, k


def router_normed(x, norm_w, w, *, ggml_type, eps: float, normed_out, logits, ids, weights,
                  done, norm_topk: bool = True, route: bool = True, stream=0) -> None:
    """One token's router in one launch: normed_out = rmsnorm(x) * norm_w, logits = W
    normed_out, and its softmax top-k into ids / weights (renormalised to sum 1 with
    `norm_topk`; ties to the lower expert id, ids in descending weight order, as `route`).

    x, norm_w, normed_out: float32 [n_embd] (normed_out not x); w: uint8, the router's F32 or
    F16 rows [n_expert, n_embd] (`ggml_type`), 16-byte aligned; logits: float32 [n_expert]
    (n_expert <= 512); ids: int32 [k]; weights: float32 [k] (k <= 16); done: int32 [>= 1],
    zero before the first launch, and zero again after each (the kernel resets it). n_embd a
    multiple of 4 (F32) or 8 (F16). One launch, no allocation: graph-capturable. With route
    False only normed_out and logits are written (ids, weights and done are left alone): the
    MoE launch routes the logits itself (`moe.moe_decode(route_logits=...)`), with no last
    block's serial tail here."""
    name = float_format(ggml_type)
    if name is None:
        raise ValueError(f"router_normed takes F32 or F16 router rows, got "
                         f"{get_format(ggml_type).name}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    n_cols, n_rows, k = _check(x, norm_w, w, name, normed_out, logits, ids, weights, done)
    threads = 32 * n_warps(n_cols // (CHUNK_BYTES // VALUE_BYTES[name]))
    w1 = w.reshape(w.size) if len(w.shape) != 1 else w
    kernel_for(name)[n_rows, threads, stream](
        x, norm_w, np.float32(eps), w1, n_cols, normed_out, logits.reshape(1, n_rows), k,
        bool(norm_topk), ids, weights, done, bool(route))


_SIG = (types.float32[::1], types.float32[::1], types.float32, types.uint8[::1], types.int64,
        types.float32[::1], types.float32[:, ::1], types.int64, types.boolean,
        types.int32[::1], types.float32[::1], types.int32[::1], types.boolean)

for _name in VALUE_BYTES:
    register_ptx("router", f"router_normed_{_name}",
                 lambda nm=_name: (_factory(nm).py_func, _SIG))
