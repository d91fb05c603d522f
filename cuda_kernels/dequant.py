"""Dequantize GGML rows to float32 or float16, every supported format.

One thread decodes one 32-value group (`qformats` contract); group t of the flattened tensor is
group t % n_groups of row t // n_groups and lands at out[32 t : 32 t + 32].
"""

from __future__ import annotations

import numpy as np
from numba import cuda, types

from strata.quant.planar import stored_bytes

from .launch import check_array, flat, n_blocks, register_ptx
from .qformats import FORMATS, get_format, specialize

THREADS = 128


def _factory(fmt):
    dq32 = fmt.dq32

    @cuda.jit
    def dequant_kernel(src, row_bytes, n_groups, n_total, out):
        # src: [n_rows * row_bytes] u8; out: [n_rows * n_cols] f32 or f16
        t = cuda.grid(1)
        if t < n_total:
            r = t // n_groups
            dq32(src, r * row_bytes, t - r * n_groups, out, t * 32)
    return dequant_kernel


kernel_for = specialize(_factory)


def dequantize(src, ggml_type, out, *, stream=0) -> None:
    """Decode the quantized rows in `src` (uint8, C-contiguous, 1-D or [n_rows, row_bytes]) into
    `out` ([n_rows, n_cols] float32 or float16, C-contiguous). Capturable in a CUDA graph."""
    fmt = get_format(ggml_type)
    check_array("out", out, (np.float32, np.float16), (None, None))
    n_rows, n_cols = out.shape
    row_bytes = fmt.row_bytes(n_cols)
    check_array("src", src, np.uint8)
    need = stored_bytes(fmt.name, n_rows * row_bytes)  # a planar format's whole groups
    if src.size < need:
        raise ValueError(f"src: {src.size} bytes, {fmt.name} [{n_rows}, {n_cols}] needs {need}")
    n_total = n_rows * (n_cols // 32)
    kernel_for(fmt.ggml_type)[n_blocks(n_total, THREADS), THREADS, stream](
        flat(src), row_bytes, n_cols // 32, n_total, flat(out))


def _ptx(fmt, out_type):
    def build():
        return _factory(fmt).py_func, (types.uint8[::1], types.int64, types.int64, types.int64,
                                       out_type[::1])
    return build


for _f in FORMATS.values():
    register_ptx("dequant", f"dequant_{_f.name}_f32", _ptx(_f, types.float32))
    register_ptx("dequant", f"dequant_{_f.name}_f16", _ptx(_f, types.float16))
