"""The 8-bit staging of x (`xstage.stage_x8`) against the CPU engine's `quantize_x8`, bit for bit,
and the layout the 8-bit decoders (`lanes_x8`) read: bank spread and geometry checks. The dots
themselves are checked through the kernels that use them (test_lanes, test_moe)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, types

from strata.cuda_kernels.lanes import LaneFormat
from strata.cuda_kernels.lanes_x8 import x8_format
from strata.cuda_kernels.qformats import BY_NAME
from strata.cuda_kernels.qtables import NO_TABLE
from strata.cuda_kernels.xstage import X8_SPAN, stage_x8, stage_x8_normed, x8_len
from strata.engine.cpu.idot import quantize_x8


def _x8_word(v):
    return v // 4 + 4 * (v // 64)


def _stage_kernel(normed: bool):
    @cuda.jit
    def k(x, nw, scale, n, off, xn, out):
        xs = cuda.shared.array(0, types.uint32)
        if normed:
            stage_x8_normed(x, nw, scale, n, xs, off, xn, True)
        else:
            stage_x8(x, n, xs, off)
        cuda.syncthreads()
        for i in range(cuda.threadIdx.x, out.shape[0], cuda.blockDim.x):
            out[i] = xs[i]
    return k


def _unpack(out, n):
    """(q int8 [n], dx f32 [n // 32], S f32 [n // 32]) from the staged words."""
    q = out[:x8_len(n)].view(np.int8)
    pos = np.array([4 * _x8_word(v - v % 4) + v % 4 for v in range(n)])
    sums = out[x8_len(n):].view(np.float32).reshape(-1, 4)  # per 64 values: dx a, b; S a, b
    return q[pos], sums[:, :2].reshape(-1), sums[:, 2:].reshape(-1)


def _want(x32):
    n = x32.shape[0]
    qx = np.empty((1, n), np.int8)
    dx = np.empty((1, n // 32), np.float32)
    quantize_x8(x32[None], qx, dx, np.empty((1, n // 16), np.float32))
    s = qx[0].astype(np.int32).reshape(-1, 32).sum(1).astype(np.float32)
    return qx[0], dx[0], dx[0] * s


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_stage_x8_equals_the_cpu_engines_quantization(dtype):
    """640 values over 64 threads (two passes, the second partial): the int8 values, the group
    scales and dx * sum(q), bit for bit; ties round to even as np.rint does (x = k + 0.5 with
    dx = 1: a group whose max is 127), zeros give dx = 0 and q = 0."""
    n = 640
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(n) * rng.uniform(0.01, 10, n // 32).repeat(32)).astype(dtype)
    x[:32] = np.array([127.0, 2.5, 3.5, -2.5, -0.5, 0.5, 126.5] + [1.5] * 25, dtype)
    x[32:64] = 0
    out = np.zeros(x8_len(n) + n // 16, np.uint32)
    _stage_kernel(False)[1, 64, 0, 4 * out.size](x, x[:0].astype(np.float32), np.float32(1), n,
                                                 x8_len(n), x[:0].astype(np.float32), out)
    q, dx, s = _unpack(out, n)
    want_q, want_dx, want_s = _want(x.astype(np.float32))
    np.testing.assert_array_equal(q, want_q)
    np.testing.assert_array_equal(dx, want_dx)
    np.testing.assert_array_equal(s, want_s)
    assert q[:7].tolist() == [127, 2, 4, -2, 0, 0, 126]  # ties to even
    assert dx[1] == 0 and not q[32:64].any()


def test_stage_x8_normed_quantizes_the_normed_vector_and_writes_it():
    n = 256
    rng = np.random.default_rng(8)
    x = rng.standard_normal(n).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, n).astype(np.float32)
    scale = np.float32(0.37)
    xn = np.full(n, np.nan, np.float32)
    out = np.zeros(x8_len(n) + n // 16, np.uint32)
    _stage_kernel(True)[1, 32, 0, 4 * out.size](x, nw, scale, n, x8_len(n), xn, out)
    v = x * scale * nw  # float32, in the kernel's order
    np.testing.assert_array_equal(xn, v)
    q, dx, s = _unpack(out, n)
    want_q, want_dx, want_s = _want(v)
    np.testing.assert_array_equal(q, want_q)
    np.testing.assert_array_equal(dx, want_dx)
    np.testing.assert_array_equal(s, want_s)


def test_q4_k_reads_spread_each_phase_over_all_bank_groups():
    """A Q4_K lane (4 a super-block) reads 16 bytes of x at x8_word(64 part) + 0, 4 (low
    nibbles' group) and + 8, 12 (high): the 8 lanes a 16-byte shared load serves land in 8
    distinct 16-byte bank groups."""
    lf = x8_format(BY_NAME["Q4_K"].ggml_type)
    assert lf.x8 and lf.padded_sb == _x8_word(256) == 80
    for extra in (0, 4, 8, 12):
        for phase in range(4):
            groups = {((lf.padded_sb * (lane // 4) + 20 * (lane % 4) + extra) // 4) % 8
                      for lane in range(8 * phase, 8 * phase + 8)}
            assert len(groups) == 8, (extra, phase, groups)


def test_x8_lane_format_geometry():
    base = dict(ggml_type=0, name="X", sb_bytes=64, pad=(5, 4, 31, 0), sums=False,
                load=None, dot=None, table=NO_TABLE)
    with pytest.raises(ValueError, match=f"{X8_SPAN}-value"):
        LaneFormat(sb_values=32, lanes=1, x8=True, **base)
    with pytest.raises(ValueError, match=f"reads {X8_SPAN} values .* not 32"):
        LaneFormat(sb_values=256, lanes=8, x8=True, **base)
    lf = LaneFormat(sb_values=256, lanes=4, x8=True, **base)
    assert lf.stage_len(2048) == x8_len(2048) == 512 + 128
    assert lf.stage_bytes(2048) == 4 * (640 + 128)  # dx and dx * sum, 2 words per group
    assert lf.sb_sums == 16


def test_q6_k_reads_spread_each_phase_over_all_bank_groups():
    """A Q6_K lane p = 2n + h reads its 16-value chunks c at x8_word(128n + 16h + 32c) (+ 0, 8,
    20, 28 from the first): the 8 lanes of a 16-byte shared load land in 8 distinct bank groups,
    and the dx words of its x groups at so + 8n (+ 4) are shared only by the two lanes of a half."""
    lf = x8_format(BY_NAME["Q6_K"].ggml_type)
    assert lf.x8 and lf.lanes == 4 and lf.padded_sb == 80
    for c, extra in enumerate((0, 8, 20, 28)):
        for lane in range(4):
            n, h = lane >> 1, lane & 1
            assert 40 * n + 4 * h + extra == _x8_word(128 * n + 16 * h + 32 * c)
        for phase in range(4):
            lanes = range(8 * phase, 8 * phase + 8)
            groups = {((lf.padded_sb * (lane // 4) + 40 * ((lane % 4) >> 1) + 4 * (lane & 1)
                        + extra) // 4) % 8 for lane in lanes}
            assert len(groups) == 8, (extra, phase, groups)
    for phase in range(4):
        dx = {(lf.sb_sums * (lane // 4) + 8 * ((lane % 4) >> 1)) for lane in
              range(8 * phase, 8 * phase + 8)}
        assert len({(w // 4) % 8 for w in dx}) == len(dx) == 4


def test_iq4_level_words_in_the_table_are_the_int8_levels_twice():
    """The rounds decoder of IQ4_XS reads its level words from the format's table: both copies
    (even and odd lanes) are gguf's IQ4_NL levels as int8, four to a word, after the 16 float
    levels the float32 decoders index; the immediates the other decoders use are the same."""
    from gguf import quants

    from strata.cuda_kernels import levels
    from strata.cuda_kernels.qtables import IQ4NL_WORDS_OFF, TABLE_IQ4NL
    want = np.array(quants.IQ4_NL.kvalues, np.int8)
    assert np.array_equal(TABLE_IQ4NL[:16], want.astype(np.float32))
    bits = TABLE_IQ4NL.view(np.uint32)[IQ4NL_WORDS_OFF // 4:]
    assert bits.size == 8
    for copy in (bits[:4], bits[4:]):
        assert np.array_equal(copy.view(np.int8), want)
    assert [levels.IQ4_L0, levels.IQ4_L1, levels.IQ4_L2, levels.IQ4_L3] == [int(b) for b in bits[:4]]
    # kernels stage the table as float32 (loads and stores): words whose float is a normal
    # number, never a NaN or a subnormal, cross it unchanged on any path
    words = TABLE_IQ4NL[16:]
    assert np.all(np.isfinite(words)) and np.all(np.abs(words) >= np.finfo(np.float32).tiny)


def test_rounds_decoding_swaps_only_iq4_xs_on_8_bit_x():
    from strata.cuda_kernels.lanes import lane_format
    from strata.cuda_kernels.lanes_x8 import dot_iq4_xs_x8_loaded, rounds_decoding
    iq4 = BY_NAME["IQ4_XS"].ggml_type
    assert rounds_decoding(x8_format(iq4)).dot is dot_iq4_xs_x8_loaded
    assert rounds_decoding(lane_format(iq4)) is lane_format(iq4)  # float32 x: its own decoder
    for name in ("Q4_K", "Q6_K", "IQ3_S"):
        lf = x8_format(BY_NAME[name].ggml_type)
        assert rounds_decoding(lf) is lf


@pytest.mark.parametrize("in_register", [False, True])
def test_iq4_levels_are_the_nibbles_levels(in_register, monkeypatch):
    """`levels.iq4_levels`: byte i of the first word the int8 level of byte i's low nibble, of
    the second its high nibble's, on random words and every nibble value, with the pick's mask
    an immediate or in a register (`levels.PICK_MASK_IN_REGISTER`)."""
    from strata.cuda_kernels import levels
    from strata.cuda_kernels.qtables import KVALUES_IQ4NL
    monkeypatch.setattr(levels, "PICK_MASK_IN_REGISTER", in_register)

    @cuda.jit
    def k(words, lo, hi):
        i = cuda.grid(1)
        if i < words.shape[0]:
            lo[i], hi[i] = levels.iq4_levels(words[i])
    rng = np.random.default_rng(5)
    words = np.concatenate([rng.integers(0, 1 << 32, 300, dtype=np.uint64).astype(np.uint32),
                            (np.arange(16, dtype=np.uint32) * 0x11111111)])
    lo = np.zeros_like(words)
    hi = np.zeros_like(words)
    k[(words.size + 63) // 64, 64](words, lo, hi)
    b = words.view(np.uint8).reshape(-1, 4)
    lv = KVALUES_IQ4NL.astype(np.int8)
    assert np.array_equal(lo.view(np.int8).reshape(-1, 4), lv[b & 0xF])
    assert np.array_equal(hi.view(np.int8).reshape(-1, 4), lv[b >> 4])
