"""Device side of the planar layouts (`strata.quant.planar`): where a super-block's fields lie.

Every Q6_K reader takes the super-block's GGUF byte offset `o` (row r, super-block j of a row of
n_sb at (r * n_sb + j) * 210, from the tensor's first byte) and asks a `fields` function for the
byte offsets of its four fields (ql, qh, scales, d). GGUF's are o + 0, 128, 192, 208; the planar
layout's come from the super-block's index g = o // 210 (group g // 8, place g % 8), so a planar
tensor must be passed from its first byte (the engine's views are). The readers are built once per
`fields` (and load primitive): the planar ones load ql, qh and scales with aligned vector loads.
"""

from __future__ import annotations

from numba import cuda

from strata.quant.planar import Q6_K_P8

Q6_BYTES = Q6_K_P8.block_bytes         # 210
P8_GROUP = Q6_K_P8.group_bytes         # 1680: a group of 8 super-blocks
P8_QL = Q6_K_P8.field_offset(0)        # 0    ql[128] a super-block
P8_QH = Q6_K_P8.field_offset(1)        # 1024 qh[64]
P8_SC = Q6_K_P8.field_offset(2)        # 1536 int8 scales[16]
P8_D = Q6_K_P8.field_offset(3)         # 1664 f16 d
assert Q6_K_P8.group == 8 and (P8_QL, P8_QH, P8_SC, P8_D) == (0, 1024, 1536, 1664)


@cuda.jit(device=True, inline="always")
def q6_k_fields(o):
    """(ql, qh, scales, d) byte offsets of the GGUF Q6_K super-block at byte o."""
    return o, o + 128, o + 192, o + 208


@cuda.jit(device=True, inline="always")
def q6_k_p8_fields(o):
    """The same of the super-block GGUF puts at byte o, in the planar Q6_K_P8 layout."""
    g = o // Q6_BYTES
    b = (g >> 3) * P8_GROUP
    k = g & 7
    return b + P8_QL + 128 * k, b + P8_QH + 64 * k, b + P8_SC + 16 * k, b + P8_D + 2 * k
