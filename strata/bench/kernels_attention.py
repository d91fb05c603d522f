"""The attention cases of the prefill-side kernel benchmarks (`strata.bench.kernels_prefill`
runs them, `-k decode_attn` or `-k prefill_attn`): decode attention over a KV cache (GB/s of K
and V read, timed as graph replays) and causal prefill attention of a chunk (TFLOP/s)."""

from __future__ import annotations

import functools
import math

import numpy as np

from .timing import cuda_module, resources, time_graph_ms, time_ms


def _kv_sides(fmt, n_ctx, n_kv, hd, length, rng):
    from strata.cuda_kernels import kvcache
    cuda = cuda_module()
    lay = kvcache.KvLayout(fmt, n_ctx, n_kv, hd)
    sides = []
    for _ in range(2):
        side = kvcache.allocate_kv_side(lay)
        seq = cuda.to_device(np.zeros(1, np.int32))
        src = cuda.to_device(rng.standard_normal((length, n_kv, hd)).astype(np.float32))
        kvcache.kv_write(src, side, seq)
        sides.append(side)
    return lay, sides


def bench_decode_attention(*, fmt="f16", n_ctx=32768, length=None, n_head=32, n_kv=4, hd=128,
                           max_split=None, n_target=None, variant="auto", n_layer=2,
                           min_split=None, quick=False, tag="", min_blocks=None,
                           combine=True) -> dict:
    """Decode attention over `n_layer` layers' caches in turn (so the working set is past the
    L2), GB/s of K+V read per layer at `length` live keys (default: the whole cache of n_ctx
    positions; the grid is the cache's, as a captured decode graph's). variant: "auto" (what
    the launcher picks), "generic" (the FMA kernel), "tc_nolb" (the tensor-core f16 kernel
    without launch bounds). n_target: splits aimed at (default: the launcher's, from n_kv; 1
    gives the fixed split of max_split keys the kernels used before the split followed the
    length); min_split: the shortest split (default: the launcher's); min_blocks: the
    tensor-core kernel's launch bounds (default its own); combine=False: pass 1 alone (the
    tensor-core kernel launched directly), to see what the combine launch costs."""
    from strata.cuda_kernels import attention, attention_stream
    from strata.plan import attn_split
    cuda = cuda_module()
    rng = np.random.default_rng(2)
    length = n_ctx if length is None else length
    layers = [_kv_sides(fmt, n_ctx, n_kv, hd, length, rng) for _ in range(n_layer)]
    lay = layers[0][0]
    q = cuda.to_device(rng.standard_normal((n_head, hd)).astype(np.float32))
    out = cuda.device_array((n_head, hd), np.float32)
    group = n_head // n_kv
    max_split = max_split or attention.longest_split(  # the launcher's default
        fmt, fmt, hd, group, wide=False if variant == "generic" else None)
    n_target = n_target or attn_split.split_target(n_kv)
    min_split = min_split or attention.min_split_for(  # tc_nolb: the tensor-core kernel's
        fmt, fmt, hd, group, max_split, wide=False if variant == "generic" else None)
    parts = attention.allocate_partials(n_head, hd, n_ctx, n_kv_head=n_kv, max_split=max_split,
                                        n_target=n_target, min_split=min_split)
    seq = cuda.to_device(np.array([length - 1], np.int32))
    if not combine and min_blocks is None and variant != "tc_nolb":
        min_blocks = attention_stream.MIN_BLOCKS[fmt]
    direct = variant == "tc_nolb" or min_blocks is not None
    if direct:
        kern = attention_stream.stream_kernel(fmt, hd, group, max_split, min_split,
                                              0 if variant == "tc_nolb" else min_blocks)
    else:
        kern = attention.decode_kernel(fmt, fmt, hd, group, max_split,
                                       wide=False if variant == "generic" else None,
                                       min_split=min_split)
    scale = np.float32(1.0 / math.sqrt(hd))
    n_split = attention.n_splits(n_ctx, n_target, max_split, min_split)

    def step(s):  # the launcher's launches, with the chosen pass-1 kernel
        for _, (k, v) in layers:
            if direct:
                kern[(n_kv * attention_stream.n_sub(group), n_split), attention.THREADS, s](
                    q, k.data, k.scale, v.data, v.scale, seq, 1, n_ctx, n_target, scale, *parts)
                if not combine:
                    continue
                attention._combine[(n_head, hd // 32), attention.COMBINE_THREADS, s](
                    *parts, seq, 1, n_ctx, n_target, max_split, min_split, out)
            else:
                attention.decode_attention(q, k, v, seq, out, parts, n_new=1,
                                           max_split=max_split, n_target=n_target, stream=s,
                                           wide=False if variant == "generic" else None,
                                           min_split=min_split)
    ms, how = time_graph_ms(step, reps=10 if quick else 50)
    ms /= n_layer
    n_bytes = 2 * length * lay.bytes_per_token
    read_ms = same_bytes_read_ms(n_bytes, n_layer, rng, reps=10 if quick else 50)
    return {"name": f"decode_attn_{fmt}_{variant}_s{max_split}{tag}", "n_ctx": n_ctx,
            "length": length, "n_target": n_target, "min_split": min_split,
            "split_len": attn_split.split_len(length, n_target, max_split, min_split),
            "n_used": attn_split.n_used(length, n_target, max_split, min_split), "ms": ms,
            "timing": how, "kernel": resources(kern),
            "kv_bytes": n_bytes, "gbps": n_bytes / (ms * 1e6), "read_ms": read_ms,
            "of_read": read_ms / ms}


def same_bytes_read_ms(n_bytes: int, n_layer: int, rng, *, reps: int) -> float:
    """ms a layer of a read of the same bytes (`kernels.same_size_reads`: one launch a layer
    over n_layer buffers of n_bytes random bytes in turn), beside the streaming read of the
    bench's ceilings."""
    from .kernels import same_size_reads
    cuda = cuda_module()
    n_alloc = 16 * -(-n_bytes // 16)
    bufs = [cuda.to_device(rng.integers(0, 256, n_alloc, dtype=np.uint8)) for _ in range(n_layer)]
    ms, _ = time_graph_ms(same_size_reads(cuda, bufs), reps=reps)
    return ms / n_layer


def bench_prefill_attention(*, fmt="f16", n_q=4096, start=0, n_head=32, n_kv=4, hd=128,
                            variant="base", warps=None, bkv=None, min_blocks=None, quick=False,
                            tag="") -> dict:
    """Causal prefill attention of an n_q-token chunk over `start` cached tokens, TFLOP/s of the
    unmasked work. variant "base" (a block per head) or "gqa" (K/V tiles shared by a KV head's
    query heads: warps, bkv, min_blocks its launch knobs; None: the module's defaults)."""
    from strata.cuda_kernels import attention_prefill
    from strata.cuda_kernels import attention_prefill_gqa as gqa
    cuda = cuda_module()
    rng = np.random.default_rng(3)
    _, (k, v) = _kv_sides(fmt, start + n_q, n_kv, hd, start + n_q, rng)
    q = cuda.to_device(rng.standard_normal((n_q, n_head, hd)).astype(np.float32))
    out = cuda.device_array((n_q, n_head, hd), np.float32)
    seq = cuda.to_device(np.array([start], np.int32))
    if variant == "gqa":
        warps, bkv = warps or gqa.WARPS, bkv or gqa.fit_bkv(hd)
        hb, tw = gqa.block_shape(n_head // n_kv, warps)
        if min_blocks is None:
            min_blocks = gqa.default_min_blocks(hb * tw)
        kern = gqa.gqa_kernel(fmt, fmt, hd, hb, tw, bkv, min_blocks)
        run = functools.partial(gqa.prefill_attention_gqa, warps=warps, bkv=bkv,
                                min_blocks=min_blocks)
    else:
        warps, bkv = warps or attention_prefill.WARPS, bkv or attention_prefill.BKV
        kern = attention_prefill._prefill_kernel(fmt, fmt, hd, warps, bkv)
        run = functools.partial(attention_prefill.prefill_attention, warps=warps, bkv=bkv)
    t = time_ms(lambda: run(q, k, v, seq, out), reps=3 if quick else 10)
    flops = attention_prefill.attention_flops(n_q, start, n_head, hd)
    name = f"prefill_attn_{fmt}" + ("" if variant == "base" else f"_{variant}") + tag
    return {"name": name, "n_q": n_q, "start": start, "warps": warps, "bkv": bkv,
            "min_blocks": min_blocks, "ms": t, "kernel": resources(kern),
            "tflops": flops / (t * 1e9)}


def _prefill_attn_entries() -> dict:
    """Base and GQA-shared kernels at 4096 tokens (f16, int8) and 16384 (f16), and the GQA
    kernel's knobs against its default (8 warps bounded to 2 blocks an SM) at 4096: 4 warps (3
    blocks an SM), 8 warps unbounded, 16-key tiles."""
    e = {}
    for fmt, n_q, tag in (("f16", 4096, ""), ("f16", 16384, "_16k"), ("int8", 4096, "")):
        for variant in ("base", "gqa"):
            name = f"prefill_attn_{fmt}" + ("" if variant == "base" else "_gqa") + tag
            e[name] = functools.partial(_prefill_attn, fmt=fmt, n_q=n_q, variant=variant,
                                        tag=tag)
    for tag, knobs in (("_w4", dict(warps=4)), ("_w8nolb", dict(warps=8, min_blocks=0)),
                       ("_k16", dict(bkv=16))):
        e[f"prefill_attn_f16_gqa{tag}"] = functools.partial(_prefill_attn, variant="gqa",
                                                             tag=tag, **knobs)
    return e


def _prefill_attn(quick, **kw):
    return bench_prefill_attention(quick=quick, **kw)


def _decode_attn_4k(quick, *, length, n_target, tag, min_split=None, n_ctx=4096, fmt="f16",
                    **knobs):
    return bench_decode_attention(fmt=fmt, n_ctx=n_ctx, length=length, n_target=n_target,
                                  n_layer=48 if n_ctx <= 4096 else 2, min_split=min_split,
                                  quick=quick, tag=tag, **knobs)


ENTRIES = {
    "decode_attn_f16": lambda quick: bench_decode_attention(fmt="f16", quick=quick),
    # the D1 decode's shape: ~600 live keys in a 4K cache, and a full 4K cache, over 48 layers
    # (the 30B's; past the L2); "_fixed": one split aimed at, i.e. the fixed 256-key split of
    # before the split followed the length, for the comparison in one run
    **{f"decode_attn_f16_{name}{fixed}": functools.partial(
        _decode_attn_4k, length=length, n_target=1 if fixed else None, tag=f"_{name}{fixed}")
       for name, length in (("600", 600), ("4k", 4096)) for fixed in ("", "_fixed")},
    # splits of at least 16 or 64 keys (64, the default, gives each of the tensor-core
    # kernel's four warps a tile)
    **{f"decode_attn_{fmt}_{name}_m{m}": functools.partial(
        _decode_attn_4k, length=length, n_target=None, min_split=m, n_ctx=max(4096, length),
        fmt=fmt, tag=f"_{name}_m{m}")
       for fmt in ("f16", "int8") for name, length in (("600", 600), ("4k", 4096), ("32k", 32768))
       for m in (16, 64, 128)},
    # the tensor-core kernel's launch bounds against its default at the D1 shape, a full 4K
    # cache and 32K
    **{f"decode_attn_f16_{name}_lb{lb}": functools.partial(
        _decode_attn_4k, length=length, n_target=None, n_ctx=max(4096, length), min_blocks=lb,
        tag=f"_{name}_lb{lb}")
       for name, length in (("600", 600), ("4k", 4096), ("32k", 32768)) for lb in (4, 0)},
    # longer splits at 32K (the streaming kernel keeps no score buffer): 64 splits a KV head of
    # 512 keys (256 blocks) and 94 of 352, against 128 of 256
    **{f"decode_attn_f16_32k_s512{tag}": functools.partial(
        _decode_attn_4k, length=32768, n_ctx=32768, max_split=512, n_target=target,
        tag=f"_32k{tag}")
       for tag, target in (("", None), ("_t96", 96))},
    # pass 1 alone (no combine launch) at 32K and a full 4K cache: what the combine costs
    **{f"decode_attn_f16_{name}_pass1": functools.partial(
        _decode_attn_4k, length=length, n_target=None, n_ctx=max(4096, length), combine=False,
        tag=f"_{name}_pass1")
       for name, length in (("4k", 4096), ("32k", 32768))},
    # int8 KV: the tensor-core kernel (its rows widened to f16 in shared memory) against the
    # generic kernel it replaced there
    **{f"decode_attn_int8_{name}_{v}": functools.partial(
        _decode_attn_4k, length=length, n_target=None, n_ctx=max(4096, length), fmt="int8",
        variant=v, tag=f"_{name}")
       for name, length in (("600", 600), ("4k", 4096), ("32k", 32768))
       for v in ("auto", "generic")},
    # Qwen3-235B's shape (64 query heads over 4 KV heads: a group of 16): the tensor-core kernel
    # (two blocks a KV head, 8 query heads each) against the generic kernel
    **{f"decode_attn_{fmt}_g16_{name}_{v}": functools.partial(
        _decode_attn_4k, length=length, n_target=None, n_ctx=max(4096, length), fmt=fmt,
        variant=v, n_head=64, tag=f"_g16_{name}")
       for fmt in ("f16", "int8") for name, length in (("4k", 4096), ("32k", 32768))
       for v in ("auto", "generic")},
    "decode_attn_f16_tc_nolb": lambda quick: bench_decode_attention(fmt="f16", variant="tc_nolb",
                                                                    quick=quick),
    "decode_attn_f16_generic": lambda quick: bench_decode_attention(fmt="f16", variant="generic",
                                                                    quick=quick),
    "decode_attn_int8": lambda quick: bench_decode_attention(fmt="int8", quick=quick),
    "decode_attn_q4_0": lambda quick: bench_decode_attention(fmt="q4_0", quick=quick),
    **_prefill_attn_entries(),
}
