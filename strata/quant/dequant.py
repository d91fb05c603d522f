"""Host dequantization of whole rows or tensors of any supported GGML format to float32.

The njit range decoder `blocks.decode_blocks` does the work; large inputs are split into chunks
decoded in parallel by a thread pool (it releases the GIL). A float row's last values short of a
32-value group go through the any-length value decoder.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from strata.cpus import usable_cpus
from strata.quant.blocks import (
    BLOCK_DECODERS, FLOAT_VALUE_DECODERS, block_decoder, decode_blocks,
)
from strata.quant.types import QuantType, quant_type

# Work split: inputs under this many values are decoded on the calling thread; larger ones in
# chunks of about this many values, handed to a thread pool (decode_blocks releases the GIL).
_CHUNK_VALUES = 1 << 18
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=usable_cpus(),
                                   thread_name_prefix="strata-dequant")
    return _POOL


def _decode_into(q: QuantType, src: np.ndarray, out: np.ndarray) -> None:
    block_size, block_bytes, _ = block_decoder(q.ggml_type)
    n_blocks = out.size // block_size
    per_chunk = max(1, _CHUNK_VALUES // block_size)  # blocks per work item
    if n_blocks <= per_chunk:
        decode_blocks(q.ggml_type, src, 0, out, 0, n_blocks)
    else:
        # A pool with dynamic hand-out rather than numba's prange: prange splits the range
        # statically, and on a shared machine one descheduled thread stalls the whole call
        # (measured 8x slower than one thread on 2 busy cores).
        jobs = [_pool().submit(decode_blocks, q.ggml_type, src, first * block_bytes, out,
                               first * block_size, min(per_chunk, n_blocks - first))
                for first in range(0, n_blocks, per_chunk)]
        for job in jobs:
            job.result()
    n_tail = out.size - n_blocks * block_size  # float formats only: fewer than 32 values left
    if n_tail:
        FLOAT_VALUE_DECODERS[q.ggml_type](src, n_blocks * block_bytes, out, n_blocks * block_size,
                                          n_tail)


def _checked_type(ggml_type: int | str) -> QuantType:
    q = quant_type(ggml_type)  # ValueError for an unknown type
    if q.ggml_type not in BLOCK_DECODERS:
        block_decoder(q.ggml_type)  # raises the unsupported-type error
    return q


def _out_shape(raw: np.ndarray, q: QuantType, n_values_per_row: int | None) -> tuple[int, ...]:
    """The float32 shape of `raw`'s values; ValueError when the bytes are not whole blocks/rows."""
    if raw.ndim == 2:
        n_rows, row_bytes = raw.shape
        if row_bytes % q.block_bytes:
            raise ValueError(f"{q.name}: a row of {row_bytes} bytes is not a whole number of "
                             f"{q.block_bytes}-byte blocks")
        row_len = row_bytes // q.block_bytes * q.block_size
        if n_values_per_row is not None and n_values_per_row != row_len:
            raise ValueError(f"{q.name}: rows of {row_bytes} bytes hold {row_len} values, "
                             f"not n_values_per_row={n_values_per_row}")
        return (n_rows, row_len)
    n_bytes = raw.shape[0]
    if n_bytes % q.block_bytes:
        raise ValueError(f"{q.name}: {n_bytes} bytes are not a whole number of "
                         f"{q.block_bytes}-byte blocks")
    n_values = n_bytes // q.block_bytes * q.block_size
    if n_values_per_row is None:
        return (n_values,)
    if n_values_per_row <= 0:
        raise ValueError(f"{q.name}: n_values_per_row must be positive, got {n_values_per_row}")
    row_bytes = q.row_bytes(n_values_per_row)  # ValueError unless whole blocks
    if n_bytes % row_bytes:
        raise ValueError(f"{q.name}: {n_bytes} bytes are not a whole number of rows of "
                         f"{n_values_per_row} values ({row_bytes} bytes each)")
    return (n_bytes // row_bytes, n_values_per_row)


def dequantize(raw: np.ndarray, ggml_type: int | str,
               n_values_per_row: int | None = None) -> np.ndarray:
    """Decode GGML bytes to float32.

    `raw` is uint8: `[n_rows, row_bytes]` gives `[n_rows, row_len]`; flat `[n_bytes]` gives flat
    `[n_values]`, or `[n_rows, n_values_per_row]` when `n_values_per_row` is given. Raises
    ValueError for an unknown or unsupported type, a non-uint8 array, or bytes that are not a
    whole number of blocks (or rows).
    """
    q = _checked_type(ggml_type)
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8:
        got = raw.dtype if isinstance(raw, np.ndarray) else type(raw).__name__
        raise ValueError(f"{q.name}: raw must be a uint8 numpy array, got {got}")
    if raw.ndim not in (1, 2):
        raise ValueError(f"{q.name}: raw must be 1-D bytes or 2-D rows of bytes, got shape "
                         f"{raw.shape}")
    shape = _out_shape(raw, q, n_values_per_row)
    # A read-only input (a mapped file) is copied once: the raw bytes are a fraction of the
    # float32 output, and one writable-typed driver avoids a second compilation of every decoder.
    src = np.ascontiguousarray(raw).reshape(-1)  # [n_bytes] u8
    if not src.flags.writeable:
        src = src.copy()
    out = np.empty(int(np.prod(shape)), dtype=np.float32)  # [n_values] f32
    _decode_into(q, src, out)
    return out.reshape(shape)


def dequantize_tensor(model_file, name: str) -> np.ndarray:
    """A tensor of an open `ModelFile` as float32, in numpy order (outermost dimension first)."""
    raw = model_file.raw(name)  # raises ModelFileError naming the file for an unknown tensor
    t = model_file.tensors[name]
    values = dequantize(raw, t.ggml_type, t.ne[0])  # [n_rows, ne[0]] f32
    return values.reshape(t.np_shape)
