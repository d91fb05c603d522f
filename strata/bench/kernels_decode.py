"""Benchmark group `decode_step`: every Strata decode kernel of a 48-layer Qwen3-30B-A3B-shaped
step (attention excluded: it is the prefill/attention family's), launched plainly from Python and
as one CUDA-graph replay; per-kernel cost and the step's bytes over its time.

The launches are the engine's `DecodeStep` on an f16 KV cache, with the 30B Q4_K_M mix's types.
Per layer: rms_norm, the q matvec (Q4_K), k and v in one `matvec_pair` (Q8_0), `rope_kv` (q/k
norm + RoPE and the K/V row write, one launch), the output projection (Q5_K) added into the
residual, rms_norm, router matvec (F32), top-8 routing, MoE gate_up + down (8 of 128 experts,
all VRAM hits, Q4_K/Q6_K) added into the residual; then the final norm, the Q6_K output head
(151936 rows) and argmax into the device token history.

Group `router`: the router matvec alone (F32 128x2048, `matvec_f32`) for 1 and 8 tokens.

Group `sampling`: picking the token from 151,936 logits, each one launch of many blocks: argmax,
the sampler at temperature 0 with a repetition penalty, and sampling (top-k 40 and 256, top-p
0.95, min-p 0.05).

Group `qkv`: a Q4_K_M layer's q, k (Q4_K) and v (Q6_K) with the RMSNorm fused, in one launch of
the mixed kernel against the two per-format launches it replaced.
"""

from __future__ import annotations

import numpy as np

from strata.bench.kernels import Ctx, Result, bench, moe_setup, n_rotation, random_weights

N_LAYER, N_EMBD, N_HEAD, N_KV, HEAD_DIM = 48, 2048, 32, 4, 128
N_EXPERT, N_SLOT_LAYER, K, N_VOCAB = 128, 16, 8, 151936
ATTN = (("q", "Q4_K", N_HEAD * HEAD_DIM, N_EMBD), ("k", "Q8_0", N_KV * HEAD_DIM, N_EMBD),
        ("v", "Q8_0", N_KV * HEAD_DIM, N_EMBD), ("o", "Q5_K", N_EMBD, N_HEAD * HEAD_DIM),
        ("router", "F32", N_EXPERT, N_EMBD))
LAUNCHES_PER_LAYER = 10
N_CTX = 2048  # KV positions per layer (the step writes position 1234)


def _layer_weights(ctx: Ctx):
    """Device weights of every layer's attention projections and router: {name: [views]}."""
    out, n_bytes = {}, 0
    for name, t, n_rows, n_cols in ATTN:
        host = random_weights(ctx, t, n_rows, n_cols)
        dev = ctx.replicate(host, N_LAYER)
        out[name] = [dev[i * host.size:(i + 1) * host.size] for i in range(N_LAYER)]
        n_bytes += host.size * N_LAYER
    return out, n_bytes


@bench("decode_step")
def decode_step(ctx: Ctx) -> list[Result]:
    from strata.cuda_kernels.kvcache import KvLayout, allocate_kv_side
    from strata.cuda_kernels.matvec import matvec, matvec_pair
    from strata.cuda_kernels.moe import moe_decode
    from strata.cuda_kernels.norm_rope import rms_norm
    from strata.cuda_kernels.rope_kv import rope_kv
    from strata.cuda_kernels.router import route
    from strata.cuda_kernels.sampling import argmax
    cuda, f32, rng = ctx.cuda, np.float32, ctx.rng
    W, attn_bytes = _layer_weights(ctx)
    lay, cache, slot_table, slot_off, host_off = moe_setup(
        ctx, "Q4_K", "Q6_K", n_layer=N_LAYER, n_expert=N_EXPERT, n_slot_layer=N_SLOT_LAYER)
    head_host = random_weights(ctx, "Q6_K", N_VOCAB, N_EMBD)
    head = ctx.upload(head_host)

    def vec(*shape, scale=1.0):
        return ctx.upload((rng.standard_normal(shape) * scale).astype(f32))
    x, xn = vec(1, N_EMBD), vec(1, N_EMBD)
    norm_w = [vec(N_EMBD) for _ in range(3)]
    qn, kn = vec(HEAD_DIM), vec(HEAD_DIM)
    q, k, v = vec(1, N_HEAD * HEAD_DIM), vec(1, N_KV * HEAD_DIM), vec(1, N_KV * HEAD_DIM)
    rlog = vec(1, N_EXPERT)
    logits = vec(N_VOCAB)
    ids = cuda.to_device(np.zeros((1, K), np.int32))
    wts = cuda.to_device(np.zeros((1, K), f32))
    h = cuda.device_array((K, lay.n_ff), f32)
    miss = cuda.device_array(K, np.int32)
    counters = cuda.to_device(np.zeros((N_LAYER, 2), np.int64))
    sync = cuda.to_device(np.zeros(2, np.int32))  # [2] i32: the fused MoE launch's barrier
    pos = cuda.to_device(np.array([1234], np.int32))
    tokens = cuda.to_device(np.zeros(1 << 20, np.int32))
    n_tok = cuda.to_device(np.zeros(1, np.int32))
    pick_state = cuda.to_device(np.zeros(2, np.uint64))  # [2] u64: argmax's best key, blocks
    x1, xn1, q1, k1, v1, rlog1 = (a.reshape(a.size) for a in (x, xn, q, k, v, rlog))
    kv = [[allocate_kv_side(KvLayout("f16", N_CTX, N_KV, HEAD_DIM)) for _ in range(2)]
          for _ in range(N_LAYER)]  # [layer][K, V] f16 sides
    ids1, wts1 = ids.reshape(K), wts.reshape(K)

    def record(s):
        for layer in range(N_LAYER):
            rms_norm(x, norm_w[0], xn, eps=1e-6, stream=s)
            matvec(W["q"][layer], "Q4_K", xn1, q1, stream=s)
            matvec_pair(W["k"][layer], "Q8_0", W["v"][layer], "Q8_0", xn1, k1, v1, stream=s)
            rope_kv(q1, k1, v1, pos, *kv[layer], n_head=N_HEAD, theta=1e6, q_norm_w=qn,
                    k_norm_w=kn, stream=s)
            matvec(W["o"][layer], "Q5_K", q1, x1, accumulate=True, stream=s)
            rms_norm(x, norm_w[1], xn, eps=1e-6, stream=s)
            matvec(W["router"][layer], "F32", xn1, rlog1, stream=s)
            route(rlog, ids, wts, stream=s)
            moe_decode(xn1, ids1, wts1, layer=layer, layout=lay, slot_table=slot_table,
                       cache=cache, slot_off=slot_off, host=cache, host_off=host_off, h=h,
                       out=x1, miss_list=miss, counters=counters, accumulate=True, sync=sync,
                       stream=s)
        rms_norm(x, norm_w[2], xn, eps=1e-6, stream=s)
        matvec(head, "Q6_K", xn1, logits, stream=s)
        argmax(logits, tokens, n_tok, pick_state, stream=s)

    n_launch = N_LAYER * LAUNCHES_PER_LAYER + 3
    step_bytes = attn_bytes + N_LAYER * K * lay.expert_bytes + head_host.size
    us_plain = ctx.time_plain(record, n_launch) * n_launch
    us_graph = ctx.time_graph(record, n_launch, reps=5) * n_launch
    extra = {"launches per step": n_launch,
             "plain us/kernel": round(us_plain / n_launch, 2),
             "graph us/kernel": round(us_graph / n_launch, 2),
             "graph tok/s (no attention)": round(1e6 / us_graph, 1),
             "step MB": round(step_bytes / 1e6, 1)}
    return [Result("decode_step", "48-layer step, plain launches", "30B-A3B Q4_K_M", us_plain,
                   step_bytes, ctx.read_gbps),
            Result("decode_step", "48-layer step, CUDA graph", "30B-A3B Q4_K_M", us_graph,
                   step_bytes, ctx.read_gbps, extra=extra)]


@bench("router")
def router_matvec(ctx: Ctx) -> list[Result]:
    """The router matvec alone (F32 [128, 2048] through `matvec_f32`) for 1 and 8 tokens, each
    replay rotating through copies of the weights so the L2 cannot hold them."""
    from strata.cuda_kernels.matvec import matvec
    host = random_weights(ctx, "F32", N_EXPERT, N_EMBD)
    n_copies = n_rotation(host.size)
    dev = ctx.replicate(host, n_copies)
    views = [dev[c * host.size:(c + 1) * host.size] for c in range(n_copies)]
    out = []
    for n_tok in (1, 8):
        x = ctx.upload(ctx.rng.standard_normal((n_tok, N_EMBD)).astype(np.float32))
        y = ctx.cuda.device_array((n_tok, N_EXPERT), np.float32, stream=ctx.stream)
        if n_tok == 1:
            x, y = x.reshape(N_EMBD), y.reshape(N_EXPERT)

        def record(s, x=x, y=y):
            for v in views:
                matvec(v, "F32", x, y, stream=s)
        us = ctx.time_graph(record, n_copies)
        out.append(Result("router", f"matvec F32 {n_tok} token{'s' * (n_tok > 1)}",
                          f"{N_EXPERT}x{N_EMBD}", us,
                          host.size + 4 * n_tok * (N_EMBD + N_EXPERT), ctx.read_gbps))
    return out


@bench("qkv")
def qkv_normed(ctx: Ctx) -> list[Result]:
    """A Q4_K_M layer's q, k (Q4_K) and v (Q6_K) with the attention RMSNorm fused, 30B shapes,
    one layer's weights of N_LAYER after another (past the L2): one launch of the mixed kernel
    (`matvec_mixed`) against the per-format launches it replaces (Q4_K q+k, then Q6_K v)."""
    from strata.cuda_kernels import matvec as mv
    from strata.cuda_kernels.matvec_normed import matvec_normed
    from strata.cuda_kernels.qformats import get_format
    shapes = (("Q4_K", N_HEAD * HEAD_DIM), ("Q4_K", N_KV * HEAD_DIM), ("Q6_K", N_KV * HEAD_DIM))
    ws, n_bytes = [], 0
    for t, n_rows in shapes:
        host = random_weights(ctx, t, n_rows, N_EMBD)
        dev = ctx.replicate(host, N_LAYER)
        ws.append([dev[i * host.size:(i + 1) * host.size] for i in range(N_LAYER)])
        n_bytes += n_rows * get_format(t).row_bytes(N_EMBD)
    x = ctx.upload((ctx.rng.standard_normal(N_EMBD) * 5.0).astype(np.float32))
    nw = ctx.upload(ctx.rng.uniform(0.5, 1.5, N_EMBD).astype(np.float32))
    ys = [ctx.cuda.device_array(n, np.float32, stream=ctx.stream) for _, n in shapes]

    def recorder(groups):
        def record(s):
            for il in range(N_LAYER):
                for g in groups:
                    matvec_normed(x, nw, 1e-6, [(ws[j][il], shapes[j][0], ys[j]) for j in g],
                                  stream=s)
        return record
    us_mixed = ctx.time_graph(recorder([(0, 1, 2)]), N_LAYER)
    us_apart = ctx.time_graph(recorder([(0, 1), (2,)]), 2 * N_LAYER) * 2  # per layer
    default = mv.LANE_GRID_BLOCKS
    mv.LANE_GRID_BLOCKS = 1 << 30  # a warp a row pair (352 blocks) against rounds (256)
    try:
        us_no_rounds = ctx.time_graph(recorder([(0, 1, 2)]), N_LAYER)
    finally:
        mv.LANE_GRID_BLOCKS = default
    label = f"q {shapes[0][1]}, k {shapes[1][1]} Q4_K | v {shapes[2][1]} Q6_K x {N_EMBD}"
    return [Result("qkv", "q/k/v normed, one mixed launch", label, us_mixed,
                   n_bytes + 4 * (2 * N_EMBD + sum(n for _, n in shapes)), ctx.read_gbps,
                   extra={"us per layer, per-format launches": round(us_apart, 2),
                          "us without rounds": round(us_no_rounds, 2)})]


@bench("sampling")
def sampling_group(ctx: Ctx) -> list[Result]:
    """Token choice over a 151,936-logit vocabulary, 48 launches a graph (the history fills
    up: later launches choose and append nothing, and are timed all the same)."""
    from strata.cuda_kernels.sampling import KMAX, argmax, bias_table, make_params, sample
    from strata.plan.pick import pick_blocks, pick_cand_len
    cuda, reps = ctx.cuda, 48
    logits = ctx.upload((ctx.rng.standard_normal(N_VOCAB) * 3).astype(np.float32))
    tokens = cuda.to_device(np.zeros(reps + 1, np.int32))
    n_tok = cuda.to_device(np.zeros(1, np.int32))
    state = cuda.to_device(np.zeros(2, np.uint64))  # [2] u64: best key, blocks done
    cand_v = cuda.device_array(pick_cand_len(N_VOCAB), np.float32)  # each block's top k, mass
    cand_i = cuda.device_array(pick_blocks(N_VOCAB) * KMAX, np.int32)
    out = []

    def timed(name, pick):
        def record(s):
            for _ in range(reps):
                pick(s)
        us = ctx.time_graph(record, reps)
        n_tok.copy_to_device(np.zeros(1, np.int32))  # the history filled up in the replays
        out.append(Result("sampling", name, f"{N_VOCAB} f32", us, 4 * N_VOCAB, ctx.read_gbps))
    timed("argmax, many blocks", lambda s: argmax(logits, tokens, n_tok, state, stream=s))
    for label, params in (("sample greedy, penalty 1.1", dict(temperature=0.0,
                                                               repeat_penalty=1.1)),
                          ("sample t=0.8 top-k 40", dict(temperature=0.8, top_k=40)),
                          ("sample t=1 top-k 0 top-p .95 min-p .05 (256 best + mass)",
                           dict(temperature=1.0, top_k=0)),
                          ("sample t=0.7 top-k 0 top-p .9 (256 best + mass)",
                           dict(temperature=0.7, top_k=0, top_p=0.9, min_p=0.0)),
                          ("sample t=1 every token (no sort)",
                           dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)),
                          ("sample greedy, a 300-entry logit bias",
                           dict(temperature=0.0, logit_bias=tuple(
                               (t * 499, 1.5) for t in range(300)))),
                          ("sample t=0.8 top-k 40, a 300-entry logit bias",
                           dict(temperature=0.8, top_k=40, logit_bias=tuple(
                               (t * 499, -2.0) for t in range(300))))):
        bias = params.pop("logit_bias", ())
        f, i = (ctx.upload(a) for a in make_params(**params, n_bias=len(bias)))
        bid, bval = (ctx.upload(a) for a in bias_table(bias, N_VOCAB))
        timed(label, lambda s, f=f, i=i, bid=bid, bval=bval: sample(
            logits, tokens, n_tok, f, i, state, cand_v, cand_i, bid, bval, stream=s))
    return out
