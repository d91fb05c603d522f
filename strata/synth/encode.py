"""Float rows -> GGML blocks, for the values the synthesizer designs (the token embedding carries
the routing direction, see `strata.synth.routing`; the head's filler-token rows push those
tokens' logits down).

gguf-py quantizes the simple formats; the K and IQ formats those tensors can take (Q4_K, Q6_K,
IQ4_XS, IQ3_S, IQ4_NL) are encoded here with plain round-to-nearest choices. They need not be good
quantizers, only faithful to the block layouts: what the file means is whatever
`gguf.quants.dequantize` reads back, and the tests compare the two.
"""

from __future__ import annotations

import functools

import numpy as np
from gguf import GGMLQuantizationType, quants

from strata.quant.types import quant_type

QK = 256  # values per K / IQ super-block
_GGUF_QUANTIZE = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "BF16")


def _f16(x: np.ndarray) -> np.ndarray:
    """Scale fields as stored (fp16) and as read back (float32)."""
    return np.asarray(x, np.float32).astype(np.float16)


def _nearest(table: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Index of the nearest entry of the sorted 1-D `table` for every value of `v`."""
    hi = np.clip(np.searchsorted(table, v), 1, len(table) - 1)
    lo = hi - 1
    return np.where(np.abs(v - table[lo]) <= np.abs(table[hi] - v), lo, hi).astype(np.uint8)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """[n, 2, m] values 0..15 -> [n, m] bytes: first half low nibble, second half high."""
    return (q[:, 0] | (q[:, 1] << 4)).astype(np.uint8)


def _iq4nl_values() -> np.ndarray:
    return np.asarray(quants.IQ4_NL.kvalues, np.float32)


@functools.lru_cache(maxsize=1)
def _iq4nl_lookup() -> np.ndarray:
    """Nearest IQ4_NL table index for every integer -128..127: [256] uint8 (the table's steps
    are >= 10 apart, so rounding to an integer first changes no choice but exact ties)."""
    return _nearest(_iq4nl_values(), np.arange(-128, 128, dtype=np.float32))


def _iq4nl_index(v: np.ndarray) -> np.ndarray:
    """Nearest IQ4_NL table index of each value of `v` (in table units)."""
    i = np.clip(np.rint(v), -128, 127).astype(np.int16) + 128
    return _iq4nl_lookup()[i]


def encode_iq4_nl(x: np.ndarray) -> np.ndarray:
    """[n, 32] float -> [n, 18] IQ4_NL blocks (d scales the fixed 16-value table)."""
    kv = _iq4nl_values()
    big = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]
    d = _f16(big / kv[0])
    df = d.astype(np.float32)
    safe = np.where(df == 0, 1, df)[:, None]
    q = _iq4nl_index(x / safe).reshape(-1, 2, 16)
    out = np.empty((x.shape[0], 18), np.uint8)
    out[:, :2] = d.view(np.uint8).reshape(-1, 2)
    out[:, 2:] = _pack_nibbles(q)
    return out


def encode_iq4_xs(x: np.ndarray) -> np.ndarray:
    """[n, 256] float -> [n, 136] IQ4_XS blocks: d, 6-bit signed sub-scales, table indices."""
    n = x.shape[0]
    kv = _iq4nl_values()
    sub = x.reshape(n, 8, 32)
    big = np.take_along_axis(sub, np.abs(sub).argmax(axis=2)[..., None], axis=2)[..., 0]
    s = big / kv[0]  # [n, 8] signed float scale of each 32-value sub-block
    d = _f16(np.abs(s).max(axis=1) / 31)
    df = d.astype(np.float32)[:, None]
    ls = np.clip(np.rint(s / np.where(df == 0, 1, df)), -32, 31).astype(np.int32)  # [n, 8]
    dl = (df * ls)[..., None]
    q = _iq4nl_index(sub / np.where(dl == 0, 1, dl)).reshape(n, 8, 2, 16)
    u = (ls + 32).astype(np.uint16)
    out = np.empty((n, 136), np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    sh = ((u >> 4) & 3) << (2 * np.arange(8, dtype=np.uint16))
    out[:, 2:4] = np.bitwise_or.reduce(sh, axis=1).astype("<u2").view(np.uint8).reshape(n, 2)
    ul = (u & 0xF).astype(np.uint8).reshape(n, 4, 2)
    out[:, 4:8] = ul[:, :, 0] | (ul[:, :, 1] << 4)
    out[:, 8:] = _pack_nibbles(q.reshape(n * 8, 2, 16)).reshape(n, 128)
    return out


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins [n, 8] -> the 12-byte packed field of Q4_K / Q5_K."""
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4)
    return out


def encode_q4_k(x: np.ndarray) -> np.ndarray:
    """[n, 256] float -> [n, 144] Q4_K blocks: value = d*sc*q - dmin*m per 32-value sub-block."""
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    lo = np.minimum(sub.min(axis=2), 0)
    scale = (sub.max(axis=2) - lo) / 15
    d = _f16(scale.max(axis=1) / 63)
    dmin = _f16(-lo.min(axis=1) / 63)
    df, mf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(scale / np.where(df == 0, 1, df)), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(-lo / np.where(mf == 0, 1, mf)), 0, 63).astype(np.uint8)
    step = (df * sc)[..., None]
    q = np.rint((sub + (mf * m)[..., None]) / np.where(step == 0, 1, step))
    q = np.clip(q, 0, 15).astype(np.uint8).reshape(n * 4, 2, 32)
    out = np.empty((n, 144), np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    out[:, 2:4] = dmin.view(np.uint8).reshape(n, 2)
    out[:, 4:16] = _pack_k_scales(sc, m)
    out[:, 16:] = _pack_nibbles(q).reshape(n, 128)
    return out


def encode_q6_k(x: np.ndarray) -> np.ndarray:
    """[n, 256] float -> [n, 210] Q6_K blocks: value = d * scale * (q - 32), an int8 scale per
    16 values, 6-bit q split into a low nibble (ql) and two high bits (qh)."""
    n = x.shape[0]
    grp = x.reshape(n, 16, 16)
    sg = np.abs(grp).max(axis=2) / 31  # [n, 16] wanted step of each 16-value group
    d = _f16(sg.max(axis=1) / 127)
    df = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(sg / np.where(df == 0, 1, df)), 0, 127).astype(np.int8)
    step = (df * sc)[..., None]
    q = np.clip(np.rint(grp / np.where(step == 0, 1, step)), -32, 31).astype(np.int16) + 32
    q = q.astype(np.uint8).reshape(n, 2, 128)  # two halves of 128 values
    lo, hi = q & 0xF, q >> 4
    out = np.empty((n, 210), np.uint8)
    out[:, 0:128] = (lo[:, :, :64] | (lo[:, :, 64:] << 4)).reshape(n, 128)
    hi4 = hi.reshape(n, 2, 4, 32) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    out[:, 128:192] = np.bitwise_or.reduce(hi4, axis=2).reshape(n, 64)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d.view(np.uint8).reshape(n, 2)
    return out


@functools.lru_cache(maxsize=1)
def _iq3s_lookup() -> np.ndarray:
    """For each of the 8**4 combinations of four odd levels 1..15, the nearest IQ3_S grid
    entry: [4096] uint16 (the grid holds only 512 of the combinations)."""
    quants.IQ3_S.init_grid()
    grid = np.asarray(quants.IQ3_S.grid, np.float32).reshape(512, 4)
    lv = np.arange(8, dtype=np.float32) * 2 + 1
    combos = np.stack(np.meshgrid(lv, lv, lv, lv, indexing="ij"), axis=-1)
    combos = combos[..., ::-1].reshape(4096, 4)  # code = l0 + 8 l1 + 64 l2 + 512 l3
    dist = ((combos[:, None, :] - grid[None, :, :]) ** 2).sum(axis=2)
    return dist.argmin(axis=1).astype(np.uint16)


def encode_iq3_s(x: np.ndarray) -> np.ndarray:
    """[n, 256] float -> [n, 110] IQ3_S blocks: d*(1+2s) per 32 values, a 9-bit grid index per
    4 magnitudes, one sign bit per value."""
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    db = np.abs(sub).max(axis=2) / 15  # [n, 8] wanted step of each sub-block
    d = _f16(db.max(axis=1) / 31)
    df = d.astype(np.float32)[:, None]
    s = np.clip(np.rint((db / np.where(df == 0, 1, df) - 1) / 2), 0, 15).astype(np.uint8)
    step = (df * (1 + 2 * s.astype(np.float32)))[..., None]
    mag = np.abs(sub) / np.where(step == 0, 1, step)
    lvl = np.clip(np.rint((mag - 1) / 2), 0, 7).astype(np.uint16).reshape(n, 64, 4)
    code = lvl[..., 0] | (lvl[..., 1] << 3) | (lvl[..., 2] << 6) | (lvl[..., 3] << 9)
    idx = _iq3s_lookup()[code]  # [n, 64]
    bits = (x.reshape(n, 32, 8) < 0).astype(np.uint8) << np.arange(8, dtype=np.uint8)
    high = ((idx >> 8) & 1).astype(np.uint8).reshape(n, 8, 8) << np.arange(8, dtype=np.uint8)
    out = np.empty((n, 110), np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    out[:, 2:66] = (idx & 0xFF).astype(np.uint8)
    out[:, 66:74] = np.bitwise_or.reduce(high, axis=2)
    out[:, 74:106] = np.bitwise_or.reduce(bits, axis=2)
    s2 = s.reshape(n, 4, 2)
    out[:, 106:110] = s2[:, :, 0] | (s2[:, :, 1] << 4)
    return out


_ENCODERS = {"IQ4_NL": (32, encode_iq4_nl), "IQ4_XS": (QK, encode_iq4_xs),
             "Q4_K": (QK, encode_q4_k), "Q6_K": (QK, encode_q6_k),
             "IQ3_S": (QK, encode_iq3_s)}
ENCODABLE = ("F32", "F16", *_GGUF_QUANTIZE, *_ENCODERS)


def encode_rows(x: np.ndarray, type_name: str) -> np.ndarray:
    """Encode float rows [n_rows, row_len] as `type_name`: [n_rows, row_bytes] uint8."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_rows, row_len = x.shape
    q = quant_type(type_name)
    if type_name == "F32":
        return x.view(np.uint8)
    if type_name == "F16":
        return x.astype(np.float16).view(np.uint8)
    if type_name in _GGUF_QUANTIZE:
        return quants.quantize(x, GGMLQuantizationType[type_name])
    if type_name not in _ENCODERS:
        raise ValueError(f"cannot encode float values as {type_name} "
                         f"(encodable: {', '.join(ENCODABLE)})")
    block, fn = _ENCODERS[type_name]
    if row_len % block:
        raise ValueError(f"{type_name}: rows of {row_len} values are not whole {block}-value "
                         f"blocks")
    blocks = fn(x.reshape(-1, block))
    return blocks.reshape(n_rows, q.row_bytes(row_len))
