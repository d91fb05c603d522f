"""IQ4_NL / IQ4_XS levels looked up four at a time by byte permutes, and IQ4_XS's sub-block
scales (the decode lanes' dots and the prefill GEMM's split loader share them).

The 16 levels are int8 values, four to a word. A `prmt` takes four 3-bit indices from the low 16
bits of its selector (bit 3 of an index would make it replicate a sign instead), so the nibbles'
low 3 bits pick from levels 0-7 and from 8-15, and a third permute picks between the two by each
nibble's top bit; the bytes come out in nibble order (low, high, low, high), and two more
permutes put them in value order.
"""

from __future__ import annotations

from numba import cuda

from .intrinsics import prmt
from .qtables import KVALUES_IQ4NL

# The 16 levels as int8 bytes, four to a word (levels 0-3, 4-7, 8-11, 12-15)
IQ4_L0, IQ4_L1, IQ4_L2, IQ4_L3 = (int(v) for v in KVALUES_IQ4NL.astype("i1").view("u4"))
# The pick selector's top-bit mask from an identity permute (compile time; False: an immediate).
# (q >> 1) & 0x44444444 | 0x32103210 holds two immediates, which one LOP3 cannot take, so ptxas
# spends two; with the mask in a register it is one (and the shift). SASS a step: IQ4_XS's x
# between loop 426 -> 412, one-pair 435 -> 423, rounds 734 -> 720, at 128 / 80 / 128 registers
# (124 / 80 / 126 with the immediate; no spill). On an H100, alternating twice, every IQ4_XS
# shape 1-4% faster (bench/results/2026-12-07_iq4xs_pick_mask_h100.json).
PICK_MASK_IN_REGISTER = True


@cuda.jit(device=True, inline="always")
def iq4_xs_scale(head0, head1, sub):
    """IQ4_XS sub-block `sub`'s 6-bit scale (0..63, before its bias of 32), from the super-block's
    first two words: head0 = d | scales_h << 16, head1 = scales_l."""
    return ((head1 >> (4 * sub)) & 0xF) | (((head0 >> (16 + 2 * sub)) & 3) << 4)


@cuda.jit(device=True, inline="always")
def iq4_levels(q):
    """(the levels of q's four low nibbles, of its four high nibbles): int8 bytes, byte i the
    level of byte i's nibble."""
    return iq4_levels_of(q, IQ4_L0, IQ4_L1, IQ4_L2, IQ4_L3)


@cuda.jit(device=True, inline="always")
def iq4_levels_of(q, l0, l1, l2, l3):
    """iq4_levels with the four level words given (IQ4_L0..3, or loaded from the format's
    table: see `qtables.TABLE_IQ4NL`)."""
    qm = q & 0x77777777
    if PICK_MASK_IN_REGISTER:  # compile time
        pick = 0x32103210 | ((q >> 1) & prmt(0x44444444, 0, 0x3210))
    else:
        pick = 0x32103210 | ((q >> 1) & 0x44444444)
    q2 = qm >> 16
    r0 = prmt(prmt(l0, l1, qm), prmt(l2, l3, qm), pick)
    r1 = prmt(prmt(l0, l1, q2), prmt(l2, l3, q2), pick >> 16)
    return prmt(r0, r1, 0x6420), prmt(r0, r1, 0x7531)
