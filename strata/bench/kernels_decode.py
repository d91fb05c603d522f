"""Benchmark group `decode_step`: every Strata decode kernel of a 48-layer Qwen3-30B-A3B-shaped
step (attention excluded: it is the prefill/attention family's), launched plainly from Python and
as one CUDA-graph replay; per-kernel cost and the step's bytes over its time.

Per layer: rms_norm, q/k/v matvecs (Q4_K, Q4_K, Q6_K), per-head norm + RoPE (2 launches), the
output projection (Q4_K), residual add, rms_norm, router matvec (F32), top-8 routing, MoE
gate_up + down (8 of 128 experts, all VRAM hits, Q4_K/Q6_K) added into the residual; then the
final norm, the Q6_K output head (151936 rows) and argmax into the device token history.
"""

from __future__ import annotations

import numpy as np

from strata.bench.kernels import Ctx, Result, bench, moe_setup, random_weights

N_LAYER, N_EMBD, N_HEAD, N_KV, HEAD_DIM = 48, 2048, 32, 4, 128
N_EXPERT, N_SLOT_LAYER, K, N_VOCAB = 128, 16, 8, 151936
ATTN = (("q", "Q4_K", N_HEAD * HEAD_DIM, N_EMBD), ("k", "Q4_K", N_KV * HEAD_DIM, N_EMBD),
        ("v", "Q6_K", N_KV * HEAD_DIM, N_EMBD), ("o", "Q4_K", N_EMBD, N_HEAD * HEAD_DIM),
        ("router", "F32", N_EXPERT, N_EMBD))
LAUNCHES_PER_LAYER = 12


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
    from strata.cuda_kernels.elementwise import add
    from strata.cuda_kernels.matvec import matvec
    from strata.cuda_kernels.moe import moe_decode
    from strata.cuda_kernels.norm_rope import qk_norm_rope, rms_norm
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
    attn, rlog = vec(1, N_EMBD), vec(1, N_EXPERT)
    logits = vec(N_VOCAB)
    ids = cuda.to_device(np.zeros((1, K), np.int32))
    wts = cuda.to_device(np.zeros((1, K), f32))
    h = cuda.device_array((K, lay.n_ff), f32)
    miss = cuda.device_array(K, np.int32)
    counters = cuda.to_device(np.zeros((N_LAYER, 2), np.int64))
    pos = cuda.to_device(np.array([1234], np.int32))
    tokens = cuda.to_device(np.zeros(1 << 20, np.int32))
    n_tok = cuda.to_device(np.zeros(1, np.int32))
    x1, xn1, q1, attn1, rlog1 = (a.reshape(a.size) for a in (x, xn, q, attn, rlog))
    ids1, wts1 = ids.reshape(K), wts.reshape(K)

    def record(s):
        for layer in range(N_LAYER):
            rms_norm(x, norm_w[0], xn, eps=1e-6, stream=s)
            matvec(W["q"][layer], "Q4_K", xn1, q1, stream=s)
            matvec(W["k"][layer], "Q4_K", xn1, k.reshape(k.size), stream=s)
            matvec(W["v"][layer], "Q6_K", xn1, v.reshape(v.size), stream=s)
            qk_norm_rope(q, k, pos, n_head=N_HEAD, n_head_kv=N_KV, head_dim=HEAD_DIM, theta=1e6,
                         q_norm_w=qn, k_norm_w=kn, stream=s)
            matvec(W["o"][layer], "Q4_K", q1, attn1, stream=s)
            add(x, attn, x, stream=s)
            rms_norm(x, norm_w[1], xn, eps=1e-6, stream=s)
            matvec(W["router"][layer], "F32", xn1, rlog1, stream=s)
            route(rlog, ids, wts, stream=s)
            moe_decode(xn1, ids1, wts1, layer=layer, layout=lay, slot_table=slot_table,
                       cache=cache, slot_off=slot_off, host=cache, host_off=host_off, h=h,
                       out=x1, miss_list=miss, counters=counters, accumulate=True, stream=s)
        rms_norm(x, norm_w[2], xn, eps=1e-6, stream=s)
        matvec(head, "Q6_K", xn1, logits, stream=s)
        argmax(logits, tokens, n_tok, stream=s)

    n_launch = N_LAYER * LAUNCHES_PER_LAYER + 3
    step_bytes = attn_bytes + N_LAYER * K * lay.expert_bytes + head_host.size
    us_plain = ctx.time_plain(record, n_launch) * n_launch
    us_graph = ctx.time_graph(record, n_launch, reps=5) * n_launch
    extra = {"launches per step": n_launch,
             "plain us/kernel": round(us_plain / n_launch, 2),
             "graph us/kernel": round(us_graph / n_launch, 2),
             "graph tok/s (no attention)": round(1e6 / us_graph, 1),
             "step MB": round(step_bytes / 1e6, 1)}
    return [Result("decode_step", "48-layer step, plain launches", "30B-A3B Q4_K", us_plain,
                   step_bytes, ctx.read_gbps),
            Result("decode_step", "48-layer step, CUDA graph", "30B-A3B Q4_K", us_graph,
                   step_bytes, ctx.read_gbps, extra=extra)]
