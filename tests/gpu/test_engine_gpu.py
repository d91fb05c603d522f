"""The CUDA engine end to end on a real GPU (one script; run with -s for the summary table):

    STRATA_TEST_GPU=1 python -m pytest -s tests/gpu/test_engine_gpu.py

* greedy tokens equal the CPU engine's and the float64 reference's, first-step logits within 2%,
  on four quant mixes of a model with odd dimensions;
* caching does not change results: expert caches of 0%, 25% and 100% of the experts, owned vs
  borrowed prompt paths, graph vs no graph, ring waves vs one wave: the same greedy tokens;
* two prompts back to back on a borrowed path: the loan's bookkeeping is restored after each
  and the outputs repeat;
* decode hits and misses are counted on the device, per layer;
* the CPU pool as the miss path, and the misses split between the pool and mapped reads
  (hybrid), give the mapped path's tokens; the adaptive cache swaps slots without changing
  tokens; IQ_MIX and LEGACY_MIX (gate and up in different
  formats) run;
* a short prompt, and a turn's new tokens, run as decode steps give the prompt path's tokens;
* a cache of every expert with an owned prompt path keeps no expert store: its slots are the
  file's blobs and its tokens a store-keeping run's; `generate` picking on the device gives the
  host's tokens, and NaN logits are refused;
* a chat's second turn on the engine that ran the first (`rewind`: only the new tokens
  computed, on the prompt path and as decode steps) gives the tokens of its whole prompt
  computed afresh.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.gpu_engine import MIXES, PROMPT, load, model_path
from helpers.reference import RefModel, greedy

pytestmark = pytest.mark.gpu
N_GEN = 8
LOGIT_TOL = 0.02
ROWS: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    print("\n" + "\n".join(ROWS))


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _cpu_greedy(path, prompt, n):
    from strata.engine.cpu import CpuEngine
    from strata.gguf import open_model

    eng = CpuEngine(open_model(path), max_context=64)
    logits = eng.prefill(prompt)
    first, toks = logits.copy(), []
    for _ in range(n):
        toks.append(int(np.argmax(logits)))
        logits = eng.decode_step(toks[-1])
    return toks, first


def _gpu_greedy(eng, prompt, n):
    eng.reset()
    logits = eng.prefill(prompt)
    return eng.decode_tokens(n), logits


def _run(path, **knobs):
    m, eng = load(path, **knobs)
    before = eng.hits()
    toks, logits = _gpu_greedy(eng, PROMPT, N_GEN)
    hits = eng.hits().since(before)
    use = eng.last_prompt_use
    m.cache.check()
    return toks, logits, hits, use, m


def test_cache_size_does_not_change_tokens(tmp_models):
    path = model_path(tmp_models, "Q8_0")
    n_pairs = 2 * 16
    runs = {}
    for pct, slots in ((0, 0), (25, n_pairs // 4), (100, n_pairs)):
        toks, logits, hits, use, m = _run(path, expert_cache=slots, prefill_borrow=False)
        runs[pct] = toks
        ROWS.append(f"cache {pct:3d}%: {use.mode} chunk {use.chunk} ring {use.ring_slots}, "
                    f"decode hit rate {hits.hit_rate:.2f} (planned "
                    f"{m.plan.predicted_hit_rate:.2f}), tokens {toks}")
        lookups = (N_GEN - 1) * 4  # decode steps x top-k, per layer
        assert (hits.counts.sum(axis=1) == lookups).all()
        if pct == 0:
            assert hits.hits == 0
        if pct == 100:
            assert hits.misses == 0
        m.close()
    assert runs[0] == runs[25] == runs[100]


def test_owned_vs_borrowed_and_two_prompts_back_to_back(tmp_models):
    path = model_path(tmp_models, "Q8_0")
    owned, _, _, use_o, m = _run(path, expert_cache=32, prefill_borrow=False)
    assert use_o.mode == "owned"
    m.close()
    m, eng = load(path, expert_cache=32, prefill_borrow=True)
    assert m.plan.prefill.mode == "borrowed" and m.plan.prefill.lend_slots > 0
    table0 = m.cache.table.copy()
    outs = []
    for prompt in (PROMPT, PROMPT[::-1], PROMPT):
        toks, _ = _gpu_greedy(eng, prompt, N_GEN)
        assert eng.last_prompt_use.mode == "borrowed"
        assert m.cache.loan is None  # refilled
        np.testing.assert_array_equal(m.cache.table, table0)
        m.cache.check()
        outs.append(toks)
    ROWS.append(f"borrowed ({m.plan.prefill.lend_slots} slots lent): {outs[0]} / {outs[1]}; "
                f"owned: {owned}")
    assert outs[0] == outs[2] == owned
    assert eng.traffic.n_streamed > 0  # the lent experts went through the ring
    m.close()


def test_a_cache_of_every_expert_is_filled_from_the_file(tmp_models):
    """Every expert cached, the prompt path owned: no expert store in host memory (the cache
    filled from the file's map), every slot the file's blob, and the tokens those of a run that
    keeps the store (--adaptive-cache, with no counts to re-rank by) — then `generate` picking
    on the device gives the host's tokens, and NaN logits are refused (the device's flag)."""
    from helpers.device_pick import check_device_generate, check_nan_refused
    from strata.gguf.arch.qwen3moe import EXPERT_NAMES

    path = model_path(tmp_models, "Q4_K_M")
    m, eng = load(path, expert_cache=32, prefill_borrow=False)
    assert not m.plan.keeps_experts and not m.store.has_experts
    cache = m.cache_bytes.copy_to_host()
    for layer in range(2):
        for e in range(16):
            off = int(m.cache.layout.slot_offset[m.cache.slot_of(layer, e)])
            want = np.concatenate([m.file.expert_raw(f"blk.{layer}.{n}.weight", e).reshape(-1)
                                   for n in EXPERT_NAMES])
            np.testing.assert_array_equal(cache[off:off + want.size], want)
    toks, _ = _gpu_greedy(eng, PROMPT, N_GEN)
    ROWS.append(f"no expert store ({m.store.n_bytes} B of host memory): tokens {toks}")
    picked = check_device_generate(eng, PROMPT)
    check_nan_refused(eng, PROMPT, m.norms["output_norm"], picked)
    m.close()
    m, eng = load(path, expert_cache=32, prefill_borrow=False, adaptive_cache=True)
    assert m.store.has_experts
    kept, _ = _gpu_greedy(eng, PROMPT, N_GEN)
    m.close()
    assert toks == kept


@pytest.mark.parametrize("mix", ("Q8_0", "Q4_K_M"))
def test_short_prompts_as_steps_give_the_prompt_paths_tokens(tmp_models, mix):
    """A prompt, and a turn's new tokens after a history, run as decode steps (`prompt_steps`)
    give the greedy tokens of the prompt path; the steps leave the cache as it was."""
    path = model_path(tmp_models, mix)
    m, eng = load(path, expert_cache=8, prompt_steps=len(PROMPT))
    assert m.plan.prefill.ring_slots > 0  # the prompt path streams the other 24 experts
    table0 = m.cache.table.copy()
    history, turn = PROMPT + PROMPT[::-1] + PROMPT, [5, 311, 9, 77]
    runs = {}
    for steps in (len(PROMPT), 0):
        eng.prompt_steps = steps
        n_chunks = eng.traffic.n_chunks
        toks, logits = _gpu_greedy(eng, PROMPT, N_GEN)  # steps, then the prompt path
        eng.reset()
        eng.prefill(history)  # 27 tokens: the prompt path either way
        after = eng.prefill(turn)
        runs[steps] = toks, logits, after, eng.decode_tokens(N_GEN)
        assert eng.traffic.n_chunks - n_chunks == (1 if steps else 3)
        np.testing.assert_array_equal(m.cache.table, table0)
        m.cache.check()
    assert eng.n_step_prompts == 2
    (t_s, l_s, a_s, d_s), (t_p, l_p, a_p, d_p) = runs[len(PROMPT)], runs[0]
    ROWS.append(f"{mix} prompt as steps {t_s} / prompt path {t_p}; turn {d_s} / {d_p}")
    assert t_s == t_p and d_s == d_p
    assert _rel(l_s, l_p) < LOGIT_TOL and _rel(a_s, a_p) < LOGIT_TOL
    m.close()


def test_graph_and_no_graph_give_identical_tokens(tmp_models):
    path = model_path(tmp_models, "Q4_K_M")
    toks = {}
    for graph in (True, False):
        m, eng = load(path, graph=graph, expert_cache=8)
        toks[graph], _ = _gpu_greedy(eng, PROMPT, 2 * N_GEN)
        if graph:
            assert eng.step.graphs, "the decode step was never captured as a graph"
        m.close()
    ROWS.append(f"graph {toks[True]}\nplain {toks[False]}")
    assert toks[True] == toks[False]


@pytest.mark.parametrize("steps", (0, 64))
def test_a_chat_turn_reusing_the_last_gives_its_tokens_afresh(tmp_models, steps):
    """Turn 1 = PROMPT and 8 greedy tokens; turn 2 keeps all but the last of them and adds 11
    tokens, on the prompt path (steps 0) or as decode steps (64): its greedy tokens equal a
    fresh engine's on the whole prompt, its first logits within LOGIT_TOL (turn 1's tokens
    were fed by decode steps, whose 8-bit activations round otherwise than the prompt path's
    f16 ones)."""
    from strata.engine import Sampler, SamplingParams, generate

    path = model_path(tmp_models, "Q4_K_M")
    m, eng = load(path, expert_cache=8, prompt_steps=steps)
    greedy_ = SamplingParams(temperature=0.0)
    g1 = generate(eng, PROMPT, n_predict=N_GEN, sampler=Sampler(greedy_))
    kept = list(PROMPT) + g1.tokens[:-1]
    assert eng.n_past == len(kept)
    turn2 = kept + [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46]
    g2 = generate(eng, turn2, n_predict=N_GEN, sampler=Sampler(greedy_), keep_logits=True,
                  reuse=len(kept))
    m.close()
    m, fresh = load(path, expert_cache=8, prompt_steps=steps)
    want = generate(fresh, turn2, n_predict=N_GEN, sampler=Sampler(greedy_), keep_logits=True)
    m.close()
    ROWS.append(f"chat turn (steps {steps}): reused {g2.tokens} fresh {want.tokens}")
    assert g2.reused_tokens == len(kept) and g2.tokens == want.tokens
    assert _rel(g2.logits[0], want.logits[0]) < LOGIT_TOL


def test_ring_waves_and_prefetch_match_resident(tmp_models):
    """A 300-token prompt (two chunks) with no cache: every expert streamed, once in waves of a
    2-slot ring, once through a ring that holds a layer (prefetched); equal to all-resident."""
    from strata.plan.options import PrefillRequest

    path = model_path(tmp_models, "Q8_0")
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, 640, 300)]
    chunk = PrefillRequest(auto=False, tokens=256)
    out = {}
    for name, knobs in (("waves", dict(expert_cache=0, ring_mib=1)),
                        ("prefetch", dict(expert_cache=0, ring_mib=16)),
                        ("resident", dict(expert_cache=32))):
        m, eng = load(path, prefill_borrow=False, prefill=chunk, **knobs)
        toks, logits = _gpu_greedy(eng, prompt, 4)
        assert eng.traffic.n_chunks == 2
        out[name] = (toks, logits)
        ROWS.append(f"{name}: ring {eng.last_prompt_use.ring_slots} slots, streamed "
                    f"{eng.traffic.n_streamed} experts ({eng.traffic.bytes_streamed / 1e6:.1f} "
                    f"MB), tokens {toks}")
        m.close()
    assert out["waves"][0] == out["prefetch"][0] == out["resident"][0]
    # one wave: the same launches on the same bytes, bit for bit; waves add the experts' sums
    # into the residual in another order, and the next layer's f16 activations round that
    # (measured on the H200: 2.7e-4 at most on logits of ~1)
    np.testing.assert_array_equal(out["prefetch"][1], out["resident"][1])
    assert _rel(out["waves"][1], out["resident"][1]) < 1e-3


def test_cpu_pool_misses_give_the_mapped_tokens(tmp_models):
    """Decode misses computed by the CPU pool beside the GPU: the same greedy tokens as the
    mapped reads, every miss computed on the CPU."""
    path = model_path(tmp_models, "Q4_K_M")
    m, eng = load(path, expert_cache=8)
    mapped, _ = _gpu_greedy(eng, PROMPT, N_GEN)
    eng.set_miss_path("cpu")
    before = eng.hits()
    pooled, _ = _gpu_greedy(eng, PROMPT, N_GEN)
    hits = eng.hits().since(before)
    ROWS.append(f"cpu pool: {eng.step.pool.n_experts} experts on the CPU "
                f"({eng.step.pool.n_bytes / 1e6:.1f} MB in {eng.step.pool.seconds * 1e3:.1f} ms)"
                f", tokens {pooled}; mapped {mapped}")
    assert hits.misses > 0 and eng.step.pool.n_experts == hits.misses
    assert pooled == mapped
    eng.prompt_steps = len(PROMPT)  # the prompt as decode steps, its misses on the CPU too
    n_pooled, n_steps = eng.step.pool.n_experts, eng.n_step_prompts
    stepped, _ = _gpu_greedy(eng, PROMPT, N_GEN)
    ROWS.append(f"cpu pool, prompt as steps: tokens {stepped}")
    assert eng.n_step_prompts == n_steps + 1 and eng.step.pool.n_experts > n_pooled
    assert stepped == mapped
    m.close()


def test_hybrid_misses_give_the_mapped_tokens(tmp_models):
    """Decode misses split between the CPU pool and the GPU's mapped reads (a fixed half, then
    the share from measured rates): the mapped path's greedy tokens, every miss computed once."""
    path = model_path(tmp_models, "Q4_K_M")
    m, eng = load(path, expert_cache=8)
    mapped, _ = _gpu_greedy(eng, PROMPT, N_GEN)
    for share in (0.5, None):
        eng.set_miss_path("hybrid", miss_share=share)
        before = eng.hits()
        toks, _ = _gpu_greedy(eng, PROMPT, N_GEN)
        hits = eng.hits().since(before)
        pool, split = eng.step.pool, eng.step.pool.split
        ROWS.append(f"hybrid share {share}: {split.n_cpu} misses on the CPU, {split.n_gpu} read "
                    f"by the GPU ({split.summary()}), tokens {toks}; mapped {mapped}")
        assert split.n_cpu + split.n_gpu == hits.misses > 0
        assert pool.n_experts == split.n_cpu > 0 and split.n_gpu > 0
        assert toks == mapped
    assert split.gpu_bytes_per_s and split.cpu_bytes_per_s  # both rates measured
    m.close()


def test_adaptive_cache_swaps_slots_without_changing_tokens(tmp_models):
    """--adaptive-cache: live counts that favour non-resident experts swap them in after the
    prompt (bookkeeping intact, the device table the host's); the greedy tokens stay the static
    cache's, and the swapped-in experts are hits from the first decode step."""
    path = model_path(tmp_models, "Q4_K_M")
    m, eng = load(path, expert_cache=8, prefill_borrow=False)
    static, _ = _gpu_greedy(eng, PROMPT, N_GEN)
    m.close()
    m, eng = load(path, expert_cache=8, prefill_borrow=False, adaptive_cache=True)
    table0 = m.cache.table.copy()
    hot = {}
    for layer in range(2):  # two non-resident experts of each layer made the hottest
        hot[layer] = np.flatnonzero(table0[layer] < 0)[:2]
        counts = np.zeros(16)
        counts[hot[layer]] = 1000
        m.adaptive.observe(layer, counts)
    toks, _ = _gpu_greedy(eng, PROMPT, N_GEN)
    ROWS.append(f"adaptive cache: {eng.n_adaptive_swaps} swaps, tokens {toks}; static {static}")
    assert eng.n_adaptive_swaps >= 4
    for layer in range(2):
        assert (m.cache.table[layer][hot[layer]] >= 0).all()
    m.cache.check()
    device_table = m.acts["slot_table"].copy_to_host()
    np.testing.assert_array_equal(device_table, m.cache.table)
    assert toks == static
    m.close()


@pytest.mark.parametrize("mix", MIXES)
def test_tokens_equal_cpu_engine_and_reference(tmp_models, mix):
    path = model_path(tmp_models, mix)
    m, eng = load(path)
    toks, first = _gpu_greedy(eng, PROMPT, N_GEN)
    cpu_toks, cpu_first = _cpu_greedy(path, PROMPT, N_GEN)
    ref_toks, ref_first = greedy(RefModel.load(path), PROMPT, N_GEN)
    err_ref, err_cpu = _rel(first, ref_first), _rel(first, cpu_first)
    ROWS.append(f"{mix:8s} logits vs f64 {err_ref:.2e} vs cpu {err_cpu:.2e}  tokens {toks}")
    assert np.isfinite(first).all()
    assert err_ref < LOGIT_TOL and err_cpu < LOGIT_TOL
    assert toks == cpu_toks == ref_toks
    # the host-driven interface (decode_step with host sampling) gives the same tokens
    eng.reset()
    logits, host_toks = eng.prefill(PROMPT), []
    for _ in range(N_GEN):
        host_toks.append(int(np.argmax(logits)))
        logits = eng.decode_step(host_toks[-1])
    assert host_toks == toks
    m.close()
