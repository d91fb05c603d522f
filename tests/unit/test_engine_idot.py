"""The K-quant dot products with 8-bit activations (`strata.engine.cpu.idot`) against float64
dot products of gguf-py's dequantized rows.

Bounds: a row's dot product must equal (dequantized row) . (quantized activations) to within f32
rounding (relative 2e-6 of sum |w_i xq_i|), and the exact (dequantized row) . x to within the
rounding of the activations, sum_i |w_i| * dx_i / 2 (plus the same f32 slack)."""

from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants
from numba import njit

from strata.engine.cpu import idot, simd, simd8
from strata.engine.cpu.simd import half_at
from strata.quant.random_blocks import random_blocks

BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
DOTS = {"Q4_K": idot.dot_q4_k_x8, "Q5_K": idot.dot_q5_k_x8, "Q6_K": idot.dot_q6_k_x8}


def _reference_x8(x: np.ndarray):
    """The rounding `quantize_x8` documents, in numpy: per 32, dx = absmax / 127 (f32),
    q = rint(x * (1 / dx))."""
    blocks = x.reshape(-1, 32)
    dx = (np.abs(blocks).max(axis=1) / np.float32(127.0)).astype(np.float32)
    inv = np.where(dx > 0, np.float32(1.0) / np.where(dx > 0, dx, 1), 0).astype(np.float32)
    q = np.rint(blocks * inv[:, None]).astype(np.int8)
    return q.reshape(x.shape), dx


def _rows(name, n_rows, n_values, seed):
    raw = random_blocks(name, n_rows * n_values // 256, np.random.default_rng(seed), scale=0.5)
    return np.ascontiguousarray(raw.reshape(n_rows, -1))


def test_quantize_x8_rounds_each_32_to_its_absmax_over_127():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 200)) * [[1.0], [1e-3], [40.0]]).astype(np.float32)
    x[1, 32:64] = 0.0  # an all-zero block: scale 0, codes 0
    qx, dx, qs16, xq = idot.x8_arrays(x)
    assert qx.shape == (3, 200) and dx.shape == (3, 6) and qs16.shape == (3, 12)
    np.testing.assert_array_equal(xq[:, :192], (qx[:, :192].reshape(3, 6, 32) * dx[:, :, None])
                                  .reshape(3, 192))
    assert not xq[:, 192:].any()
    want_q, want_d = _reference_x8(x[:, :192])
    np.testing.assert_array_equal(qx[:, :192], want_q)
    np.testing.assert_array_equal(dx, want_d.reshape(3, 6))
    assert not qx[:, 192:].any()  # the tail shorter than 32
    assert dx[1, 1] == 0 and not qx[1, 32:64].any()
    back = qx[:, :192].reshape(3, 6, 32) * dx[:, :, None]
    assert np.all(np.abs(back - x[:, :192].reshape(3, 6, 32)) <= dx[:, :, None] * 0.5001)
    sums = qx[:, :192].astype(np.int64).reshape(3, 12, 16).sum(axis=2)
    np.testing.assert_allclose(qs16, sums * np.repeat(dx, 2, axis=1), rtol=1e-6)


@pytest.mark.parametrize("name", sorted(DOTS))
@pytest.mark.parametrize("n_values", [256, 1280])  # one super-block; five (the lanes wrap)
def test_dot_x8_is_the_dequantized_row_times_the_8_bit_activations(name, n_values):
    n_rows = 9
    raw = _rows(name, n_rows, n_values, seed=n_values + len(name))
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(n_values) * rng.uniform(0.1, 3.0, n_values)).astype(np.float32)
    qx, dx, qs16, _ = idot.x8_arrays(x.reshape(1, -1))
    acc = np.empty(idot.ACC_LANES, np.float32)
    got = np.array([DOTS[name](raw, r, qx[0], dx[0], qs16[0], acc) for r in range(n_rows)])
    w = np.asarray(gguf_quants.dequantize(raw, T[name]), np.float64).reshape(n_rows, n_values)
    xq = qx[0].astype(np.float64) * np.repeat(dx[0], 32)
    slack = 2e-6 * (np.abs(w) @ np.abs(xq))
    assert np.all(np.abs(got - w @ xq) <= slack), f"{name}: not the 8-bit activations' dot"
    rounding = np.abs(w) @ np.repeat(dx[0].astype(np.float64) / 2, 32)
    err = np.abs(got - w @ x.astype(np.float64))
    assert np.all(err <= rounding + slack), f"{name}: more than the activations' rounding"


def _generic_dot(name):
    fn = {"Q4_K": simd8.q4_k_idot_generic, "Q5_K": simd8.q5_k_idot_generic,
          "Q6_K": simd8.q6_k_idot_generic}[name]
    nb = BLOCK_BYTES[name]
    if name == "Q6_K":
        @njit
        def dot(w, r, qx, dx, qs16, acc):
            acc[:] = 0.0
            for b in range(w.shape[1] // nb):
                o = r * w.shape[1] + nb * b
                fn(acc, 0, w, o, b, half_at(w, o + 208), qx, dx, qs16)
            return acc.sum()
    else:
        @njit
        def dot(w, r, qx, dx, qs16, acc):
            acc[:] = 0.0
            for b in range(w.shape[1] // nb):
                o = r * w.shape[1] + nb * b
                fn(acc, 0, w, o, b, half_at(w, o), half_at(w, o + 2), qx, dx, qs16)
            return acc.sum()
    return dot


@pytest.mark.parametrize("name", sorted(DOTS))
def test_the_portable_byte_dot_equals_the_fast_one(name):
    """The non-VNNI path (widening multiply-adds) computes the same integer sums."""
    raw = _rows(name, 5, 1024, seed=7)
    x = np.random.default_rng(8).standard_normal((1, 1024)).astype(np.float32)
    qx, dx, qs16, _ = idot.x8_arrays(x)
    acc = np.empty(idot.ACC_LANES, np.float32)
    generic = _generic_dot(name)
    w = np.abs(np.asarray(gguf_quants.dequantize(raw, T[name]), np.float64).reshape(5, 1024))
    slack = 4e-6 * (w @ np.abs(qx[0] * np.repeat(dx[0], 32)))  # f32 sums in another order
    for r in range(5):
        fast = DOTS[name](raw, r, qx[0], dx[0], qs16[0], acc)
        port = generic(raw, r, qx[0], dx[0], qs16[0], acc)
        assert abs(fast - port) <= slack[r]


def test_zero_activations_give_exactly_zero():
    raw = _rows("Q4_K", 1, 512, seed=2)
    qx, dx, qs16, _ = idot.x8_arrays(np.zeros((1, 512), np.float32))
    acc = np.empty(idot.ACC_LANES, np.float32)
    assert idot.dot_q4_k_x8(raw, 0, qx[0], dx[0], qs16[0], acc) == 0.0


def test_the_fast_path_is_an_integer_byte_dot_on_x86():
    """What the machine code of the Q4_K row dot multiplies with: VNNI byte dot products where
    the CPU has them, else 16-bit multiply-adds (never per-value float conversions); and that it
    prefetches the row ahead."""
    fresh = njit(fastmath=idot.FAST)(idot.dot_q4_k_x8.py_func)  # cached code hides its asm
    raw = _rows("Q4_K", 1, 256, seed=3)
    qx, dx, qs16, _ = idot.x8_arrays(np.ones((1, 256), np.float32))
    fresh(raw, 0, qx[0], dx[0], qs16[0], np.empty(idot.ACC_LANES, np.float32))
    asm = fresh.inspect_asm(fresh.signatures[0])
    if llvm.get_process_triple().startswith("x86_64"):
        assert ("vpdpbusd" in asm) if simd8.VNNI else ("pmaddwd" in asm or "vpdpwssd" in asm)
        assert "prefetcht0" in asm  # the row's bytes requested ahead of the computation
    else:
        assert not simd8.VNNI  # an x86 feature


def test_both_half_readers_take_flat_byte_offsets_into_a_matrix():
    """The dots read fp16 scales at flat byte offsets of the whole matrix, on CPUs with and
    without a hardware half converter."""
    halves = np.array([[1.5, -2.25e-3, 65504.0], [-0.0, 6.1e-5, 3.0]], np.float16)
    w = np.zeros((2, 8), np.uint8)  # [2, 8] u8: three halves at odd offsets 1, 3, 5
    w[:, 1:7] = halves.view(np.uint8)
    readers = [njit(lambda w, o: simd._half_bits_at(w, o))]
    if simd.NATIVE_HALF:  # the converter exists only where LLVM has one
        readers.append(njit(lambda w, o: simd._half_native_at(w, o)))
    for read in readers:
        got = [[read(w, 8 * r + 1 + 2 * k) for k in range(3)] for r in range(2)]
        np.testing.assert_array_equal(np.array(got, np.float32), halves.astype(np.float32))
