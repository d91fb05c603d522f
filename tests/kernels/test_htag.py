"""h's tag (`htag`): what the MoE's gate/up kernels write into h's two lowest bits, and the
stagings of h that clear them, against the plain padded staging of the cleared values. The
polling itself (another block's writes arriving) runs on the GPU: the fused MoE's GPU tests."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, types

from strata.cuda_kernels.htag import h_bits, h_plain, launch_tag, stage_h, stage_h6, stage_h_polled
from strata.cuda_kernels.xstage import padded_len, stage_padded

PAD = (5, 4, 8, 4)  # Q6_K's padding (`lanes`): 16-value sums too
N = 1616            # 404 quads: two passes of 64 threads six quads at a time, the last partial


@cuda.jit
def _bits_kernel(v, tag, bits, plain, tags):
    i = cuda.grid(1)
    if i < v.size:
        bits[i] = h_bits(v[i], tag[i])
        plain[i] = h_plain(v[i])
    if i < tags.size:
        tags[i] = launch_tag(i)


def test_tag_bits_keep_the_value_bits():
    rng = np.random.default_rng(1)
    v = np.concatenate([rng.standard_normal(60), [0.0, -0.0, np.inf, 1e-40]]).astype(np.float32)
    tag = rng.integers(0, 4, v.size).astype(np.int32)
    bits, plain = np.zeros(v.size, np.uint32), np.zeros(v.size, np.float32)
    tags = np.zeros(6, np.int32)
    _bits_kernel[1, 64](v, tag, bits, plain, tags)
    keep = v.view(np.uint32) & ~np.uint32(3)
    np.testing.assert_array_equal(bits, keep | tag.astype(np.uint32))
    np.testing.assert_array_equal(plain.view(np.uint32), keep)
    assert tags.tolist() == [1, 2, 1, 2, 1, 2]  # launches alternate, never tag 0
    assert np.abs(plain[:60] - v[:60]).max() <= np.abs(v[:60]).max() * 2.0 ** -21


def _stager(kind):
    @cuda.jit
    def k(h, n_vals, sums_off, tag, check, out):
        xs = cuda.shared.array(0, types.float32)
        a, pa, b, pb = PAD
        if kind == 0:
            stage_h_polled(h, n_vals, xs, a, pa, b, pb, True, sums_off, tag, check)
        elif kind == 1:
            stage_h(h, n_vals, xs, a, pa, b, pb, True, sums_off)
        elif kind == 2:
            stage_h6(h, n_vals, xs, a, pa, b, pb, True, sums_off)
        else:
            stage_padded(h, 0, n_vals, xs, a, pa, b, pb, True, sums_off)
        cuda.syncthreads()
        for i in range(cuda.threadIdx.x, out.size, cuda.blockDim.x):
            out[i] = xs[i]
    return k


def _staged(kind, h, tag=0, check=False):
    off = padded_len(N, PAD)
    out = np.full(off + N // 16, np.nan, np.float32)
    _stager(kind)[1, 64, 0, 4 * out.size](h, N, off, tag, check, out)
    return out


@pytest.mark.parametrize("kind,check", [(0, True), (0, False), (1, False), (2, False)])
def test_stagings_clear_the_tags(kind, check):
    """Each staging of tagged h places the cleared values and their 16-value sums bit for bit as
    the plain staging of the cleared values does; polled with every entry at the launch's tag
    (it never waits), or unchecked over mixed tags."""
    rng = np.random.default_rng(kind + 2 * check)
    v = rng.standard_normal(N).astype(np.float32)
    cleared = (v.view(np.uint32) & ~np.uint32(3)).view(np.float32)
    tags = np.full(N, 2, np.uint32) if check else rng.integers(0, 4, N).astype(np.uint32)
    h = ((v.view(np.uint32) & ~np.uint32(3)) | tags).view(np.float32)
    want = _staged(3, cleared)
    got = _staged(kind, h, 2, check)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))

