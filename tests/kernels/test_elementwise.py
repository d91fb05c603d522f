"""swiglu, add and the embedding lookup against numpy (simulator)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import random_rows, reference
from strata.cuda_kernels.elementwise import add, embed, swiglu


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
