"""The device KV cache of one layer: its byte layout per format, the readers the attention kernels
share, and the kernel that quantizes new keys/values into it at positions read from device memory.

One side (K or V) of one layer is a flat uint8 array laid out [n_ctx, n_kv_head, row_bytes]:
* "f16":  row = head_dim f16 values (row_bytes = 2 * head_dim);
* "int8": row = head_dim int8 values q, value = q * scale, with one f16 scale per (token, kv head)
          in a separate float16 array [n_ctx * n_kv_head] (scale = max|x| / 127);
* "q4_0": row = head_dim / 32 GGML Q4_0 blocks of 18 bytes (f16 d, 16 bytes: value i in the low
          nibble of byte i, value i + 16 in the high nibble; value = d * (q - 8)).
The sequence length lives in device memory (`seq_len`, int32 [1]: tokens already in the cache), so
the write and attention kernels can be captured in a CUDA graph and replayed at every position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32

from .intrinsics import h2f, ld_u16, ld_u32, ld_u32_any
from .mma import half2_lo, pack_half2, shfl_xor

KV_FORMATS = ("f16", "int8", "q4_0")


@dataclass(frozen=True, slots=True)
class KvLayout:
    """Shape and format of one layer's K or V cache."""

    fmt: str
    n_ctx: int
    n_kv_head: int
    head_dim: int

    def __post_init__(self):
        if self.fmt not in KV_FORMATS:
            raise ValueError(f"KV format {self.fmt!r} is not one of {KV_FORMATS}")
        if min(self.n_ctx, self.n_kv_head) < 1 or self.head_dim < 32 or self.head_dim % 32:
            raise ValueError(f"bad KV shape: n_ctx {self.n_ctx}, n_kv_head {self.n_kv_head}, "
                             f"head_dim {self.head_dim} (a multiple of 32 is required)")

    @property
    def row_bytes(self) -> int:
        return {"f16": 2 * self.head_dim, "int8": self.head_dim,
                "q4_0": self.head_dim // 32 * 18}[self.fmt]

    @property
    def token_rows_bytes(self) -> int:
        """Bytes of one token's rows (every KV head) on this side, scales excluded: the unit
        streamed KV maps, stages and reads over PCIe."""
        return self.n_kv_head * self.row_bytes

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token adds to this side of the cache (scales included)."""
        return self.token_rows_bytes + (2 * self.n_kv_head if self.fmt == "int8" else 0)


@dataclass(frozen=True, slots=True)
class KvSide:
    """One side of one layer: `data` uint8 [n_ctx * n_kv * row_bytes], `scale` float16
    [n_ctx * n_kv] for int8 (a 1-element placeholder otherwise)."""

    layout: KvLayout
    data: object
    scale: object


def allocate_kv_side(layout: KvLayout) -> KvSide:
    """Device arrays for one side of one layer (the engine may instead carve them from its arena)."""
    n_rows = layout.n_ctx * layout.n_kv_head
    scale = cuda.device_array(n_rows if layout.fmt == "int8" else 1, np.float16)
    return KvSide(layout, cuda.device_array(n_rows * layout.row_bytes, np.uint8), scale)


def make_reader(fmt: str, n_vals: int, row_bytes: int):
    """Device function read(data, scale, row, d0, out, o): values d0..d0+n_vals-1 of cache row
    `row` (= pos * n_kv_head + head) as f32 into out[o:o+n_vals]. n_vals divides 32; d0 is a
    multiple of n_vals."""
    if fmt == "f16":
        @cuda.jit(device=True, inline="always")
        def read(data, scale, row, d0, out, o):
            base = row * row_bytes + 2 * d0
            for i in range(n_vals // 2):
                w = ld_u32(data, base + 4 * i)
                out[o + 2 * i] = h2f(w & 0xFFFF)
                out[o + 2 * i + 1] = h2f(w >> 16)
            if n_vals % 2:  # one value a lane (head_dim 32 in the decode kernel)
                out[o + n_vals - 1] = h2f(ld_u16(data, base + 2 * (n_vals - 1)))
    elif n_vals % 4:
        @cuda.jit(device=True, inline="always")
        def read(data, scale, row, d0, out, o):  # int8 / q4_0, fewer than 4 values: bytes
            for i in range(n_vals):
                if fmt == "int8":
                    q = int(data[row * row_bytes + d0 + i])
                    out[o + i] = float32(q - ((q & 0x80) << 1)) * float32(scale[row])
                else:
                    blk = row * row_bytes + ((d0 + i) // 32) * 18
                    j = (d0 + i) % 32
                    q = (int(data[blk + 2 + j % 16]) >> (4 if j >= 16 else 0)) & 0xF
                    out[o + i] = float32(q - 8) * h2f(ld_u16(data, blk))
    elif fmt == "int8":
        @cuda.jit(device=True, inline="always")
        def read(data, scale, row, d0, out, o):
            base = row * row_bytes + d0
            s = float32(scale[row])
            for i in range(n_vals // 4):
                w = ld_u32(data, base + 4 * i)
                for b in range(4):
                    q = (w >> (8 * b)) & 0xFF
                    out[o + 4 * i + b] = float32(q - ((q & 0x80) << 1)) * s
    else:
        @cuda.jit(device=True, inline="always")
        def read(data, scale, row, d0, out, o):
            blk = row * row_bytes + (d0 // 32) * 18
            d = h2f(ld_u16(data, blk))
            i0 = d0 % 32
            shift = 4 if i0 >= 16 else 0
            for i in range(n_vals // 4):
                w = ld_u32_any(data, blk + 2 + i0 % 16 + 4 * i)
                for b in range(4):
                    q = (w >> (8 * b + shift)) & 0xF
                    out[o + 4 * i + b] = float32(q - 8) * d
    return read


@cuda.jit(device=True, inline="always")
def i8_scale(amax):
    """(the int8 row scale as stored, f16-rounded, of a row whose largest magnitude is amax; its
    inverse, 0 for an all-zero row): values are quantized with the stored scale, so q * scale
    reproduces them best."""
    s = half2_lo(pack_half2(amax / float32(127.0), float32(0.0)))
    return s, (float32(1.0) / s if s > 0 else float32(0.0))


@cuda.jit(device=True, inline="always")
def i8_byte(x, inv):
    """The int8 cache byte of x at inverse scale inv: rounded half up, clamped to +-127."""
    q = int(math.floor(x * inv + float32(0.5)))
    return min(127, max(-127, q)) & 0xFF


@cuda.jit(device=True, inline="always")
def _group_absmax(v, width):
    """(value of largest magnitude, its sign kept) over groups of `width` lanes (a power of 2)."""
    m = width // 2
    while m >= 1:
        o = shfl_xor(v, m)
        if abs(o) > abs(v) or (abs(o) == abs(v) and o > v):
            v = o
        m //= 2
    return v


def _write_kernel(fmt: str, head_dim: int):
    DPL = head_dim // 32  # values per lane; one warp per (token, kv head)
    ROW_BYTES = KvLayout(fmt, 1, 1, head_dim).row_bytes
    LANES_PER_BLOCK = 32 // DPL if DPL < 32 else 1

    @cuda.jit
    def write(src, seq_len, n_ctx, data, scale):
        """src [n_new, n_kv, head_dim] f32 -> cache rows at positions seq_len[0] + i."""
        t, h = cuda.blockIdx.x, cuda.blockIdx.y
        lane = cuda.threadIdx.x
        n_kv = src.shape[1]
        row = (seq_len[0] + t) * n_kv + h
        d0 = lane * DPL
        if row >= n_ctx * n_kv:
            return  # past the cache (the plan never lets this happen): dropped, not corrupting
        if fmt == "f16":
            for i in range(DPL // 2):
                w = pack_half2(src[t, h, d0 + 2 * i], src[t, h, d0 + 2 * i + 1])
                base = row * ROW_BYTES + 2 * d0 + 4 * i
                for b in range(4):
                    data[base + b] = (w >> (8 * b)) & 0xFF
        elif fmt == "int8":
            amax = float32(0.0)
            for i in range(DPL):
                amax = max(amax, abs(src[t, h, d0 + i]))
            for m in (16, 8, 4, 2, 1):
                amax = max(amax, shfl_xor(amax, m))
            s, inv = i8_scale(amax)
            for i in range(DPL):
                data[row * ROW_BYTES + d0 + i] = i8_byte(src[t, h, d0 + i], inv)
            if lane == 0:
                scale[row] = s
        else:
            # the signed value of largest magnitude in each 32-block maps to -8 (Q4_0's rule)
            big = src[t, h, d0]
            for i in range(1, DPL):
                if abs(src[t, h, d0 + i]) > abs(big):
                    big = src[t, h, d0 + i]
            big = _group_absmax(big, LANES_PER_BLOCK)
            d = big / float32(-8.0)
            inv = float32(1.0) / d if d != 0 else float32(0.0)
            blk = row * ROW_BYTES + (d0 // 32) * 18
            if d0 % 32 == 0:
                dbits = pack_half2(d, float32(0.0))
                data[blk] = dbits & 0xFF
                data[blk + 1] = (dbits >> 8) & 0xFF
            for i in range(DPL):
                j = (d0 + i) % 32
                if j < 16:  # the lane holding value j also packs value j + 16 into its byte
                    lo = max(0, min(15, int(src[t, h, d0 + i] * inv + float32(8.5))))
                    hi = max(0, min(15, int(src[t, h, d0 + i + 16] * inv + float32(8.5))))
                    data[blk + 2 + j] = lo | (hi << 4)
    return write


_WRITERS: dict = {}


def kv_write(src, side: KvSide, seq_len, *, stream=0):
    """Quantize src ([n_new, n_kv_head, head_dim] f32) into `side` at positions seq_len[0] + i.

    seq_len: int32 [1] device array, the number of tokens already cached (not advanced here: the
    engine advances it once per step with `advance_seq_len`, after every layer has written).
    """
    lay = side.layout
    shape = (None, lay.n_kv_head, lay.head_dim)
    if src.dtype != np.float32 or src.ndim != 3 or tuple(src.shape[1:]) != shape[1:]:
        raise ValueError(f"kv_write: src must be float32 [n_new, {lay.n_kv_head}, "
                         f"{lay.head_dim}], got {src.dtype} {tuple(src.shape)}")
    _check_seq_len(seq_len)
    key = (lay.fmt, lay.head_dim)
    if key not in _WRITERS:
        _WRITERS[key] = _write_kernel(*key)
    _WRITERS[key][(src.shape[0], lay.n_kv_head), 32, stream](src, seq_len, lay.n_ctx, side.data,
                                                              side.scale)


@cuda.jit
def _advance(seq_len, n):
    if cuda.grid(1) == 0:
        seq_len[0] += n


def advance_seq_len(seq_len, n_new: int, *, stream=0):
    """seq_len[0] += n_new on the device (capturable: no host round trip)."""
    _check_seq_len(seq_len)
    _advance[1, 32, stream](seq_len, n_new)


def _check_seq_len(seq_len):
    if seq_len.dtype != np.int32 or tuple(seq_len.shape) != (1,):
        raise ValueError(f"seq_len must be an int32 [1] device array, got {seq_len.dtype} "
                         f"{tuple(seq_len.shape)}")
