"""Probe (not part of the engine): would IQ4_XS and IQ3_S matvecs run faster from a layout whose
lane slices are 16-byte aligned, as Q6_K's did (`Q6_K_P8`, 8-12 points of a read of its bytes)?

IQ4_XS's super-block is 136 bytes and IQ3_S's 110, so a lane's slice starts at 8- or 2-byte
alignment: IQ4_XS loads 40 bytes as five 8-byte loads, IQ3_S its 16 qs bytes as three 8-byte
loads and four funnel shifts (`spans.span4`), its 8 sign bytes as two and two. This rewrites a
copy of `cuda_kernels/lanes_x8.py` so the 8-bit decoders load from where a planar layout would
put each field (timing only: the sums are wrong, the bytes read the same):
* IQ4_XS in pairs of super-blocks (272 bytes): both headers, then both qs planes; a lane loads
  its header (8 bytes) and its 32 qs bytes as two 16-byte loads;
* IQ3_S in groups of 8 (880 bytes): the qs, signs, qh, scales and d of the 8 in planes; a lane
  loads its qs as one 16-byte load, its signs as one 8-byte load, qh, scale and d as before.
Every row of the bench's shapes is a whole number of pairs / groups and starts 16-byte aligned.

    python bench/probes/aligned_iq_loads.py /tmp/al/strata/cuda_kernels/lanes_x8.py

then time both copies with `bench/probes/matvec_ab.py --formats IQ4_XS,IQ3_S --read`.
"""
from __future__ import annotations

import sys

LOADERS = '''

@cuda.jit(device=True, inline="always")
def load_iq4_xs_x8(w, off, part):
    # timing probe (bench/probes/aligned_iq_loads.py): pair layout, wrong sums
    odd = (off & 8) != 0
    hdr = off - 128 if odd else off
    q = off + (8 if odd else 16) + 32 * part
    h0, h1 = ld_nc_u32x2(w, hdr)
    q0, q1, q2, q3 = ld_nc_u32x4(w, q)
    q4, q5, q6, q7 = ld_nc_u32x4(w, q + 16)
    return (h0, h1, q0, q1, q2, q3, q4, q5, q6, q7)


@cuda.jit(device=True, inline="always")
def load_iq3_s_aligned(w, off, part):
    # timing probe (bench/probes/aligned_iq_loads.py): groups of 8 in planes, wrong sums
    k = (off // 110) & 7
    base = off - 110 * k
    q0, q1, q2, q3 = ld_nc_u32x4(w, base + 64 * k + 16 * part)
    s0, s1 = ld_nc_u32x2(w, base + 512 + 32 * k + 8 * part)
    return (q0, q1, q2, q3, s0, s1, ld_u16(w, base + 768 + 8 * k + 2 * part),
            ld_u8(w, base + 832 + 4 * k + part), ld_u16(w, base + 864 + 2 * k))

'''


def patch(text: str) -> str:
    start = text.index("@cuda.jit(device=True, inline=\"always\")\ndef load_iq4_xs_x8(")
    end = text.index("\n\n\n", start)
    text = text[:start] + LOADERS.strip("\n") + text[end:]
    old = "    _x8(T.IQ3_S, dot_iq3_s_x8),"
    if old not in text:
        raise SystemExit("aligned_iq_loads: lanes_x8.py's IQ3_S entry moved; update the probe")
    text = text.replace(old, "    _x8(T.IQ3_S, dot_iq3_s_x8, load=load_iq3_s_aligned),")
    return text.replace("from .intrinsics import (dp4a,", "from .intrinsics import (ld_u8, dp4a,")


if __name__ == "__main__":
    path = sys.argv[1]
    with open(path) as f:
        src = f.read()
    with open(path, "w") as f:
        f.write(patch(src))
    print(f"aligned_iq_loads: patched {path}")
