"""Layouts: one function per buffer family prices AND lays out; totals are sums of 256-byte
aligned regions; byte counts match formulas written out here by hand; the plan's regions are
taken from these functions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.moe_shapes import qwen3moe
from strata.plan import (
    PlanOptions, cache_layout, draft_layout, kv_layout, parse_gpu_mem, plan, prompt_layout,
    ring_layout, session_layout, weights_layout,
)
from strata.plan.layout import ALIGN, LayoutBuilder, kv_bytes_per_token, kv_mapped_layout

S30 = qwen3moe()  # Qwen3-30B-A3B dims, Q4_K_M mix


def _check_layout(layout):
    end = 0
    for r in layout.regions:
        assert r.offset == end and r.offset % ALIGN == 0, r
        assert r.n_bytes == math.prod(r.shape) * np.dtype(r.dtype).itemsize, r
        end = r.offset + -(-r.n_bytes // ALIGN) * ALIGN
    assert layout.total_bytes == end == sum(-(-r.n_bytes // ALIGN) * ALIGN
                                            for r in layout.regions)


@pytest.mark.parametrize("layout", [
    session_layout(S30, batch=3, max_context=40000),
    prompt_layout(S30, 1280, kv_type="int8", kv_stage_tokens=512),
    kv_layout(S30, kv_type="q4_0", resident_tokens=777),
    kv_layout(S30, kv_type="int8", resident_tokens=4096, max_context=40960),
    kv_mapped_layout(S30, kv_type="int8", resident_tokens=4096),
    ring_layout(S30, ring_bytes=100 << 20),
    weights_layout(S30, 0, 48, embd_on_host=False),
    draft_layout(S30, 4, kv_type="f16", resident_tokens=4096),
], ids=["session", "prompt", "kv", "kv_streamed", "kv_mapped", "ring", "weights", "draft"])
def test_total_is_sum_of_aligned_regions(layout):
    _check_layout(layout)


def test_builder_refuses_duplicate_and_negative():
    b = LayoutBuilder("x")
    b.add("a", np.float32, (3,))
    with pytest.raises(ValueError, match="added twice"):
        b.add("a", np.float32, (3,))
    with pytest.raises(ValueError, match="negative"):
        b.add("b", np.float32, (-1, 2))
    assert b.build().region("a").aligned_bytes == ALIGN


@pytest.mark.parametrize("kv_type,per_head", [("f16", 128 * 2), ("int8", 128 + 2),
                                              ("q4_0", 128 // 32 * 18)])
def test_kv_bytes_by_type(kv_type, per_head):
    t = 1000
    lay = kv_layout(S30, kv_type=kv_type, resident_tokens=t)
    exact = 2 * 48 * t * 4 * per_head  # K and V, 48 layers, 4 kv heads
    assert sum(r.n_bytes for r in lay.regions) == exact
    assert kv_bytes_per_token(S30, kv_type) == 2 * 48 * 4 * per_head
    half = kv_layout(S30, kv_type=kv_type, resident_tokens=t, lo=10, hi=34)
    assert sum(r.n_bytes for r in half.regions) == exact // 2


def test_kv_q4_0_needs_head_dim_multiple_of_32():
    odd = qwen3moe("f32", n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=48, n_expert=4,
                   n_expert_used=2, n_ff=32, n_vocab=64)
    with pytest.raises(ValueError, match="head_dim divisible by 32"):
        kv_layout(odd, kv_type="q4_0", resident_tokens=10)
    with pytest.raises(ValueError, match="not one of"):
        kv_layout(S30, kv_type="q8", resident_tokens=10)


def test_prompt_layout_buffers():
    c, k = 512, 8
    lay = prompt_layout(S30, c)
    tiles = -(-c * k // 64) + 128
    want = {"hidden": ("float32", (c, 2048)), "normed": ("float16", (c, 2048)),
            "q": ("float32", (c, 4096)), "attn_out": ("float32", (c, 4096)),
            "router_logits": ("float32", (c, 128)), "topk_ids": ("int32", (c, k)),
            "expert_counts": ("int32", (129,)), "expert_offsets": ("int32", (129,)),
            "expert_cursor": ("int32", (128,)), "perm_ids": ("int32", (c * k,)),
            "inv_ids": ("int32", (c * k,)), "tile_group": ("int32", (tiles,)),
            "tile_m0": ("int32", (tiles,)), "n_tiles": ("int32", (1,)),
            "gathered": ("float16", (c * k, 2048)), "expert_mid": ("float16", (c * k, 768)),
            "expert_out": ("float32", (c * k, 2048)), "logits": ("float32", (151936,))}
    for name, (dtype, shape) in want.items():
        r = lay.region(name)
        assert (r.dtype, r.shape) == (dtype, shape), name
    assert "kv_stage" not in lay
    staged = prompt_layout(S30, c, kv_type="int8", kv_stage_tokens=100)
    assert staged.region("kv_stage").shape == (2, 100, 4 * 128)  # K and V rows, no scales
    # the price grows with the chunk (what the bisection relies on)
    sizes = [prompt_layout(S30, x).total_bytes for x in range(256, 8193, 256)]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)


def test_session_layout_scales_with_batch_and_context():
    one = session_layout(S30, batch=1, max_context=32768)
    four = session_layout(S30, batch=4, max_context=32768)
    assert four.region("logits").shape == (4, 151936)
    assert four.region("q").shape == (4, 32 * 128)
    assert four.region("moe_h").shape == (4, 8, 768)
    assert one.region("attn_part_o").shape == (1, 128, 32, 128)  # 32768 / 256 splits
    assert one.region("attn_part_ml").shape == (1, 128, 32, 2)
    assert four.region("attn_part_o").shape == (4, 128, 32, 128)
    # splits follow the live length (strata.plan.attn_split): 64 aimed at for 4 KV heads, of
    # 16..256 keys (the generic kernel's floor: enough for the tensor-core kernel's 64 too), so
    # the partials hold the most any length up to the context uses
    for ctx, n_split in ((256, 16), (600, 38), (4096, 64), (16384, 64), (32769, 129),
                         (131072, 512)):
        lay = session_layout(S30, batch=1, max_context=ctx)
        assert lay.region("attn_part_o").shape == (1, n_split, 32, 128), ctx
        assert lay.region("attn_part_ml").shape == (1, n_split, 32, 2), ctx
    assert one.region("history").shape == (1, 32768)
    assert four.region("step_tokens").shape == (4,) and four.region("step_tokens").dtype == "int32"
    # the fused router's block counter: one per sequence, int32 (the kernel's atomic add)
    assert four.region("router_done").shape == (4,) and four.region("router_done").dtype == "int32"
    # the one-launch MoE's grid barrier (arrivals, generation): one pair per sequence, int32
    assert four.region("moe_sync").shape == (4, 2) and four.region("moe_sync").dtype == "int32"
    # the token choice: (best key, blocks done) u64 (64-bit atomics), and every sampler block's
    # 256 candidates: 38 blocks of 4,096 of the 30B's 151,936 logits
    assert four.region("pick_state").shape == (4, 3) and four.region("pick_state").dtype == "uint64"
    assert four.region("pick_cand_v").shape == (4, 38 * 256 + 38 * 2)  # lists, blocks' masses
    assert four.region("pick_cand_v").dtype == "float32"
    assert four.region("pick_cand_i").shape == (4, 38 * 256)
    assert four.region("pick_cand_i").dtype == "int32"
    # each sequence's sampler settings: temperature, top_p, min_p and the repeat, presence and
    # frequency penalties (f32); seed, top_k and the penalties' window (i64)
    assert four.region("sample_fparams").shape == (4, 6)
    assert four.region("sample_fparams").dtype == "float32"
    assert four.region("sample_iparams").shape == (4, 4)  # seed, top_k, window, n_bias
    assert four.region("sample_iparams").dtype == "int64"
    assert four.region("sample_bias_ids").shape == (4, 1024)
    assert four.region("sample_bias_ids").dtype == "int32"
    assert four.region("sample_bias_vals").shape == (4, 1024)
    assert four.region("sample_bias_vals").dtype == "float32"
    assert one.region("slot_table").shape == (48, 128) and one.region("slot_table").dtype == "int32"
    assert one.region("slot_off").shape == (48 * 128,) and one.region("slot_off").dtype == "int64"
    assert one.region("hit_counts").dtype == "int64"
    assert four.total_bytes > one.total_bytes


def test_layouts_match_the_kernels_contract():
    """The shapes the existing kernels take: split length, KV rows, routing tiles."""
    from cuda_kernels import attention, kvcache, matmul_tiles, route
    from strata.plan.layout import ROUTE_TILE_ROWS, SPLIT_K_TOKENS

    assert SPLIT_K_TOKENS == attention.SPLIT_LEN
    lay = session_layout(S30, batch=2, max_context=4096)
    assert lay.region("attn_part_o").shape[1] == attention.n_splits(4096, 64)
    assert ROUTE_TILE_ROWS == min(matmul_tiles.TC_TILE.bm, matmul_tiles.FMA_TILE.bm)
    assert prompt_layout(S30, 512).region("tile_m0").shape == (
        route.max_tiles(512 * 8, 128, ROUTE_TILE_ROWS),)
    for fmt in ("f16", "int8", "q4_0"):
        kl = kvcache.KvLayout(fmt, 1000, 4, 128)
        lay = kv_layout(S30, kv_type=fmt, resident_tokens=1000)
        assert lay.region("k").shape == (48, 1000, 4, kl.row_bytes)
        assert kv_bytes_per_token(S30, fmt) == 2 * 48 * kl.bytes_per_token


def test_ring_slots_from_largest_blob():
    blob = 3 * 884736 + 405504  # Q4_K gate/up + a Q6_K down: the largest expert
    assert S30.expert_slot_bytes_max == blob == 3059712
    lay = ring_layout(S30, ring_bytes=1 << 30)
    assert lay.region("slots").shape == ((1 << 30) // blob, blob)
    assert lay.total_bytes == (1 << 30) // blob * blob
    assert ring_layout(S30, ring_bytes=1).region("slots").shape[0] == 2  # at least two
    assert ring_layout(S30, ring_bytes=0).total_bytes == 0


def test_weights_layout_ranges_and_embedding():
    t = S30.tensors
    host = weights_layout(S30, 0, 48, embd_on_host=True)
    dev = weights_layout(S30, 0, 48, embd_on_host=False)
    assert "token_embd.weight" not in host and "output.weight" in host
    assert dev.region("token_embd.weight").n_bytes == t["token_embd.weight"].n_bytes
    assert all(host.region(n).n_bytes == t[n].n_bytes for n in host.names)
    first, last = weights_layout(S30, 0, 24, embd_on_host=False), \
        weights_layout(S30, 24, 48, embd_on_host=False)
    assert "output.weight" not in first and "token_embd.weight" not in last
    assert set(first.names) | set(last.names) == set(dev.names)
    tied = qwen3moe(tied=True)
    assert "token_embd.weight" in weights_layout(tied, 0, 48, embd_on_host=True)  # the head
    with pytest.raises(ValueError, match="layer range"):
        weights_layout(S30, 10, 60, embd_on_host=True)


def test_cache_layout_sized_slots_exact_offsets():
    sizes = [S30.expert_slot_bytes(i) for i in range(48)]
    # Q4_K_M: layers 5 and 8 store ffn_down as Q6_K, layer 6 as Q4_K
    assert (sizes[5], sizes[6], sizes[8]) == (3059712, 2654208, 3059712)
    spl = [0] * 48
    spl[5], spl[6], spl[8] = 3, 2, 1
    lay = cache_layout(S30, spl)
    order = [5, 6, 8, 5, 6, 5]  # default: slot 0 of every layer, then slot 1, ...
    assert list(lay.slot_layer) == order
    expect, off = [], 0
    for layer in order:
        expect.append(off)
        off += -(-sizes[layer] // ALIGN) * ALIGN
    assert list(lay.slot_offset) == expect and lay.total_bytes == off
    assert list(lay.slot_bytes) == [sizes[x] for x in order]
    assert lay.offset(5, 2) == expect[5] and lay.offset(6, 1) == expect[4]
    assert lay.suffix_bytes(2) == off - expect[4] == sizes[6] + sizes[5]
    assert lay.slots_to_cover(1) == 1 and lay.slots_to_cover(lay.suffix_bytes(2)) == 2
    assert lay.slots_to_cover(lay.suffix_bytes(2) + 1) == 3
    with pytest.raises(IndexError):
        lay.offset(8, 1)
    with pytest.raises(ValueError, match="slot counts"):
        cache_layout(S30, [200] + [0] * 47)
    with pytest.raises(ValueError, match="does not match"):
        cache_layout(S30, spl, order=[5, 5, 5, 6, 6, 6])


@pytest.mark.parametrize("kv_type", ["f16", "int8"])
def test_streamed_kv_regions(kv_type):
    """Streamed KV: the VRAM rows priced outside the arena (mapped beside their host rows), the
    arena keeping int8's scales for the whole context, the prompt path a copy of one layer's
    context, the resident tokens rounded down to the mapping granule."""
    opts = PlanOptions(max_context=32768, kv_type=kv_type, kv_resident=17000)
    p = plan(S30, parse_gpu_mem("24GiB"), opts)
    assert p.accepted
    d = p.device()
    unit = {"f16": 2048, "int8": 4096}[kv_type]  # 2 MiB over 4 KV heads' rows of a token
    assert p.kv.resident_tokens == 17000 // unit * unit and p.kv.stage_tokens == 32768
    mapped = kv_mapped_layout(S30, kv_type=kv_type, resident_tokens=p.kv.resident_tokens)
    assert d.kv_mapped_bytes == mapped.total_bytes == 2 * 48 * p.kv.resident_tokens * 4 * (
        256 if kv_type == "f16" else 128)
    arena_kv = kv_layout(S30, kv_type=kv_type, resident_tokens=p.kv.resident_tokens,
                         max_context=32768)
    assert ("k" in arena_kv) is False and ("k_scale" in arena_kv) is (kv_type == "int8")
    assert d.regions["kv"] == arena_kv.total_bytes + d.kv_mapped_bytes == p.kv.vram_bytes
    assert d.planned_bytes == d.arena_bytes + d.kv_mapped_bytes + d.context_bytes \
        + d.reserve_bytes
    assert p.kv.host_bytes == (32768 - p.kv.resident_tokens) * 48 * 2 * 4 * (
        256 if kv_type == "f16" else 128)
    assert p.prefill.prompt_bytes == prompt_layout(S30, p.prefill.chunk, kv_type=kv_type,
                                                   kv_stage_tokens=32768).total_bytes
    assert any(f"--kv-resident 17000: the KV of the first {p.kv.resident_tokens}" in n
               for n in p.notes)
    assert p.to_dict()["devices"][0]["kv_mapped_bytes"] == d.kv_mapped_bytes


def test_plan_regions_are_the_layout_functions():
    opts = PlanOptions(max_context=32768, spec=2, batch=2)
    p = plan(S30, parse_gpu_mem("24GiB"), opts)
    assert p.accepted
    d = p.device()
    r = d.regions
    stage = p.kv.stage_tokens
    assert stage == 0 and d.kv_mapped_bytes == 0
    # one resident context per sequence of the batch
    assert r["kv"] == kv_layout(S30, kv_type="f16", resident_tokens=2 * 32768).total_bytes
    assert r["weights"] == weights_layout(S30, 0, 48, embd_on_host=True).total_bytes
    assert r["activations"] == session_layout(S30, batch=2, max_context=32768).total_bytes
    assert r["draft"] == draft_layout(S30, 2, kv_type="f16", resident_tokens=32768).total_bytes
    assert r["expert_cache"] == d.cache.total_bytes
    pre = p.prefill
    assert pre.prompt_bytes == prompt_layout(S30, pre.chunk, kv_stage_tokens=stage).total_bytes
    assert pre.ring_bytes == ring_layout(
        S30, ring_bytes=pre.ring_slots * S30.expert_slot_bytes_max).total_bytes
    if pre.mode == "borrowed":
        assert pre.lend_bytes == d.cache.suffix_bytes(pre.lend_slots)
        assert pre.lend_bytes >= pre.prompt_bytes + pre.ring_bytes
    assert sum(r.values()) == d.planned_bytes <= d.device.free_bytes
