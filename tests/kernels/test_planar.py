"""The planar Q6_K layout (`strata.quant.planar`): the host's pack and unpack, which tensors and
sizes the plan gives it, and every kernel that reads planar rows against the same rows in GGUF's
layout (bit for bit: the same decoders on the same bytes) and gguf-py's dequantization."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import cuda

from helpers.kernel_blocks import random_rows, reference, stored, x_seen
from helpers.moe_problem import rel_err
from helpers.moe_shapes import qwen3moe
from strata.cuda_kernels import batch_tc as tc
from strata.cuda_kernels import lanes_batch as lb
from strata.cuda_kernels import matmul
from strata.cuda_kernels import matvec as mv
from strata.cuda_kernels import matvec_mixed as mm
from strata.cuda_kernels.matmul_tiles import FmaTile, TcTile
from strata.cuda_kernels.matvec_normed import matvec_normed
from strata.plan.layout import weights_layout
from strata.quant import planar
from strata.quant.planar import Q6_K_P8, planar_tensor, vram_type

P8 = Q6_K_P8.name


def _rel(got, want):
    return np.linalg.norm(got - want) / np.linalg.norm(want)


@pytest.mark.parametrize("n_blocks", [1, 7, 8, 9, 24])
def test_pack_places_every_field_and_unpack_inverts_it(n_blocks):
    rng = np.random.default_rng(n_blocks)
    raw = rng.integers(0, 256, n_blocks * 210, dtype=np.uint8)
    packed = Q6_K_P8.pack(raw)
    assert packed.size == -(-n_blocks // 8) * 1680 == Q6_K_P8.vram_bytes(raw.size)
    blocks = raw.reshape(n_blocks, 210)
    for b in range(n_blocks):
        g, k = divmod(b, 8)
        at = 1680 * g
        for start, n, field in ((0, 128, 0), (128, 64, 1024), (192, 16, 1536), (208, 2, 1664)):
            o = at + field + n * k
            assert np.array_equal(packed[o:o + n], blocks[b, start:start + n]), (b, start)
    assert np.array_equal(Q6_K_P8.unpack(packed, raw.size), raw)
    used = np.zeros(packed.size, bool)  # the last group's unused places are zero
    for b in range(n_blocks):
        g, k = divmod(b, 8)
        for n, field in ((128, 0), (64, 1024), (16, 1536), (2, 1664)):
            used[1680 * g + field + n * k:1680 * g + field + n * (k + 1)] = True
    assert used.sum() == raw.size and not packed[~used].any()


def test_pack_and_unpack_refuse_partial_blocks():
    with pytest.raises(ValueError, match="whole number of 210-byte blocks"):
        Q6_K_P8.pack(np.zeros(211, np.uint8))
    with pytest.raises(ValueError, match="hold fewer than the 9 blocks"):
        Q6_K_P8.unpack(np.zeros(1680, np.uint8), 9 * 210)


def test_which_tensors_are_planar_and_their_vram_bytes():
    q6, q4 = int(T.Q6_K), int(T.Q4_K)
    for name in ("blk.0.attn_q.weight", "blk.11.attn_k.weight", "blk.3.attn_v.weight",
                 "blk.47.attn_output.weight", "output.weight"):
        assert planar_tensor(name, q6) is Q6_K_P8 and vram_type(name, q6) == Q6_K_P8.ggml_type
        assert planar_tensor(name, q4) is None and vram_type(name, q4) == q4
    # looked up from host memory, read by the router kernels, or expert blobs: GGUF's layout
    for name in ("token_embd.weight", "blk.0.ffn_gate_inp.weight", "blk.0.ffn_down_exps.weight",
                 "blk.0.attn_v.bias"):
        assert planar_tensor(name, q6) is None
    # the plan sizes planar tensors by whole groups: attn_v of 4 rows x 1 super-block pads to 8
    shape = qwen3moe("q4_k_m", n_layer=8, n_embd=256, n_head=64, n_head_kv=1, head_dim=4,
                     n_ff=256, n_expert=4, n_expert_used=2, n_vocab=64)
    v = shape.tensors["blk.0.attn_v.weight"]  # Q6_K in layer 0 (the Q4_K_M recipe)
    assert v.ggml_type == q6 and v.n_bytes == 4 * 210 and v.vram_bytes == 1680
    lay = weights_layout(shape, 0, 8, embd_on_host=False)
    assert lay.region("blk.0.attn_v.weight").n_bytes == 1680
    assert lay.region("token_embd.weight").n_bytes == shape.tensors["token_embd.weight"].n_bytes
    assert shape.layers[0].dense_bytes == sum(t.vram_bytes for t in shape.layers[0].dense)


# (n_rows, n_cols, grid cap): 15 super-blocks (the last group padded), rounds at one block,
# and two warps over three steps a pair at two
CASES = [(5, 768, None), (41, 1024, 1), (9, 3072, 2)]


@pytest.mark.parametrize("n_rows,n_cols,cap", CASES)
@pytest.mark.parametrize("x8", [False, True])
def test_lane_matvec_reads_planar_rows_as_gguf_rows(n_rows, n_cols, cap, x8, monkeypatch):
    rng = np.random.default_rng(n_rows * n_cols)
    rows = random_rows("Q6_K", n_rows, n_cols, rng)
    x = rng.standard_normal(n_cols).astype(np.float32)
    if cap is not None:
        monkeypatch.setattr(mv, "LANE_GRID_BLOCKS", cap)
    ys = {}
    for name, w in (("Q6_K", rows), (P8, stored(P8, rows))):
        ys[name] = np.full(n_rows, np.nan, np.float32)
        mv.matvec(w, name, x, ys[name], x8=x8)
    assert any(k[0] == Q6_K_P8.ggml_type and k[2] == x8 for k in mv._CACHE)
    assert np.array_equal(ys[P8], ys["Q6_K"])
    assert _rel(ys[P8], reference("Q6_K", rows, n_cols) @ x_seen(x, x8)) < 1e-5


def test_mixed_normed_qkv_with_a_planar_v():
    """q, k Q4_K and v planar Q6_K through `matvec_normed`: one mixed kernel, the same y as with
    v in GGUF's layout."""
    rng = np.random.default_rng(31)
    x = rng.standard_normal(768).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, 768).astype(np.float32)
    ws = [random_rows(f, n, 768, rng) for f, n in (("Q4_K", 4), ("Q4_K", 2), ("Q6_K", 3))]
    got = {}
    for v_name in ("Q6_K", P8):
        mm._CACHE.clear()
        ys = [np.full(w.shape[0], np.nan, np.float32) for w in ws]
        mats = [(ws[0], "Q4_K", ys[0]), (ws[1], "Q4_K", ys[1]), (stored(v_name, ws[2]), v_name,
                                                                 ys[2])]
        matvec_normed(x, nw, 1e-6, mats)
        assert len(mm._CACHE) == 1  # the mixed kernel
        got[v_name] = ys
    for a, b in zip(got["Q6_K"], got[P8]):
        np.testing.assert_array_equal(a, b)


def test_small_batch_kernels_read_planar_rows():
    rng = np.random.default_rng(7)
    rows = random_rows("Q6_K", 19, 512, rng)  # 38 super-blocks: the last group padded
    x = rng.standard_normal((3, 512)).astype(np.float32)
    want = x.astype(np.float64) @ reference("Q6_K", rows, 512).T
    for run in (lb.matvec_batch, tc.matvec_tc):
        ys = {}
        for name, w in (("Q6_K", rows.reshape(-1)), (P8, stored(P8, rows))):
            ys[name] = np.full((3, 19), np.nan, np.float32)
            run(w, name, x, ys[name])
        assert np.array_equal(ys[P8], ys["Q6_K"]), run.__name__
        assert _rel(ys[P8], want) < 1e-5
    assert (Q6_K_P8.ggml_type, lb.tokens_per_block(lb.lane_format(Q6_K_P8.ggml_type), 512, 3)) \
        in lb._CACHE


@pytest.mark.parametrize("tensor_cores,tile", [
    (True, TcTile(bm=32, bn=64, warps_m=2, warps_n=1)),
    (False, FmaTile(bm=16, bn=32, threads_m=4, threads_n=8))])
def test_dense_matmul_reads_planar_rows(tensor_cores, tile):
    rng = np.random.default_rng(5)
    n, n_in, n_out = 37, 768, 40  # 120 super-blocks; rows of 3 start mid-group
    rows = random_rows("Q6_K", n_out, n_in, rng)
    x = (rng.standard_normal((n, n_in)) * 0.1).astype(np.float32)
    zero = cuda.to_device(np.zeros(1, np.int64))
    outs = {}
    for name, t, w in (("Q6_K", int(T.Q6_K), rows.reshape(-1)),
                       (P8, Q6_K_P8.ggml_type, stored(P8, rows))):
        qw = matmul.QuantWeights(cuda.to_device(w), zero, t, n_out, n_in)
        out = cuda.to_device(np.full((n, n_out), np.nan, np.float32))
        matmul.dense_matmul(cuda.to_device(x), qw, out, tensor_cores=tensor_cores, tile=tile)
        outs[name] = out.copy_to_host()
    assert np.array_equal(outs[P8], outs["Q6_K"])
    r16 = (lambda a: a.astype(np.float16).astype(np.float64)) if tensor_cores else np.asarray
    ref = r16(x.astype(np.float64)) @ r16(reference("Q6_K", rows, n_in)).T
    assert rel_err(outs[P8], ref) < (1e-3 if tensor_cores else 1e-5)


def test_planar_buffers_must_hold_whole_groups():
    rng = np.random.default_rng(3)
    rows = random_rows("Q6_K", 5, 768, rng)  # 15 super-blocks: 2 groups, 3360 bytes
    x = rng.standard_normal(768).astype(np.float32)
    with pytest.raises(ValueError, match="needs 3360"):
        mv.matvec(rows.reshape(-1), P8, x, np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="needs 3360"):
        matmul.QuantWeights(cuda.to_device(rows.reshape(-1)),
                            cuda.to_device(np.zeros(1, np.int64)), Q6_K_P8.ggml_type, 5, 768)
    with pytest.raises(ValueError, match="one matrix at base 0"):
        matmul.QuantWeights(cuda.to_device(stored(P8, rows)),
                            cuda.to_device(np.zeros(2, np.int64)), Q6_K_P8.ggml_type, 5, 768)
    assert planar.stored_bytes(P8, 15 * 210) == 3360 and planar.stored_bytes("Q6_K", 630) == 630
