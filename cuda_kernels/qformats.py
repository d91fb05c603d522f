"""Device decoders for every GGML format Strata supports, with one uniform contract.

Contract (every format; a row is `n` values, `n` a multiple of the format's block size):

* ``dq32_<fmt>(src, row_off, j, dst, dst_off)`` writes the 32 consecutive values
  ``j*32 .. j*32+31`` of the row whose bytes start at ``src[row_off]`` into
  ``dst[dst_off .. dst_off+31]`` as float32. ``src`` is a 1-D uint8 array (global or shared);
  ``dst`` a float32 (or float16) array, local, shared or global.
* ``dot32_<fmt>(src, row_off, j, x, x_off) -> float32`` returns
  ``sum_i value(j*32+i) * x[x_off+i]`` for the same 32 values, decoding and multiplying in one
  pass. ``x`` is float32 (16-byte aligned at ``x_off``) or float16 (8-byte aligned).
* ``row_off`` must keep the format's natural alignment: a multiple of the block's byte size times
  the row's block count, within a buffer whose base is 16-byte aligned (every device allocation
  is). The decoders read whole aligned words, never past the 32 values' own blocks' 4-byte-rounded
  end, and write nothing but the 32 destination values.

`FORMATS[ggml_type]` gives ``Format(name, block_values, block_bytes, dq32, dot32, ...)``; kernels
are specialised per format by closing over ``dq32``/``dot32`` in a kernel factory (see
`specialize`).

Lookup-table formats (IQ*, MXFP4) read their tables from constant memory in dq32/dot32, where
lanes reading different entries serialise. Hot kernels use the table variants instead:
``dq32t``/``dot32t`` take one more argument, ``tab``, the format's flat table (``Format.table``,
float32 or uint32) which the kernel has staged in shared memory; for formats without a table
``Format.table`` is a 1-element placeholder and ``tab`` is ignored.

Every device function is ``inline="always"``: numba compiles a non-inlined device function for
the *current* GPU, which fails in ``compile_ptx`` on a machine without one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda

from strata.quant.planar import BY_TYPE as PLANAR_TYPES
from strata.quant.planar import Q6_K_P8, PlanarFormat

from . import qtables as Q
from .qformats_iq import (dot32_iq2_s, dot32_iq2_xs, dot32_iq2_xxs, dot32_iq3_s, dot32_iq3_xxs,
                          dot32t_iq2_s, dot32t_iq2_xs, dot32t_iq2_xxs, dot32t_iq3_s,
                          dot32t_iq3_xxs, dq32_iq2_s, dq32_iq2_xs, dq32_iq2_xxs, dq32_iq3_s,
                          dq32_iq3_xxs, dq32t_iq2_s, dq32t_iq2_xs, dq32t_iq2_xxs, dq32t_iq3_s,
                          dq32t_iq3_xxs)
from .qformats_k import (dot32_iq4_xs, dot32_q2_k, dot32_q3_k, dot32_q4_k, dot32_q5_k,
                         dot32_q6_k, dot32_q6_k_p8, dot32t_iq4_xs, dq32_iq4_xs, dq32_q2_k,
                         dq32_q3_k, dq32_q4_k, dq32_q5_k, dq32_q6_k, dq32_q6_k_p8, dq32t_iq4_xs)
from .qformats_simple import (dot32_bf16, dot32_f16, dot32_f32, dot32_iq4_nl, dot32_mxfp4,
                              dot32_q4_0, dot32_q4_1, dot32_q5_0, dot32_q5_1, dot32_q8_0,
                              dq32_bf16, dq32_f16, dq32_f32, dq32_iq4_nl, dq32_mxfp4, dq32_q4_0,
                              dq32_q4_1, dq32_q5_0, dq32_q5_1, dq32_q8_0, dot32t_iq4_nl,
                              dot32t_mxfp4, dq32t_iq4_nl, dq32t_mxfp4)


@dataclass(frozen=True, slots=True)
class Format:
    """One format's geometry and device decoders."""

    ggml_type: int
    name: str
    block_values: int   # values per block (1 for the float formats)
    block_bytes: int
    dq32: Callable[..., Any]
    dot32: Callable[..., Any]
    dq32t: Callable[..., Any]   # (..., tab): the table variants (see the module doc)
    dot32t: Callable[..., Any]
    table: np.ndarray           # the flat table dq32t/dot32t index (1-element placeholder if none)

    @property
    def has_table(self) -> bool:
        return self.table is not Q.NO_TABLE

    def row_bytes(self, n_values: int) -> int:
        """Bytes of a row of `n_values` values (a whole number of 32-value groups and blocks)."""
        if n_values % 32 or n_values % self.block_values:
            raise ValueError(f"{self.name}: a row of {n_values} values is not a whole number of "
                             f"{max(32, self.block_values)}-value groups")
        return n_values // self.block_values * self.block_bytes


def _ignore_table(dq32, dot32):
    @cuda.jit(device=True, inline="always")
    def dq32t(src, row_off, j, dst, dst_off, tab):
        dq32(src, row_off, j, dst, dst_off)

    @cuda.jit(device=True, inline="always")
    def dot32t(src, row_off, j, x, x_off, tab):
        return dot32(src, row_off, j, x, x_off)
    return dq32t, dot32t


def _fmt(t: T | PlanarFormat, block_values: int, block_bytes: int, dq32, dot32, tabled=None,
         table=Q.NO_TABLE) -> tuple[int, Format]:
    dq32t, dot32t = tabled if tabled is not None else _ignore_table(dq32, dot32)
    n = int(t.ggml_type) if isinstance(t, PlanarFormat) else int(t)
    return n, Format(n, t.name, block_values, block_bytes, dq32, dot32, dq32t, dot32t, table)


FORMATS: dict[int, Format] = dict([
    _fmt(T.F32, 1, 4, dq32_f32, dot32_f32),
    _fmt(T.F16, 1, 2, dq32_f16, dot32_f16),
    _fmt(T.BF16, 1, 2, dq32_bf16, dot32_bf16),
    _fmt(T.Q8_0, 32, 34, dq32_q8_0, dot32_q8_0),
    _fmt(T.Q4_0, 32, 18, dq32_q4_0, dot32_q4_0),
    _fmt(T.Q4_1, 32, 20, dq32_q4_1, dot32_q4_1),
    _fmt(T.Q5_0, 32, 22, dq32_q5_0, dot32_q5_0),
    _fmt(T.Q5_1, 32, 24, dq32_q5_1, dot32_q5_1),
    _fmt(T.Q2_K, 256, 84, dq32_q2_k, dot32_q2_k),
    _fmt(T.Q3_K, 256, 110, dq32_q3_k, dot32_q3_k),
    _fmt(T.Q4_K, 256, 144, dq32_q4_k, dot32_q4_k),
    _fmt(T.Q5_K, 256, 176, dq32_q5_k, dot32_q5_k),
    _fmt(T.Q6_K, 256, 210, dq32_q6_k, dot32_q6_k),
    # the engine's VRAM layout of dense Q6_K (`strata.quant.planar`): the same bytes a row
    _fmt(Q6_K_P8, 256, 210, dq32_q6_k_p8, dot32_q6_k_p8),
    _fmt(T.IQ4_NL, 32, 18, dq32_iq4_nl, dot32_iq4_nl, (dq32t_iq4_nl, dot32t_iq4_nl), Q.TABLE_IQ4NL),
    _fmt(T.IQ4_XS, 256, 136, dq32_iq4_xs, dot32_iq4_xs,
          (dq32t_iq4_xs, dot32t_iq4_xs), Q.TABLE_IQ4NL),
    _fmt(T.IQ3_S, 256, 110, dq32_iq3_s, dot32_iq3_s, (dq32t_iq3_s, dot32t_iq3_s), Q.TABLE_IQ3_S),
    _fmt(T.IQ3_XXS, 256, 98, dq32_iq3_xxs, dot32_iq3_xxs,
          (dq32t_iq3_xxs, dot32t_iq3_xxs), Q.TABLE_IQ3_XXS),
    _fmt(T.IQ2_XXS, 256, 66, dq32_iq2_xxs, dot32_iq2_xxs,
          (dq32t_iq2_xxs, dot32t_iq2_xxs), Q.TABLE_IQ2_XXS),
    _fmt(T.IQ2_XS, 256, 74, dq32_iq2_xs, dot32_iq2_xs,
          (dq32t_iq2_xs, dot32t_iq2_xs), Q.TABLE_IQ2_XS),
    _fmt(T.IQ2_S, 256, 82, dq32_iq2_s, dot32_iq2_s, (dq32t_iq2_s, dot32t_iq2_s), Q.TABLE_IQ2_S),
    _fmt(T.MXFP4, 32, 17, dq32_mxfp4, dot32_mxfp4, (dq32t_mxfp4, dot32t_mxfp4), Q.TABLE_MXFP4),
])

BY_NAME: dict[str, Format] = {f.name: f for f in FORMATS.values()}


def is_planar(ggml_type: int) -> bool:
    """Whether a type number is a planar layout (`strata.quant.planar`): dense weights only; the
    expert kernels never see one (experts keep GGUF's layout), so they are not built for it."""
    return int(ggml_type) in PLANAR_TYPES


def get_format(ggml_type: int | str) -> Format:
    """The format for a GGML type number or name; ValueError naming it when unsupported."""
    f = BY_NAME.get(ggml_type.upper()) if isinstance(ggml_type, str) else FORMATS.get(int(ggml_type))
    if f is None:
        names = ", ".join(BY_NAME)
        raise ValueError(f"GGML type {ggml_type!r} has no device decoder (supported: {names})")
    return f


def specialize(factory: Callable[[Format], Any]) -> Callable[[int | str], Any]:
    """Wrap `factory(fmt) -> kernel` into `get(ggml_type) -> kernel`, built once per format.

    numba compiles a kernel per closed-over device function, so each format gets its own kernel
    object; caching it here keeps one compile per format per process.
    """
    @functools.cache
    def by_type(t: int) -> Any:
        return factory(FORMATS[t])

    def get(ggml_type: int | str) -> Any:
        return by_type(get_format(ggml_type).ggml_type)
    get.factory = factory  # the compile check builds each specialization from it
    return get


__all__ = ["FORMATS", "BY_NAME", "Format", "get_format", "is_planar", "specialize"] + [
    f"{kind}32_{f.name.lower()}" for f in FORMATS.values() for kind in ("dq", "dot")]
