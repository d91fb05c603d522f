"""swiglu, add, the embedding lookup and the step tokens' scatter against numpy (simulator)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import random_rows, reference
from strata.cuda_kernels.elementwise import add, embed, last_tokens, scatter_tokens, swiglu


def test_swiglu_and_add():
    rng = np.random.default_rng(0)
    g, u, b = (rng.standard_normal((3, 37)).astype(np.float32) * 4 for _ in range(3))
    out = np.full_like(g, np.nan)
    swiglu(g, u, out)
    g64 = g.astype(np.float64)
    np.testing.assert_allclose(out, g64 / (1 + np.exp(-g64)) * u, rtol=1e-5, atol=1e-6)
    total = np.full_like(g, np.nan)
    add(g, b, total)
    np.testing.assert_allclose(total, g.astype(np.float64) + b, rtol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        add(g, b[:2], total)


@pytest.mark.parametrize("name", ["Q6_K", "Q8_0", "IQ3_XXS", "F16"])
def test_embed_reads_ids_from_device_memory(name):
    rng = np.random.default_rng(5)
    n_vocab, n_embd = 7, 256
    table = random_rows(name, n_vocab, n_embd, rng)
    ref = reference(name, table, n_embd)
    ids = np.array([4, 1, 6, 6, 0], dtype=np.int32)   # a token history
    first = np.array([2], dtype=np.int32)              # read ids[2], ids[3]
    out = np.full((2, n_embd), np.nan, dtype=np.float32)
    embed(table, name, ids, first, out)
    np.testing.assert_allclose(out, ref[[6, 6]], rtol=1e-6, atol=1e-7)


def test_embed_refuses_a_table_of_the_wrong_width():
    table = np.zeros((7, 100), dtype=np.uint8)
    with pytest.raises(ValueError, match="table: shape"):
        embed(table, "Q8_0", np.zeros(1, np.int32), np.zeros(1, np.int32),
              np.zeros((1, 64), np.float32))


def test_scatter_tokens_writes_each_row_at_its_position():
    rng = np.random.default_rng(2)
    n_rows, n_ctx = 5, 6
    history = rng.integers(0, 1000, (n_rows, n_ctx)).astype(np.int32)  # [rows, n_ctx] i32
    tokens = np.array([11, 22, 33, 44], np.int32)  # rows 0..3 step; row 4 is not in it
    seq_len = np.array([0, 5, 2, n_ctx], np.int32)  # row 3 is full: nothing may be written
    want = history.copy()
    for r, (t, p) in enumerate(zip(tokens, seq_len)):
        if p < n_ctx:
            want[r, p] = t
    scatter_tokens(tokens, seq_len, history[:4])
    np.testing.assert_array_equal(history, want)


def test_scatter_tokens_refuses_mismatched_rows():
    tokens, history = np.zeros(3, np.int32), np.zeros((3, 8), np.int32)
    with pytest.raises(ValueError, match="seq_len: shape"):
        scatter_tokens(tokens, np.zeros(2, np.int32), history)
    with pytest.raises(ValueError, match="history: shape"):
        scatter_tokens(tokens, np.zeros(3, np.int32), history[:2])
    with pytest.raises(ValueError, match="tokens: dtype int64"):
        scatter_tokens(np.zeros(3, np.int64), np.zeros(3, np.int32), history)


def test_last_tokens_gathers_each_rows_newest_token():
    """out[r] = history[r, n_tokens[r] - 1]; a count outside 1..n_ctx gives -1, never a read
    past the row; shapes that disagree are refused by name."""
    history = np.arange(4 * 6, dtype=np.int32).reshape(4, 6)  # [rows, n_ctx] i32
    counts = np.array([1, 6, 0, 7], np.int32)
    out = np.full(4, 99, np.int32)
    last_tokens(history, counts, out)
    assert out.tolist() == [0, 11, -1, -1]
    with pytest.raises(ValueError, match="n_tokens: shape"):
        last_tokens(history, counts[:3], out)
    with pytest.raises(ValueError, match="history: shape"):
        last_tokens(history[:3], counts, out)
