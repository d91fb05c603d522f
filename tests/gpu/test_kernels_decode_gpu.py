"""The decode-path kernels on a real GPU at model sizes, against float64 references, on fresh
random inputs with every output poisoned (NaN) before the run. Prints a table (run with -s).

    STRATA_TEST_GPU=1 python -m pytest -s tests/gpu/test_kernels_decode_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_blocks import (dots_x8, own_random_rows, random_rows, reference, stored,
                                   x_seen)
from helpers.sampling_ref import ref_sample

pytestmark = pytest.mark.gpu
ROWS: list[tuple[str, str, float, float]] = []
F32_TOL = 1e-4   # f32 accumulation: observed ~1e-6; the brief's bar is 1e-3
# 8-bit x (`lanes_x8`) against the unquantized x: the rounding of x to 8 bits per 32 values
# (|error| <= dx / 2 a value) is ~0.6% of a dot of random x; its own reference is x_seen's
X8_VS_F32_TOL = 2e-2


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    print(f"\n{'kernel':<28} {'shape':<26} {'rel err':>10} {'tol':>8}")
    for name, shape, err, tol in ROWS:
        print(f"{name:<28} {shape:<26} {err:>10.2e} {tol:>8.0e} {'ok' if err < tol else 'FAIL'}")


def _cuda():
    from numba import cuda
    return cuda


def _poisoned(shape, dtype=np.float32):
    return _cuda().to_device(np.full(shape, np.nan, dtype))


def _check(name, shape, got, want, tol=F32_TOL):
    got = np.asarray(got, dtype=np.float64)
    assert np.isfinite(got).all(), f"{name}: unwritten or non-finite outputs"
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    ROWS.append((name, str(shape), err, tol))
    assert err < tol, f"{name} {shape}: relative error {err:.3e}"


FORMATS = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K",
           "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S",
           "MXFP4", "Q6_K_P8"]  # Q6_K_P8: the engine's layout of dense Q6_K (strata.quant.planar)


@pytest.mark.parametrize("name", FORMATS)
def test_dequant_and_matvec(name):
    from strata.cuda_kernels.dequant import dequantize
    from strata.cuda_kernels.matvec import matvec
    cuda = _cuda()
    rng = np.random.default_rng()
    for n_rows, n_cols, gen in ((2048, 4096, random_rows), (512, 768, own_random_rows)):
        rows = gen(name, n_rows, n_cols, rng)
        ref = reference(name, rows, n_cols)
        w = cuda.to_device(stored(name, rows))
        out = _poisoned((n_rows, n_cols))
        dequantize(w, name, out)
        _check(f"dequant {name}", (n_rows, n_cols), out.copy_to_host(), ref, 1e-6)
        x = rng.standard_normal(n_cols).astype(np.float32)
        y = _poisoned(n_rows)
        matvec(w, name, cuda.to_device(x), y)
        _check(f"matvec {name}", (n_rows, n_cols), y.copy_to_host(),
               ref @ x_seen(x, dots_x8(name, rows.nbytes)))
        if dots_x8(name, rows.nbytes):
            _check(f"matvec {name} x8 vs f32 x", (n_rows, n_cols), y.copy_to_host(),
                   ref @ x.astype(np.float64), X8_VS_F32_TOL)
    if name in ("Q4_K", "Q6_K", "Q6_K_P8", "Q8_0", "IQ4_XS", "IQ3_S"):
        for n_tok in (2, 5, 8):
            x = rng.standard_normal((n_tok, n_cols)).astype(np.float32)
            y = _poisoned((n_tok, n_rows))
            matvec(w, name, cuda.to_device(x), y)
            _check(f"matvec{n_tok} {name}", (n_rows, n_cols), y.copy_to_host(),
                   x.astype(np.float64) @ ref.T)
        xh = rng.standard_normal(n_cols).astype(np.float16)
        y = _poisoned(n_rows)
        matvec(w, name, cuda.to_device(xh), y)
        _check(f"matvec f16-x {name}", (n_rows, n_cols), y.copy_to_host(),
               ref @ x_seen(xh, dots_x8(name, rows.nbytes)))


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q6_K_P8", "Q8_0", "IQ3_S", "IQ4_XS"])
def test_matvec_in_rounds_full_size(name, monkeypatch):
    """A head-like matrix (24,575 rows: 12,288 row pairs, more than the capped grid's 4,096
    warps) goes through its row pairs in rounds: equal to the reference and to a grid of one
    pair a warp (another kernel: the compiler fuses its multiply-adds differently, so the last
    bit may differ; the simulator checks the two bit for bit)."""
    from strata.cuda_kernels import matvec as mv
    cuda = _cuda()
    rng = np.random.default_rng()
    n_rows, n_cols = 24575, 2048
    rows = random_rows(name, n_rows, n_cols, rng)
    w = cuda.to_device(stored(name, rows))
    x = cuda.to_device(rng.standard_normal(n_cols).astype(np.float32))
    y = _poisoned(n_rows)
    mv.matvec(w, name, x, y)
    got = y.copy_to_host()
    _check(f"matvec rounds {name}", (n_rows, n_cols), got,
           reference(name, rows, n_cols) @ x_seen(x.copy_to_host(), dots_x8(name, rows.nbytes)))
    monkeypatch.setattr(mv, "LANE_GRID_BLOCKS", 1 << 30)
    y1 = _poisoned(n_rows)
    mv.matvec(w, name, x, y1)
    one = y1.copy_to_host().astype(np.float64)
    assert np.linalg.norm(one - got) / np.linalg.norm(one) < 1e-6


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K_P8", "IQ3_S", "IQ4_XS"])
def test_matvec_x_between_the_rows_full_size(name, monkeypatch):
    """The one-pair 8-bit kernel asking for x between a step's rows (`matvec.X_BETWEEN`) at the
    30B's 4096 -> 2048 and 2048 -> 4096 (y = and y +=): equal to the reference and to the
    kernel without (the same sums in the same order; the compiler may fuse a multiply-add
    differently, so within 1e-6, as the rounds test allows)."""
    from strata.cuda_kernels import matvec as mv
    cuda = _cuda()
    rng = np.random.default_rng()
    for n_rows, n_cols in ((2048, 4096), (4096, 2048)):
        rows = random_rows(name, n_rows, n_cols, rng)
        assert dots_x8(name, rows.nbytes)
        w = cuda.to_device(stored(name, rows))
        x = rng.standard_normal(n_cols).astype(np.float32)
        base = rng.standard_normal(n_rows).astype(np.float32)
        got = {}
        for between in (True, False):
            monkeypatch.setattr(mv, "X_BETWEEN", {name: 1 << 30} if between else {})
            y = _poisoned(n_rows)
            mv.matvec(w, name, cuda.to_device(x), y)
            acc = cuda.to_device(base)
            mv.matvec(w, name, cuda.to_device(x), acc, accumulate=True)
            got[between] = y.copy_to_host().astype(np.float64), acc.copy_to_host()
        _check(f"matvec x between {name}", (n_rows, n_cols), got[True][0],
               reference(name, rows, n_cols) @ x_seen(x, True))
        for k in (0, 1):
            a, b = got[True][k].astype(np.float64), got[False][k].astype(np.float64)
            assert np.linalg.norm(a - b) / np.linalg.norm(b) < 1e-6


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("cpu_misses,routed,x8", [(False, False, True), (True, False, True),
                                                   (False, True, True), (False, False, False)])
def test_moe_decode_30b_shape(cpu_misses, routed, x8, fused, monkeypatch):
    """routed: the gate/up launch routes the router's logits itself (ids/weights its outputs).
    x8: gate/up dots 8-bit x (`lanes_x8`), held to float64 of the x the CPU engine quantizes.
    fused: one launch with a barrier across the grid (`moe_fused`), given its state."""
    import strata.cuda_kernels.moe as moe_mod
    from strata.cuda_kernels.moe import ExpertLayout, moe_decode
    from strata.engine.cpu.idot import x8_arrays
    monkeypatch.setattr(moe_mod, "GATE_UP_X8", x8)
    cuda = _cuda()
    rng = np.random.default_rng()
    n_embd, n_ff, n_layer, n_expert, k, layer = 2048, 768, 2, 16, 8, 1
    lay = ExpertLayout(n_embd, n_ff, "Q4_K", "Q6_K")
    blobs = np.zeros((n_expert, lay.expert_bytes), np.uint8)
    mats = []
    for e in range(n_expert):
        g, u = random_rows("Q4_K", n_ff, n_embd, rng), random_rows("Q4_K", n_ff, n_embd, rng)
        d = random_rows("Q6_K", n_embd, n_ff, rng)
        blobs[e, :g.size], blobs[e, lay.up_off:lay.up_off + u.size] = g.ravel(), u.ravel()
        blobs[e, lay.down_off:lay.down_off + d.size] = d.ravel()
        mats.append((reference("Q4_K", g, n_embd), reference("Q4_K", u, n_embd),
                     reference("Q6_K", d, n_ff)))
    host = cuda.mapped_array(n_layer * n_expert * lay.expert_bytes, np.uint8)
    host[:] = np.tile(blobs.ravel(), n_layer)
    host_off = (np.arange(n_layer * n_expert, dtype=np.int64) * lay.expert_bytes).reshape(n_layer, n_expert)
    cached = rng.permutation(n_expert)[:10]                 # 10 of 16 experts in VRAM slots
    slot_table = np.full((n_layer, n_expert), -1, np.int32)
    slot_table[layer, cached] = np.arange(10)
    cache = cuda.to_device(np.concatenate([blobs[e] for e in cached]))
    slot_off = np.arange(10, dtype=np.int64) * lay.expert_bytes
    logits = (rng.standard_normal(n_expert) * 2).astype(np.float32)  # [n_expert] f32
    if routed:
        ids = np.argsort(-logits, kind="stable")[:k].astype(np.int32)
        p = np.exp(logits[ids].astype(np.float64) - logits.max())
        wts = (p / p.sum()).astype(np.float32)
    else:
        ids = rng.permutation(n_expert)[:k].astype(np.int32)
        wts = rng.random(k).astype(np.float32)
        wts /= wts.sum()
    x = rng.standard_normal(n_embd).astype(np.float32)
    out = _poisoned(n_embd)
    miss = cuda.to_device(np.full(k, -9, np.int32))
    counters = cuda.to_device(np.zeros((n_layer, 2), np.int64))
    h = _poisoned((k, n_ff))
    ids_d = cuda.to_device(np.full(k, -5, np.int32) if routed else ids)
    wts_d = cuda.to_device(np.full(k, np.nan, np.float32) if routed else wts)
    moe_decode(cuda.to_device(x), ids_d, wts_d, layer=layer, layout=lay,
               slot_table=cuda.to_device(slot_table), cache=cache,
               slot_off=cuda.to_device(slot_off), host=host, host_off=cuda.to_device(host_off),
               h=h, out=out, miss_list=miss, counters=counters, cpu_misses=cpu_misses,
               route_logits=cuda.to_device(logits) if routed else None,
               sync=cuda.to_device(np.zeros(2, np.int32)) if fused else None)
    if routed:
        np.testing.assert_array_equal(ids_d.copy_to_host(), ids)
        np.testing.assert_allclose(wts_d.copy_to_host(), wts, rtol=1e-5)
    want = np.zeros(n_embd)
    hit = slot_table[layer, ids] >= 0
    assert moe_mod._gate_up_lanes_for(lay).x8 == x8
    xr = x8_arrays(x[None])[3][0].astype(np.float64) if x8 else x
    for e, w, is_hit in zip(ids, wts, hit):
        if cpu_misses and not is_hit:
            continue
        g, u, d = mats[e]
        gx, ux = g @ xr, u @ xr
        want += w * (d @ (gx / (1 + np.exp(-gx)) * ux))
    _check(f"moe cpu_misses={cpu_misses} x8={x8}{' fused' if fused else ''}", (k, n_embd, n_ff),
           out.copy_to_host(), want)
    assert miss.copy_to_host().tolist() == [int(e) if (cpu_misses and not h_) else -1
                                            for e, h_ in zip(ids, hit)]
    assert counters.copy_to_host()[layer].tolist() == [int(hit.sum()), int(k - hit.sum())]


def test_moe_fused_graph_replays_bit_for_bit():
    """The fused MoE launch (gate/up, a barrier across the grid, down) captured in a CUDA graph
    of 12 layers' launches sharing one barrier state, replayed 50 times: every replay's h and
    output bit for bit those of the two launches, and the barrier's state at launches so far
    (its count: 2^32 a launch; as (arrivals, generation): (0, launches)). Half the experts miss (read through the miss
    path), as with a cache smaller than the model's experts."""
    import strata.cuda_kernels.moe_fused as fused_mod
    from strata.bench.kernels import Ctx, moe_setup
    from strata.cuda_kernels.graph import capture
    from strata.cuda_kernels.moe import moe_decode
    cuda = _cuda()
    ctx = Ctx(seed=7)
    n_layer, n_expert, k = 12, 128, 8
    lay, cache, slot_table, slot_off, host_off = moe_setup(ctx, "Q4_K", "Q6_K", n_layer=n_layer,
                                                           n_expert=n_expert, n_slot_layer=64)
    table = slot_table.copy_to_host()
    table[:, 1::2] = -1  # odd experts miss: read from `host` (here the cache's first bytes)
    slot_table = cuda.to_device(table)
    rng = np.random.default_rng(8)
    logits = [cuda.to_device((rng.standard_normal(n_expert) * 2).astype(np.float32))
              for _ in range(n_layer)]                               # [n_expert] f32
    x = cuda.to_device(rng.standard_normal(lay.n_embd).astype(np.float32))
    miss = cuda.device_array(k, np.int32)
    counters = cuda.to_device(np.zeros((n_layer, 2), np.int64))
    sync = cuda.to_device(np.zeros(2, np.int32))
    runs = {}
    for fused in (True, False):
        ids = cuda.device_array((n_layer, k), np.int32)
        wts = cuda.device_array((n_layer, k), np.float32)
        h = _poisoned((n_layer, k, lay.n_ff))
        out = _poisoned((n_layer, lay.n_embd))

        def record(s, ids=ids, wts=wts, h=h, out=out, fused=fused):
            for layer in range(n_layer):
                moe_decode(x, ids[layer], wts[layer], layer=layer, layout=lay,
                           slot_table=slot_table, cache=cache, slot_off=slot_off, host=cache,
                           host_off=host_off, h=h[layer], out=out[layer], miss_list=miss,
                           counters=counters, route_logits=logits[layer],
                           sync=sync if fused else None, stream=s)
        assert fused_mod.FUSE_DOWN
        record(ctx.stream)  # compiles (a graph captures no JIT)
        graph = capture(record, ctx.stream)
        got = []
        for _ in range(50 if fused else 1):
            graph.replay(ctx.stream)
            ctx.stream.synchronize()
            got.append((h.copy_to_host(), out.copy_to_host()))
        runs[fused] = got
        if fused:
            n = len(got) + 1
            words = sync.copy_to_host()
            if fused_mod.BARRIER == "count":  # one 64-bit count: 2^32 a launch
                count = int(words.view(np.uint32)[0]) | int(words.view(np.uint32)[1]) << 32
                assert count == n * n_layer << 32, (count, n * n_layer)
            else:
                assert words.tolist() == [0, n * n_layer]
    (h2, out2), = runs[False]
    assert np.isfinite(out2).all() and np.isfinite(h2).all()
    for h1, out1 in runs[True]:
        np.testing.assert_array_equal(h1, h2)
        np.testing.assert_array_equal(out1, out2)
    ROWS.append(("moe fused graph x50", f"{n_layer} layers", 0.0, 1e-12))


def test_norm_rope_router_elementwise():
    from strata.cuda_kernels.elementwise import add, embed, swiglu
    from strata.cuda_kernels.norm_rope import qk_norm_rope, rms_norm
    from strata.cuda_kernels.router import route
    cuda = _cuda()
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 2048)).astype(np.float32)
    w = rng.standard_normal(2048).astype(np.float32)
    out = _poisoned(x.shape)
    rms_norm(cuda.to_device(x), cuda.to_device(w), out, eps=1e-6)
    x64 = x.astype(np.float64)
    _check("rms_norm", x.shape, out.copy_to_host(),
           x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w)

    n_tok, d, theta = 4, 128, 1e6
    for n_head in (32, 4):
        q = rng.standard_normal((n_tok, n_head * d)).astype(np.float32)
        qw = rng.standard_normal(d).astype(np.float32)
        pos = rng.integers(0, 4000, n_tok).astype(np.int32)
        q3 = q.reshape(n_tok, n_head, d).astype(np.float64)
        q3 = q3 / np.sqrt((q3 ** 2).mean(-1, keepdims=True) + 1e-6) * qw
        ang = pos[:, None, None] * theta ** (-2.0 * np.arange(d // 2) / d)
        dq = cuda.to_device(q)
        qk_norm_rope(dq, dq, cuda.to_device(pos), n_head=n_head, n_head_kv=n_head, head_dim=d,
                     theta=theta, q_norm_w=cuda.to_device(qw), k_norm_w=None)
        # q and k alias here: q is normed+rotated, then rotated again without a norm
        ang2 = 2 * ang
        a, b = (q3[..., :d // 2], q3[..., d // 2:])
        want = np.concatenate([a * np.cos(ang2) - b * np.sin(ang2), b * np.cos(ang2) + a * np.sin(ang2)], -1)
        _check("qk_norm_rope", (n_tok, n_head, d), dq.copy_to_host().reshape(want.shape), want, 1e-3)

    for n_tok, n_expert, k in ((64, 128, 8), (8, 512, 16)):
        lg = rng.standard_normal((n_tok, n_expert)).astype(np.float32)
        ids, wts = cuda.to_device(np.full((n_tok, k), -1, np.int32)), _poisoned((n_tok, k))
        route(cuda.to_device(lg), ids, wts)
        p = np.exp(lg - lg.max(-1, keepdims=True))
        want_ids = np.argsort(-lg, -1, kind="stable")[:, :k]
        pw = np.take_along_axis(p, want_ids, -1)
        assert (ids.copy_to_host() == want_ids).all()
        _check("route", (n_tok, n_expert, k), wts.copy_to_host(), pw / pw.sum(-1, keepdims=True), 1e-5)

    g, u = (rng.standard_normal((8, 768)).astype(np.float32) for _ in range(2))
    out = _poisoned(g.shape)
    swiglu(cuda.to_device(g), cuda.to_device(u), out)
    g64 = g.astype(np.float64)
    _check("swiglu", g.shape, out.copy_to_host(), g64 / (1 + np.exp(-g64)) * u, 1e-5)
    out = _poisoned(g.shape)
    add(cuda.to_device(g), cuda.to_device(u), out)
    _check("add", g.shape, out.copy_to_host(), g64 + u, 1e-6)

    table = random_rows("Q6_K", 4096, 2048, rng)
    hist = rng.integers(0, 4096, 32).astype(np.int32)
    out = _poisoned((1, 2048))
    embed(cuda.to_device(table), "Q6_K", cuda.to_device(hist), cuda.to_device(np.array([31], np.int32)), out)
    _check("embed Q6_K", (4096, 2048), out.copy_to_host(), reference("Q6_K", table[hist[31:]], 2048), 1e-6)


def test_sampling_full_vocab():
    from strata.cuda_kernels.sampling import KMAX, argmax, bias_table, make_params, sample
    from strata.engine.sampler import apply_logit_bias
    from strata.plan.pick import pick_blocks, pick_cand_len
    cuda = _cuda()
    no_bias = [cuda.to_device(a) for a in bias_table((), 1)]
    rng = np.random.default_rng()
    n_vocab = 151936
    logits = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
    tokens = cuda.to_device(np.zeros(64, np.int32))
    n = cuda.to_device(np.array([0], np.int32))
    state = cuda.to_device(np.zeros(2, np.uint64))  # [2] u64 best key, blocks done
    want = []
    for c in range(4):  # 149 blocks a launch; the best once at a block's edge, once tied
        if c == 2:
            logits[1023] = logits[1024] = logits.max() + 1
        argmax(cuda.to_device(logits), tokens, n, state)
        want.append(int(np.argmax(logits)))
        logits = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
    assert tokens.copy_to_host()[:4].tolist() == want and n.copy_to_host()[0] == 4
    assert want[2] == 1023 and state.copy_to_host().tolist() == [0, 0]
    cand_v = cuda.device_array(pick_cand_len(n_vocab), np.float32)  # 149 blocks' top k, masses
    cand_i = cuda.device_array(pick_blocks(n_vocab) * KMAX, np.int32)
    for params in (dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1),
                   dict(temperature=1.2, top_k=0, top_p=0.9, min_p=0.0),
                   dict(temperature=0.0, top_k=40, top_p=1.0, min_p=0.0, repeat_penalty=1.3),
                   dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.2),
                   dict(temperature=0.6, top_k=0, top_p=1.0, min_p=0.0),
                   # penalties exact in float32 (quarters): no rounding the host does otherwise
                   dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.0, presence_penalty=0.5,
                        frequency_penalty=0.25),
                   dict(temperature=0.0, top_k=40, top_p=1.0, min_p=0.0, frequency_penalty=1.5),
                   # a logit bias of 300 entries over the blocks (the leader banned, the last
                   # block's tail raised): the device's table against the host's apply_logit_bias
                   dict(temperature=0.0, top_k=40, top_p=1.0, min_p=0.0, bias=True),
                   dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1,
                        bias=True),
                   dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, bias=True)):
        full = dict(repeat_penalty=1.0, penalty_last_n=64, seed=int(rng.integers(2**62))) | params
        biased = full.pop("bias", False)
        for _ in range(4):
            logits = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
            bias = ()
            if biased:
                ids = rng.choice(n_vocab - 1, 298, replace=False)
                ids = ids[ids != int(np.argmax(logits))]
                bias = tuple((int(t), float(rng.uniform(-3, 3))) for t in ids[:297])
                bias += ((n_vocab - 1, 4.0), (int(np.argmax(logits)), -100.0))
            f, i = make_params(**full, n_bias=len(bias))
            hist = tokens.copy_to_host()[:n.copy_to_host()[0]]
            want = ref_sample(apply_logit_bias(logits, bias), hist, **full)
            table = [cuda.to_device(a) for a in bias_table(bias, n_vocab)] if bias else no_bias
            sample(cuda.to_device(logits), tokens, n, cuda.to_device(f), cuda.to_device(i),
                   state, cand_v, cand_i, *table)
            got = tokens.copy_to_host()[n.copy_to_host()[0] - 1]
            assert got == want, (params, got, want)
            assert state.copy_to_host().tolist() == [0, 0]
    ROWS.append(("sample (exact token match, bias too)", f"({n_vocab},) x 40 steps", 0.0, 1.0))
    # three sequences in one launch, each by its own settings (a batched step's choice)
    rows = [dict(temperature=0.0, top_k=40, top_p=1.0, min_p=0.0),
            dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
            dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)]
    rows = [dict(repeat_penalty=1.0, penalty_last_n=64, seed=int(rng.integers(2**62))) | r
            for r in rows]
    fp = np.stack([make_params(**r)[0] for r in rows])
    ip = np.stack([make_params(**r)[1] for r in rows])
    hist = rng.integers(0, n_vocab, (3, 8)).astype(np.int32)
    n3 = cuda.to_device(np.array([2, 5, 7], np.int32))
    t3 = cuda.to_device(hist)
    c3 = (cuda.device_array((3, pick_cand_len(n_vocab)), np.float32),  # each row's top k, masses
          cuda.device_array((3, pick_blocks(n_vocab) * KMAX), np.int32))
    lg3 = (rng.standard_normal((3, n_vocab)) * 3).astype(np.float32)
    want = [ref_sample(lg3[r], hist[r, :[2, 5, 7][r]], **rows[r]) for r in range(3)]
    sample(cuda.to_device(lg3), t3, n3, cuda.to_device(fp), cuda.to_device(ip),
           cuda.to_device(np.zeros((3, 2), np.uint64)), *c3,
           *(cuda.to_device(np.stack([a] * 3)) for a in bias_table((), 1)))
    got = t3.copy_to_host()
    assert [int(got[r, [2, 5, 7][r]]) for r in range(3)] == want
    assert n3.copy_to_host().tolist() == [3, 6, 8]


def test_decode_fusions_30b_shape():
    """The decode step's fused launches at the 30B shape: k and v in one matvec (Q8_0
    2048->512 twice), the output projection added into the residual (Q5_K 4096->2048), and
    q/k norm + RoPE + the f16 KV write in one launch (32/4 heads x 128, position 3000)."""
    from strata.cuda_kernels.kvcache import KvLayout, allocate_kv_side
    from strata.cuda_kernels.matvec import matvec, matvec_pair
    from strata.cuda_kernels.rope_kv import rope_kv
    cuda = _cuda()
    rng = np.random.default_rng()
    x = rng.standard_normal(2048).astype(np.float32)
    wk, wv = (random_rows("Q8_0", 512, 2048, rng) for _ in range(2))
    yk, yv = _poisoned(512), _poisoned(512)
    matvec_pair(cuda.to_device(wk.reshape(-1)), "Q8_0", cuda.to_device(wv.reshape(-1)), "Q8_0",
                cuda.to_device(x), yk, yv)
    x64 = x.astype(np.float64)
    _check("matvec_pair k", (512, 2048), yk.copy_to_host(), reference("Q8_0", wk, 2048) @ x64)
    _check("matvec_pair v", (512, 2048), yv.copy_to_host(), reference("Q8_0", wv, 2048) @ x64)
    wo = random_rows("Q5_K", 2048, 4096, rng)
    a = rng.standard_normal(4096).astype(np.float32)
    res = rng.standard_normal(2048).astype(np.float32)
    y = cuda.to_device(res)
    matvec(cuda.to_device(wo), "Q5_K", cuda.to_device(a), y, accumulate=True)
    _check("matvec accumulate Q5_K", (2048, 4096), y.copy_to_host(),
           res + reference("Q5_K", wo, 4096) @ a.astype(np.float64))
    n_head, n_kv, d, n_ctx, pos, theta, eps = 32, 4, 128, 4096, 3000, 1e6, 1e-6
    q, k, v = (rng.standard_normal(n * d).astype(np.float32) for n in (n_head, n_kv, n_kv))
    qw, kw = (rng.uniform(0.5, 1.5, d).astype(np.float32) for _ in range(2))
    ks, vs = (allocate_kv_side(KvLayout("f16", n_ctx, n_kv, d)) for _ in range(2))
    dq, dk = cuda.to_device(q), cuda.to_device(k)
    rope_kv(dq, dk, cuda.to_device(v), cuda.to_device(np.array([pos], np.int32)), ks, vs,
            n_head=n_head, theta=theta, q_norm_w=cuda.to_device(qw),
            k_norm_w=cuda.to_device(kw), eps=eps)
    half = d // 2
    ang = pos * theta ** (-2.0 * np.arange(half) / d)

    def want(x, w, n):
        x = x.astype(np.float64).reshape(n, d)
        x = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
        a, b = x[:, :half], x[:, half:]
        return np.concatenate([a * np.cos(ang) - b * np.sin(ang),
                               b * np.cos(ang) + a * np.sin(ang)], -1)
    _check("rope_kv q", (n_head, d), dq.copy_to_host().reshape(n_head, d), want(q, qw, n_head))
    want_k = want(k, kw, n_kv)
    _check("rope_kv k", (n_kv, d), dk.copy_to_host().reshape(n_kv, d), want_k)
    row = slice(pos * n_kv * 2 * d, (pos + 1) * n_kv * 2 * d)
    got_k = ks.data.copy_to_host()[row].view(np.float16).reshape(n_kv, d)
    _check("rope_kv K row (f16)", (n_kv, d), got_k, want_k, 1e-3)
    got_v = vs.data.copy_to_host()[row].view(np.float16)
    _check("rope_kv V row (f16)", (n_kv, d), got_v, v.astype(np.float64), 1e-3)


def test_rope_kv_int8_30b_shape():
    """q/k norm + RoPE + the int8 KV write in one launch at the 30B shape (32/4 heads x 128,
    position 3000): the K/V rows and scales byte for byte what `qk_norm_rope` + `kv_write` (the
    launches it replaces) write on this GPU, and the dequantized K within int8's rounding of the
    float64 reference."""
    from strata.cuda_kernels.kvcache import KvLayout, allocate_kv_side, kv_write
    from strata.cuda_kernels.norm_rope import qk_norm_rope
    from strata.cuda_kernels.rope_kv import rope_kv
    cuda = _cuda()
    rng = np.random.default_rng()
    n_head, n_kv, d, n_ctx, pos, theta, eps = 32, 4, 128, 4096, 3000, 1e6, 1e-6
    q, k, v = (rng.standard_normal(n * d).astype(np.float32) for n in (n_head, n_kv, n_kv))
    qw, kw = (cuda.to_device(rng.uniform(0.5, 1.5, d).astype(np.float32)) for _ in range(2))
    seq = cuda.to_device(np.array([pos], np.int32))
    lay = KvLayout("int8", n_ctx, n_kv, d)
    ks, vs, ks2, vs2 = (allocate_kv_side(lay) for _ in range(4))
    for side in (ks, vs, ks2, vs2):  # the same poison in both pairs
        side.data.copy_to_device(np.full(n_ctx * n_kv * d, 0x5A, np.uint8))
        side.scale.copy_to_device(np.full(n_ctx * n_kv, 7.0, np.float16))
    dq, dk = cuda.to_device(q), cuda.to_device(k)
    rope_kv(dq, dk, cuda.to_device(v), seq, ks, vs, n_head=n_head, theta=theta, q_norm_w=qw,
            k_norm_w=kw, eps=eps)
    dq2, dk2 = cuda.to_device(q.reshape(1, -1)), cuda.to_device(k.reshape(1, -1))
    qk_norm_rope(dq2, dk2, seq, n_head=n_head, n_head_kv=n_kv, head_dim=d, theta=theta,
                 q_norm_w=qw, k_norm_w=kw, eps=eps)
    kv_write(dk2.reshape(1, n_kv, d), ks2, seq)
    kv_write(cuda.to_device(v.reshape(1, n_kv, d)), vs2, seq)
    same = all(np.array_equal(a.copy_to_host(), b.copy_to_host())
               for a, b in ((dq, dq2.reshape(q.size)), (dk, dk2.reshape(k.size)),
                            (ks.data, ks2.data),
                            (ks.scale, ks2.scale), (vs.data, vs2.data), (vs.scale, vs2.scale)))
    ROWS.append(("rope_kv int8 vs separate launches", f"{n_head}/{n_kv}x{d}",
                 0.0 if same else 1.0, 0.5))
    assert same, "rope_kv's int8 rows, scales or q/k differ from qk_norm_rope + kv_write"
    rows = slice(pos * n_kv, (pos + 1) * n_kv)
    qb = ks.data.copy_to_host().reshape(-1, d)[rows].view(np.int8).astype(np.float64)
    deq = qb * ks.scale.copy_to_host()[rows].astype(np.float64)[:, None]
    kr = dk.copy_to_host().reshape(n_kv, d).astype(np.float64)
    _check("rope_kv K row (int8)", (n_kv, d), deq, kr, 1e-2)
