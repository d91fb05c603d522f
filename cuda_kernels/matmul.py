"""Prefill matmuls over quantized weights: the grouped MoE expert GEMMs and the dense projections.

The MoE path of a chunk (all device-side, no host synchronisation):

    route.route_tokens(topk_ids, routing)           # count, scan, scatter: entries by expert
    moe_gate_up(x, gate, up, routing, h)            # h[p] = silu(x_t @ gate_e^T) * (x_t @ up_e^T)
    moe_down(h, down, routing, y)                   # y[p] = h[p] @ down_e^T
    route.combine(y, routing, topk_weights, out)    # out[t] = sum_s w[t, s] * y[inv[t, s]]

(p: permuted position of entry (t, s) routed to expert e). Each expert's matrix is found through
`QuantWeights.base[e]`, a byte offset into one uint8 buffer, so the engine points every expert at
its VRAM cache slot or its ring slot without copying. `dense_matmul` is the same GEMM for one
matrix (q/k/v/o projections of a chunk, the output head).

Tensor cores (f16 tiles, f32 accumulation; x may be f16 or f32) are the default; the FMA path
(f32 throughout) is the fallback and the cross-check.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from strata.quant.planar import stored_bytes

from .launch import as_u32
from .matmul_fma import fma_kernel
from .matmul_tiles import FMA_TILE, K_STEP, FmaTile, TcTile, n_col_blocks, tc_kernel, tc_tile
from .matmul_loads import split_loader
from .qformats import get_format, is_planar
from .route import Routing
from .tables import dummy_i32


@dataclass(frozen=True, slots=True)
class QuantWeights:
    """Matrices of `n_rows` x `n_cols` in a GGML format, one per group, inside one byte buffer.

    buf: uint8 [n_bytes] device array; base: int64 [n_groups] device array, the byte offset of
    each group's row 0 (rows are `row_bytes` apart). A dense matrix is one group. A planar format
    (`strata.quant.planar`: dense only) reads its super-blocks by their GGUF offsets from the
    tensor's first byte: its matrix is one group at base 0 of a buffer holding the whole tensor.
    """

    buf: object
    base: object
    ggml_type: int
    n_rows: int
    n_cols: int

    def __post_init__(self):
        fmt = get_format(self.ggml_type)
        if self.n_rows < 1 or self.n_cols < 1:
            raise ValueError(f"QuantWeights: bad matrix shape {self.n_rows} x {self.n_cols}")
        fmt.row_bytes(self.n_cols)  # raises for a row that is not whole blocks / 32-value groups
        _check("QuantWeights.buf", self.buf, np.uint8, 1)
        _check("QuantWeights.base", self.base, np.int64, 1)
        if is_planar(self.ggml_type):
            if self.base.shape[0] != 1:
                raise ValueError(f"QuantWeights: {fmt.name} is a dense layout, one matrix at "
                                 f"base 0 (got {self.base.shape[0]} groups)")
            need = stored_bytes(fmt.name, self.n_rows * fmt.row_bytes(self.n_cols))
            if self.buf.shape[0] < need:
                raise ValueError(f"QuantWeights.buf: {self.buf.shape[0]} bytes, {fmt.name} "
                                 f"[{self.n_rows}, {self.n_cols}] needs {need}")

    @property
    def row_bytes(self) -> int:
        return get_format(self.ggml_type).row_bytes(self.n_cols)

    @property
    def n_groups(self) -> int:
        return self.base.shape[0]


def _check(name, a, dtype, ndim, shape=None):
    if getattr(a, "dtype", None) != np.dtype(dtype) or getattr(a, "ndim", None) != ndim:
        raise ValueError(f"{name} must be a {ndim}-d {np.dtype(dtype).name} array, got "
                         f"{getattr(a, 'dtype', type(a).__name__)} "
                         f"with shape {tuple(getattr(a, 'shape', ()))}")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(a.shape)}")
    contiguous = a.is_c_contiguous() if hasattr(a, "is_c_contiguous") \
        else a.flags["C_CONTIGUOUS"]
    if not contiguous:
        raise ValueError(f"{name} must be C-contiguous")


_ACTIVATION_DTYPES = (np.dtype(np.float16), np.dtype(np.float32))


def _check_activations(name, a, shape):
    if getattr(a, "dtype", None) not in _ACTIVATION_DTYPES:
        raise ValueError(f"{name} must be float16 or float32, got "
                         f"{getattr(a, 'dtype', type(a).__name__)}")
    _check(name, a, a.dtype, 2, shape)


@functools.cache
def _tc(ggml_type, tile, x_half, grouped, gather, swiglu, out_half):
    return tc_kernel(get_format(ggml_type).dq32, tile=tile, x_half=x_half, grouped=grouped,
                     gather=gather, swiglu=swiglu, out_half=out_half,
                     loader=split_loader(ggml_type))


@functools.cache
def _fma(ggml_type, tile, grouped, gather, swiglu):
    return fma_kernel(get_format(ggml_type).dq32, tile=tile, grouped=grouped, gather=gather,
                      swiglu=swiglu)


def _launch(*, x, w0: QuantWeights, w1: QuantWeights, out, n_out, routing: Routing | None,
            gather: bool, swiglu: bool, tensor_cores: bool, tile, stream):
    """Pick the kernel and grid; `routing=None` is the dense (ungrouped) mode."""
    grouped = routing is not None
    if tensor_cores:
        tile = tile or tc_tile(w0.ggml_type)
        if not isinstance(tile, TcTile):
            raise ValueError(f"tensor-core launch needs a TcTile, got {tile!r}")
        if w0.n_cols % tile.k_step:  # a k depth the 64-value step does not divide
            tile = dataclasses.replace(tile, kch=1)
        out_half = out.dtype == np.float16
        if out_half and n_out % 2:
            raise ValueError(f"a float16 output needs an even column count, got {n_out}")
        kernel = _tc(w0.ggml_type, tile, x.dtype == np.float16, grouped, gather, swiglu, out_half)
        x_arg = as_u32(x) if x.dtype == np.float16 else x  # f16 pairs: the words the kernel loads
        out_arg = as_u32(out) if out_half else out
    else:
        tile = tile or FMA_TILE
        if not isinstance(tile, FmaTile):
            raise ValueError(f"FMA launch needs an FmaTile, got {tile!r}")
        if out.dtype != np.float32:
            raise ValueError(f"the FMA path writes float32, got an output of {out.dtype}")
        kernel = _fma(w0.ggml_type, tile, grouped, gather, swiglu)
        x_arg, out_arg = x, out
    if grouped:
        if routing.tile_rows != tile.bm:
            raise ValueError(f"routing was scheduled for {routing.tile_rows}-row tiles, the "
                             f"kernel uses {tile.bm}: allocate_routing(tile_rows={tile.bm})")
        sched = (routing.offsets, routing.perm, routing.k_top, routing.tile_group,
                 routing.tile_m0, routing.n_tiles)
        grid_rows, n_rows = routing.max_tiles, routing.n_entries
    else:
        dummy = dummy_i32()  # the unused schedule (an engine's comes from its arena)
        sched = (dummy, dummy, 1, dummy, dummy, dummy)
        n_rows = x.shape[0]
        grid_rows = -(-n_rows // tile.bm)
    grid = (n_col_blocks(n_out, tile.bn, swiglu), grid_rows)
    kernel[grid, tile.threads, stream](
        x_arg, w0.buf, w0.base, w1.base, w0.row_bytes, n_out, w0.n_cols, *sched, n_rows, out_arg)


def moe_gate_up(x, gate: QuantWeights, up: QuantWeights, routing: Routing, h, *,
                tensor_cores: bool = True, tile=None, stream=0):
    """h[p] = silu(x[t] @ gate_e^T) * (x[t] @ up_e^T) for every routed entry, in permuted order.

    x: [n_tokens, n_embd] f16 or f32; gate, up: n_ff x n_embd per expert, one format, one buffer;
    h: [n_entries, n_ff], f16 or f32 (tensor cores) or f32 (FMA).
    """
    if gate.ggml_type != up.ggml_type or (gate.n_rows, gate.n_cols) != (up.n_rows, up.n_cols):
        raise ValueError("gate and up must share one format and shape for the fused SwiGLU GEMM")
    if gate.buf is not up.buf:
        raise ValueError("gate and up must live in the same weight buffer")
    for w in (gate, up):
        if w.n_groups != routing.n_experts:
            raise ValueError(f"expected {routing.n_experts} expert offsets, got {w.n_groups}")
    _check_activations("x", x, (routing.n_tokens, gate.n_cols))
    _check_activations("h", h, (routing.n_entries, gate.n_rows))
    _launch(x=x, w0=gate, w1=up, out=h, n_out=gate.n_rows, routing=routing, gather=True,
            swiglu=True, tensor_cores=tensor_cores, tile=tile, stream=stream)


def moe_down(h, down: QuantWeights, routing: Routing, y, *, tensor_cores: bool = True,
             tile=None, stream=0):
    """y[p] = h[p] @ down_e^T for every permuted position p of expert e.

    h: [n_entries, n_ff] f16 or f32; down: n_embd x n_ff per expert; y: [n_entries, n_embd] f32.
    """
    if down.n_groups != routing.n_experts:
        raise ValueError(f"expected {routing.n_experts} expert offsets, got {down.n_groups}")
    _check_activations("h", h, (routing.n_entries, down.n_cols))
    _check("y", y, np.float32, 2, (routing.n_entries, down.n_rows))
    _launch(x=h, w0=down, w1=down, out=y, n_out=down.n_rows, routing=routing, gather=False,
            swiglu=False, tensor_cores=tensor_cores, tile=tile, stream=stream)


def dense_matmul(x, w: QuantWeights, out, *, tensor_cores: bool = True, tile=None, stream=0):
    """out = x @ W^T for a chunk: x [n, n_cols] f16/f32, w one matrix, out [n, n_rows] f32/f16."""
    if w.n_groups != 1:
        raise ValueError(f"dense_matmul takes one matrix, got {w.n_groups} offsets")
    _check_activations("x", x, (x.shape[0] if x.ndim == 2 else -1, w.n_cols))
    _check_activations("out", out, (x.shape[0], w.n_rows))
    _launch(x=x, w0=w, w1=w, out=out, n_out=w.n_rows, routing=None, gather=False, swiglu=False,
            tensor_cores=tensor_cores, tile=tile, stream=stream)


def gemm_flops(n_rows: int, n_out: int, n_cols: int) -> int:
    """Floating-point operations of an [n_rows, n_cols] x [n_cols, n_out] product."""
    return 2 * n_rows * n_out * n_cols


__all__ = ["QuantWeights", "moe_gate_up", "moe_down", "dense_matmul", "gemm_flops", "K_STEP"]
