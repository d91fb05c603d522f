"""The simulator's bit casts, byte permute, dp4a, byte_to_f32 and byte-array loads
(`cuda_kernels/intrinsics_sim.py`, made cheap with struct and one-slice reads) against plain
numpy and per-byte definitions of the same operations, bit for bit: every half, random and
special float32 patterns (signed zeros, subnormals, infinities, quiet and signalling NaNs with
payloads), selectors with and without sign replication, words running past an array's end."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda  # a module global: the simulator swaps it for its own in a kernel

from strata.cuda_kernels import intrinsics_sim as S

RNG = np.random.default_rng(7)
SPECIAL32 = [0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,
             0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0xFF812345, 0x4B000000,
             0x4B0000FF, 0x3F800000, 0x7FFFFFFF]


def f32_bits(v) -> int:
    return int(np.array([v], dtype=np.float32).view(np.uint32)[0])


def ref_prmt(a: int, b: int, sel: int) -> int:
    both = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    out = 0
    for k in range(4):
        nib = (sel >> (4 * k)) & 0xF
        byte = (both >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * k)
    return out


def ref_dp4a(a: int, b: int, c: int) -> int:
    va = np.array([a & 0xFFFFFFFF], dtype=np.uint32).view(np.int8).astype(np.int64)
    vb = np.array([b & 0xFFFFFFFF], dtype=np.uint32).view(np.int8).astype(np.int64)
    return c + int((va * vb).sum())


def test_h2f_is_numpys_half_for_every_pattern():
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    got = np.array([S.h2f(b) for b in range(1 << 16)], dtype=np.float32)
    assert all(type(S.h2f(b)) is np.float32 for b in (0, 0x3C00, 0x7C00, 0x7E01))
    np.testing.assert_array_equal(got.view(np.uint32), halves.view(np.uint32))
    assert S.h2f(0x13C00) == np.float32(1.0)  # only the low 16 bits count


def test_u2f_and_f2u_keep_every_bit():
    for bits in SPECIAL32 + [int(x) for x in RNG.integers(0, 1 << 32, 20000)]:
        v = S.u2f(bits)
        assert type(v) is np.float32
        assert f32_bits(v) == bits, hex(bits)  # numpy's reading of the float's bits
        assert S.f2u(v) == bits, hex(bits)  # NaN payloads too: the round trip is the identity


def test_u2f_takes_only_the_low_word_and_f2u_rounds_a_double_as_numpy():
    assert f32_bits(S.u2f(0x1_3F800000)) == 0x3F800000
    doubles = RNG.standard_normal(5000) * np.exp2(RNG.integers(-140, 128, 5000))
    with np.errstate(over="ignore"):  # past float32's range: inf, as the cast makes it
        for d in list(doubles) + [1e-46, -1e-46, 3.5e38, -3.5e38, 0.1, float("inf")]:
            assert S.f2u(float(d)) == f32_bits(float(d))


def test_prmt_matches_the_byte_definition():
    sels = [0x3210, 0x7654, 0x4441, 0xBA98, 0x7440, 0xCC40, 0xFF73, 0x0000, 0x8888, 0xFFFF]
    sels += [int(s) for s in RNG.integers(0, 1 << 16, 3000)]
    words = RNG.integers(0, 1 << 32, (len(sels), 2))
    for sel, (a, b) in zip(sels, words):
        a, b = int(a), int(b)
        assert S.prmt(a, b, sel) == ref_prmt(a, b, sel), (hex(a), hex(b), hex(sel))
    assert S.prmt(0x1_00000080, -1, 0x10098) == ref_prmt(0x80, 0xFFFFFFFF, 0x0098)


def test_dp4a_matches_the_signed_byte_dot():
    extremes = [0, 0x7F7F7F7F, 0x80808080, 0xFFFFFFFF, 0x017F80FF]
    for a in extremes:
        for b in extremes:
            assert S.dp4a(a, b, -3) == ref_dp4a(a, b, -3)
    for a, b, c in RNG.integers(-(1 << 31), 1 << 32, (20000, 3)):
        assert S.dp4a(int(a), int(b), int(c)) == ref_dp4a(int(a), int(b), int(c))


def test_the_simulators_byte_to_f32_is_the_device_body():
    from strata.cuda_kernels import intrinsics as I

    assert I.SIMULATED and I.byte_to_f32 is not I.byte_to_f32_device
    biases = [np.float32(8388608.0), np.float32(8388608.0 + 32.0), np.float32(8388608.0 + 128.0)]
    for byte in range(256):
        for b in range(4):
            w = (int(RNG.integers(0, 1 << 32)) & ~(0xFF << (8 * b))) | (byte << (8 * b))
            for bias in biases:
                got, want = I.byte_to_f32(w, b, bias), I.byte_to_f32_device(w, b, bias)
                assert type(got) is np.float32 and got == want, (hex(w), b, bias)


def ref_ld_u32(a: np.ndarray, off: int) -> int:
    return sum(int(a[off + i]) << (8 * i) for i in range(min(4, len(a) - off)))


def test_ld_u32_reads_the_word_in_and_out_of_a_kernel():
    a = RNG.integers(0, 256, 61, dtype=np.uint8)  # the last word runs past the end: zeros
    offs = np.arange(0, 61, 4)
    want = [ref_ld_u32(a, int(o)) for o in offs]
    assert [S.ld_u32(a, int(o)) for o in offs] == want
    for bad in (64, -4):
        with pytest.raises(IndexError):
            S.ld_u32(a, bad)
    with pytest.raises(IndexError, match="misaligned"):
        S.ld_u32(a, 2)

    @cuda.jit
    def words(w, out):  # w through the simulator's in-kernel array wrapper
        i = cuda.threadIdx.x
        if i < out.shape[0]:
            out[i] = S.ld_u32(w, 4 * i)

    out = np.zeros(len(offs), dtype=np.int64)
    words[1, 32](cuda.to_device(a), out)
    np.testing.assert_array_equal(out, want)


def test_vector_loads_read_their_words_and_zeros_past_the_end():
    a = RNG.integers(0, 256, 44, dtype=np.uint8)
    for off in range(0, 44, 8):  # the last 8 bytes run 4 past the end: its second word is 0
        assert S.ld_nc_u32x2(a, off) == (ref_ld_u32(a, off),
                                         ref_ld_u32(a, off + 4) if off + 4 < 44 else 0)
    for off in (0, 16):
        assert S.ld_nc_u32x4(a, off) == tuple(ref_ld_u32(a, off + 4 * k) for k in range(4))
    with pytest.raises(IndexError):
        S.ld_nc_u32x4(a, 32)  # its fourth word would start past the end
    with pytest.raises(IndexError, match="misaligned"):
        S.ld_nc_u32x2(a, 4)
