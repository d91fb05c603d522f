"""Random valid quantized rows for kernel tests, and gguf-py's dequantization as their reference.

`random_rows` uses the quant package's `random_blocks`; `own_random_rows` is random bytes with
every fp16 scale field (and MXFP4's exponent byte) overwritten by a finite value.

A planar type (`strata.quant.planar`, e.g. Q6_K_P8) gets its GGUF base's rows here (so gguf-py
stays the reference); `stored` turns rows into the bytes a kernel of that type reads."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize

from strata.quant import planar
from strata.quant.random_blocks import random_blocks

# byte offsets of the fp16 scale fields inside one block
_F16_FIELDS = {
    T.Q8_0: (0,), T.Q4_0: (0,), T.Q5_0: (0,), T.IQ4_NL: (0,), T.Q4_1: (0, 2), T.Q5_1: (0, 2),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ4_XS: (0,), T.IQ3_S: (0,), T.IQ3_XXS: (0,), T.IQ2_XXS: (0,), T.IQ2_XS: (0,),
    T.IQ2_S: (0,),
}


def _own_random_rows(t: T, n_rows: int, n_cols: int, rng: np.random.Generator) -> np.ndarray:
    block_values, block_bytes = GGML_QUANT_SIZES[t]
    if t in (T.F32, T.F16, T.BF16):
        vals = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
        if t == T.F32:
            return vals.view(np.uint8).copy()
        if t == T.F16:
            return vals.astype(np.float16).view(np.uint8).copy()
        return (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).copy()
    n_blocks = n_rows * n_cols // block_values
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    if t == T.MXFP4:
        raw[:, 0] = rng.integers(118, 130, size=n_blocks)
    for off in _F16_FIELDS.get(t, ()):
        mag = rng.uniform(0.25, 1.0, size=n_blocks) * 2.0 ** -5
        sign = np.where(rng.random(n_blocks) < 0.5, -1.0, 1.0)
        raw[:, off:off + 2] = (mag * sign).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(n_rows, -1)


def _gguf_type(ggml_type) -> T:
    """The GGUF type of a type name or number (a planar type's base)."""
    if isinstance(ggml_type, str):
        p = planar.BY_NAME.get(ggml_type.upper())
        return T(p.base_type) if p is not None else T[ggml_type.upper()]
    return T(planar.base_type(int(ggml_type)))


def stored(ggml_type, rows: np.ndarray) -> np.ndarray:
    """[n] uint8: rows ([n_rows, row_bytes] GGUF bytes) as a kernel of `ggml_type` reads them:
    GGUF's bytes, or a planar type's layout of the whole tensor (padded to whole groups)."""
    p = (planar.BY_NAME.get(ggml_type.upper()) if isinstance(ggml_type, str)
         else planar.BY_TYPE.get(int(ggml_type)))
    flat = np.ascontiguousarray(rows, np.uint8).reshape(-1)
    return flat.copy() if p is None else p.pack(flat)


def random_rows(ggml_type, n_rows: int, n_cols: int, rng: np.random.Generator) -> np.ndarray:
    """[n_rows, row_bytes] uint8 rows of `n_cols` values in a valid random encoding (the quant
    package's generator, whose values have a realistic spread)."""
    t = _gguf_type(ggml_type)
    block_values = GGML_QUANT_SIZES[t][0]
    blocks = random_blocks(t, n_rows * n_cols // block_values, rng, scale=1.0)
    return blocks.reshape(n_rows, -1)


def own_random_rows(ggml_type, n_rows: int, n_cols: int, rng: np.random.Generator) -> np.ndarray:
    """Like `random_rows`, with uniformly random bits everywhere but the scale fields (a harsher
    input: every code point of every field is hit)."""
    t = _gguf_type(ggml_type)
    return _own_random_rows(t, n_rows, n_cols, rng)


def reference(ggml_type, rows: np.ndarray, n_cols: int) -> np.ndarray:
    """gguf-py's dequantization of [n_rows, row_bytes] (GGUF) rows, float64 [n_rows, n_cols]."""
    t = _gguf_type(ggml_type)
    out = dequantize(np.ascontiguousarray(rows), t)
    return np.asarray(out, dtype=np.float64).reshape(rows.shape[0], n_cols)


def dots_x8(name, n_bytes: int) -> bool:
    """Whether a one-token lane launch of format `name` over n_bytes of its weights dots 8-bit x
    (`lanes_x8`, LANE_X8, `matvec.x8_pays`)."""
    from strata.cuda_kernels import matvec as mv
    from strata.cuda_kernels.lanes_x8 import x8_format
    from strata.cuda_kernels.qformats import get_format
    lf = x8_format(get_format(name).ggml_type)
    return bool(mv.LANE_X8) and lf is not None and mv.x8_pays(lf, n_bytes)


def x_seen(x, x8: bool) -> np.ndarray:
    """float64 of the x a kernel multiplies: with x8, x quantized per 32 values as the CPU
    engine quantizes it (`strata.engine.cpu.idot.x8_arrays`: an independent implementation of
    the rounding `xstage.stage_x8` does), else x itself. x: [n] or [n_tok, n]."""
    if not x8:
        return np.asarray(x, np.float64)
    from strata.engine.cpu.idot import x8_arrays
    x2 = np.atleast_2d(np.asarray(x, np.float32))
    return x8_arrays(x2)[3].reshape(np.shape(x)).astype(np.float64)
