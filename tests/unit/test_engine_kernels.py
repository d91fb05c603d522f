"""CPU kernels against independent numpy references: quantized matmuls for every supported format
(gguf-py's dequantize as the reference), attention, the router, expert grouping."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

from strata.engine.cpu import attention as attn
from strata.engine.cpu import matmul, moe
from strata.engine.cpu.experts import group_pairs
from strata.engine.cpu.idot import x8_arrays
from strata.quant.blocks import block_decoder
from strata.quant.random_blocks import random_blocks
from strata.quant.types import SUPPORTED_NAMES, quant_type

X8 = {"Q4_K", "Q5_K", "Q6_K"}


def _rows(name: str, n_rows: int, n_values: int, seed: int) -> np.ndarray:
    """Random valid rows: uint8[n_rows, row_bytes], read-only like the mapped file."""
    q = quant_type(name)
    n_blocks = n_rows * n_values // q.block_size
    raw = random_blocks(name, n_blocks, np.random.default_rng(seed), scale=0.5)
    raw = np.ascontiguousarray(raw.reshape(n_rows, -1))
    raw.flags.writeable = False
    return raw


def _width(name: str) -> int:
    """A row width that is not a power of two: 3 blocks of 256, 7 of 32, or 200 floats (which
    also leaves a tail shorter than the kernels' vector of lanes)."""
    q = quant_type(name)
    if q.block_size == 1:
        return 200
    return 768 if q.block_size == 256 else 224


def _linear(raw, name, x):
    q = quant_type(name)
    out = np.full((x.shape[0], raw.shape[0]), np.nan, np.float32)  # poisoned
    matmul.linear(raw, q.ggml_type, block_decoder(q.ggml_type).block_size, x, x8_arrays(x), out,
                  matmul.n_chunks_for(raw.shape[0]))
    return out


@pytest.mark.parametrize("name", SUPPORTED_NAMES)
@pytest.mark.parametrize("n_tok", [1, 6])
def test_linear_matches_gguf_dequantize(name, n_tok):
    n_in, n_rows = _width(name), 37
    raw = _rows(name, n_rows, n_in, seed=len(name) + n_tok)
    x = np.random.default_rng(3).standard_normal((n_tok, n_in)).astype(np.float32)
    w = np.asarray(gguf_quants.dequantize(raw, T[name]), dtype=np.float64).reshape(n_rows, n_in)
    x_used = x
    if name in X8:  # K-quant rows multiply the 8-bit activations
        qx, dx, _, _ = x8_arrays(x)  # (pinned to its numpy rounding in test_engine_idot.py)
        x_used = qx * np.repeat(dx, 32, axis=1)
    want = x_used.astype(np.float64) @ w.T
    got = _linear(raw, name, x)
    assert got.shape == want.shape
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 2e-6, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "IQ3_S", "F16"])
def test_gather_rows_is_the_dequantized_embedding(name):
    n_in = _width(name)
    raw = _rows(name, 11, n_in, seed=4)
    ids = np.array([3, 0, 10, 3], np.int64)
    out = np.empty((ids.size, n_in), np.float32)
    q = quant_type(name)
    matmul.gather_rows(raw, q.ggml_type, block_decoder(q.ggml_type).block_size, ids, out)
    w = np.asarray(gguf_quants.dequantize(raw, T[name]), dtype=np.float32).reshape(11, n_in)
    np.testing.assert_array_equal(out, w[ids])


def _attention_ref(q, k, v, start):
    n_tok, n_head, hd = q.shape
    rep = n_head // k.shape[1]
    out = np.zeros(q.shape)
    for t in range(n_tok):
        for h in range(n_head):
            kk = k[:start + t + 1, h // rep].astype(np.float64)
            s = kk @ q[t, h] / np.sqrt(hd)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ v[:start + t + 1, h // rep]
    return out


@pytest.mark.parametrize("start", [0, 5])
def test_attention_is_causal_gqa_softmax(start):
    rng = np.random.default_rng(5)
    n_tok, n_head, n_kv, hd, n_ctx = 4, 6, 2, 24, 16
    q = rng.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    kc = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float32)
    vc = rng.standard_normal((n_ctx, n_kv, hd)).astype(np.float32)
    out = np.full_like(q, np.nan)
    attn.attention(q, kc, vc, start, out)
    np.testing.assert_allclose(out, _attention_ref(q, kc, vc, start), rtol=1e-5, atol=1e-5)


def test_head_norm_rope_matches_the_rotate_half_form():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 8).astype(np.float32)
    pos = np.array([0, 7, 1000])
    cos, sin = attn.rope_tables(pos, 8, 1e6)
    got = x.copy()
    attn.head_norm_rope(got, w, 1e-6, cos, sin)
    xn = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    ang = np.outer(pos, 1e6 ** (-np.arange(0, 8, 2) / 8))
    c = np.concatenate([np.cos(ang)] * 2, -1)[:, None]
    s = np.concatenate([np.sin(ang)] * 2, -1)[:, None]
    want = xn * c + np.concatenate([-xn[..., 4:], xn[..., :4]], -1) * s
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_router_takes_the_top_k_softmax_renormalised():
    logits = np.array([[0.1, 2.0, -1.0, 1.5, 2.0], [3.0, 0.0, 0.0, 0.0, -3.0]], np.float32)
    ids = np.empty((2, 3), np.int64)
    w = np.empty((2, 3), np.float32)
    moe.softmax_topk(logits, 3, ids, w)
    assert ids.tolist() == [[1, 4, 3], [0, 1, 2]]  # a tie goes to the lower index
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = np.take_along_axis(p, ids, 1)
    np.testing.assert_allclose(w, want / want.sum(1, keepdims=True), rtol=1e-6)


def test_group_pairs_groups_by_expert():
    ids = np.array([[2, 0], [2, 1], [0, 2]])
    weights = np.array([[0.6, 0.4], [0.7, 0.3], [0.9, 0.1]], np.float32)
    groups, pair_tok, pair_w = group_pairs(ids, weights)
    assert groups[0, :-1].tolist() == [0, 1, 2]
    assert groups[1].tolist() == [0, 2, 3, 6]
    assert pair_tok.tolist() == [0, 2, 1, 0, 1, 2]
    np.testing.assert_allclose(pair_w, [0.4, 0.9, 0.3, 0.6, 0.7, 0.1])
