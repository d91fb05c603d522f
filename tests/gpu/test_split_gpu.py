"""The layer split on real GPUs: two stages (on two GPUs when there are two, else both on one),
greedy tokens identical to the single-GPU engine and logits against the float64 reference; the
carve's A/B (every stage holding every layer's dense weights, stage caches pinned equal) gives
the same tokens and frees the carved bytes; the hand-off forced through pinned host memory
(`--handoff host`) gives the same tokens; the hand-off between stages is measured on every
path; serve's slot over the split reuses a finished turn's KV."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers.gpu_engine import CONFIG, PROMPT, model_path
from helpers.reference import RefModel, forward

pytestmark = pytest.mark.gpu
SPLIT4 = dataclasses.replace(CONFIG, name="gpu-split-test", n_layer=4)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from numba import cuda

    from strata.engine.multi.hostmap import PortableHost
    from strata.experts import build_store
    from strata.gguf import open_model

    path = model_path(tmp_path_factory.mktemp("split"), "Q8_0", config=SPLIT4)
    mf = open_model(path)
    devices = [0, 1] if len(cuda.gpus) > 1 else [0, 0]
    store = build_store(mf, with_embd=True)
    with cuda.gpus[0]:
        portable = PortableHost(store.buffer)
    yield path, mf, devices, (store, portable)
    portable.close()


def _split_run(mf, devices, store, split, n=6):
    from strata.engine.cuda.options import CudaOptions
    from strata.engine.multi import SplitEngine, SplitModel
    from strata.plan.options import PlanOptions

    opts = CudaOptions(plan=PlanOptions(max_context=512, ring_mib=1, lend_floor_slots=0),
                       progress=False)
    sm = SplitModel(mf, opts, split, devices=devices, gpu_mem=[1 << 30] * len(devices),
                    store=store, log=None)
    eng = SplitEngine(sm)
    logits = eng.prefill(PROMPT)
    toks = eng.decode_tokens(n)
    return sm, logits, toks


def test_split_tokens_match_one_gpu_and_the_reference(setup):
    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.cuda.model import CudaModel
    from strata.engine.cuda.options import CudaOptions
    from strata.plan.options import PlanOptions
    from strata.plan.split import SplitOptions

    path, mf, devices, store = setup
    sm, logits, toks = _split_run(mf, devices, store, SplitOptions(cuts=(1,), stage_cache=(9, 9)))
    links = sm.measure_links()
    assert links[0]["token"]["seconds"] > 0 and links[0]["token"]["how"] in (
        "peer-to-peer", "pinned host", "same device")
    sm.close()
    opts = CudaOptions(plan=PlanOptions(max_context=512, ring_mib=1, lend_floor_slots=0,
                                        expert_cache=18), progress=False)
    m = CudaModel(mf, opts, host_store=(store[0], _mapped(store[1])))
    one = CudaEngine(m)
    want = one.prefill(PROMPT)
    assert one.decode_tokens(6) == toks
    np.testing.assert_allclose(logits, want, rtol=0, atol=1e-4 * np.abs(want).max())
    ref = forward(RefModel.load(path), PROMPT)
    assert np.linalg.norm(logits - ref[-1]) / np.linalg.norm(ref[-1]) < 0.02
    m.close()


def _mapped(portable):
    from numba import cuda
    with cuda.gpus[0]:
        return portable.mapped()


def test_a_turn_reuses_the_split_kv(setup):
    """serve's slot over the split (`SplitSlot`) keeps a finished turn's KV: the next turn's
    prompt runs only past it (`SplitEngine.rewind` on every stage), its logits the float64
    reference's and those of the whole turn prefilled afresh."""
    from strata.engine.cuda.options import CudaOptions
    from strata.engine.multi import SplitEngine, SplitModel
    from strata.plan.options import PlanOptions
    from strata.plan.split import SplitOptions
    from strata.serve.batch import SplitSlot

    path, mf, devices, store = setup
    opts = CudaOptions(plan=PlanOptions(max_context=512, ring_mib=1, lend_floor_slots=0),
                       progress=False)
    sm = SplitModel(mf, opts, SplitOptions(cuts=(2,), stage_cache=(9, 9)), devices=devices,
                    gpu_mem=[1 << 30] * len(devices), store=store, log=None)
    eng = SplitEngine(sm)
    slot = SplitSlot(eng)
    tok = int(np.argmax(slot.prefill(0, PROMPT)))
    slot.decode([0], [tok])
    slot.release(0, PROMPT + [tok])
    turn = PROMPT + [tok, 5, 311]
    again = slot.prefill(0, turn)
    assert slot.n_reused == len(PROMPT) + 1 and eng.n_past == len(turn)
    ref = forward(RefModel.load(path), turn)[-1]
    assert np.linalg.norm(again - ref) / np.linalg.norm(ref) < 0.02
    eng.reset()
    whole = eng.prefill(turn)
    assert np.linalg.norm(again - whole) / np.linalg.norm(whole) < 2e-3
    assert int(np.argmax(again)) == int(np.argmax(whole))
    sm.close()


def test_host_handoff_gives_the_same_tokens(setup):
    """The prompt's chunks and every decode step's hidden state (and the token handed back)
    through pinned host memory: the tokens and logits of the default hand-off."""
    from strata.plan.split import SplitOptions

    _, mf, devices, store = setup
    runs = {}
    for handoff in ("auto", "host"):
        sm, logits, toks = _split_run(mf, devices, store, SplitOptions(
            cuts=(2,), stage_cache=(9, 9), handoff=handoff))
        runs[handoff] = (sm.links[0].how, sm.back.how, logits, toks)
        links = sm.measure_links()
        sm.close()
    assert runs["host"][:2] == ("pinned host", "pinned host")
    assert runs["auto"][0] in ("peer-to-peer", "same device")
    assert runs["host"][3] == runs["auto"][3]
    want = runs["auto"][2]
    np.testing.assert_allclose(runs["host"][2], want, rtol=0, atol=1e-4 * np.abs(want).max())
    paths = links[0]["paths"]
    assert links[0]["how"] == "pinned host" and "pinned host" in paths and len(paths) == 2
    assert all(t["token"]["seconds"] > 0 and t["block"]["gb_per_s"] > 0 for t in paths.values())


def test_carve_ab_same_tokens_and_frees_the_weights(setup):
    from strata.plan.split import SplitOptions

    _, mf, devices, store = setup
    arms = {}
    for carve in (True, False):
        sm, _, toks = _split_run(mf, devices, store, SplitOptions(
            cuts=(3,), carve=carve, stage_cache=(20, 8), helper_tiers=False))
        arms[carve] = (toks, [m.arena.device_plan.regions["weights"] for m in sm.stages],
                       [m.arena.device_plan.cache.n_slots for m in sm.stages])
        sm.close()
    assert arms[True][0] == arms[False][0]
    assert arms[True][2] == arms[False][2] == [20, 8]
    assert all(a < b for a, b in zip(arms[True][1], arms[False][1]))


def test_helper_tiers_serve_misses_and_keep_the_tokens(setup):
    """Stage caches of 2 slots, every other pair in the helper tiers (1 GiB per card dwarfs the
    model): the tokens of the run without tiers, nothing missed, tier hits counted per card."""
    from strata.plan.split import SplitOptions

    _, mf, devices, store = setup
    base = SplitOptions(cuts=(2,), stage_cache=(2, 2), tier_min_bytes=0)
    sm, logits, toks = _split_run(mf, devices, store, dataclasses.replace(base,
                                                                          helper_tiers=False))
    sm.close()
    sm, logits_t, toks_t = _split_run(mf, devices, store, base)
    assert any(t is not None for t in sm.tiers)
    assert toks_t == toks
    np.testing.assert_allclose(logits_t, logits, rtol=0, atol=1e-4 * np.abs(logits).max())
    from strata.engine.multi import SplitEngine
    eng = SplitEngine(sm)
    eng.prefill(PROMPT)
    before, tiers_before = eng.hits().counts.copy(), eng.tier_hits()
    eng.decode_tokens(6)
    h, t = eng.hits().counts - before, eng.tier_hits() - tiers_before
    assert h[:, 1].sum() == 0 and t.sum() > 0 and t.sum() <= h[:, 0].sum()
    sm.close()


def test_four_stages_over_every_gpu(setup):
    """One layer a stage over four GPUs (the visible ones in turn where there are fewer), two
    slots a stage cache and helper tiers holding the rest: the tokens and logits of the two-stage
    split, within 2% of the float64 reference, every stage's misses served by some tier."""
    from numba import cuda

    from strata.engine.multi import SplitEngine
    from strata.plan.split import SplitOptions

    path, mf, devices2, store = setup
    devices = [i % len(cuda.gpus) for i in range(4)]
    sm, logits2, toks2 = _split_run(mf, devices2, store, SplitOptions(cuts=(2,),
                                                                      stage_cache=(9, 9)))
    sm.close()
    sm, logits, toks = _split_run(mf, devices, store, SplitOptions(
        cuts=(1, 2, 3), stage_cache=(2, 2, 2, 2), tier_min_bytes=0))
    assert [m.layers for m in sm.stages] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert toks == toks2 and any(t is not None for t in sm.tiers)
    np.testing.assert_allclose(logits, logits2, rtol=0, atol=1e-4 * np.abs(logits2).max())
    ref = forward(RefModel.load(path), PROMPT)
    assert np.linalg.norm(logits - ref[-1]) / np.linalg.norm(ref[-1]) < 0.02
    eng = SplitEngine(sm)
    eng.prefill(PROMPT)
    before, tiers_before = eng.hits().counts.copy(), eng.tier_hits()
    eng.decode_tokens(6)
    h, t = eng.hits().counts - before, eng.tier_hits() - tiers_before
    assert t.shape == (4, 4) and h[:, 1].sum() == 0 and 0 < t.sum() <= h[:, 0].sum()
    sm.close()


def test_generate_over_the_gpus(setup, capsys):
    from numba import cuda
    from strata.cli.main import main

    two = len(cuda.gpus) > 1  # one GPU: --gpus 0 stays on the one-GPU engine
    split = ["--gpus", "0,1", "--layer-split", "2"] if two else ["--gpus", "0"]
    rc = main(["generate", "-m", str(setup[0]), "--prompt-tokens", "1,2,3", "-n", "4",
               "--temperature", "0", "--gpu-mem", "1GiB", "--max-context", "256", "--json",
               *split])
    assert rc == 0
    out = capsys.readouterr().out
    assert (f'"backend": "{"cuda-split" if two else "cuda"}"') in out


def test_serve_over_two_gpus_gives_the_split_tokens(setup):
    """`strata serve --gpus 0,1`: the server's engine is a one-slot split, and its worker's
    greedy tokens are the split engine's."""
    from numba import cuda

    from strata.bench.serve_batch import run_clients
    from strata.plan.split import SplitOptions
    from strata.serve.config import ServeConfig
    from strata.serve.engines import build_engine

    if len(cuda.gpus) < 2:
        pytest.skip("needs two GPUs: the server names distinct GPUs")
    path, mf, devices, store = setup
    sm, _, want = _split_run(mf, devices, store, SplitOptions(cuts=(2,), stage_cache=(9, 9)))
    sm.close()
    built = build_engine(ServeConfig(model=str(path), gpus="0,1", gpu_mem="1GiB",
                                     max_context=256, layer_split="2", ring_mib=1), mf)
    assert built.backend == "cuda-split" and built.engine.n_slots == 1
    assert [d.device.index for d in built.plan.devices] == [0, 1]
    try:
        clients = run_clients(built.engine, [PROMPT, PROMPT], 6)
        assert [c.tokens for c in clients] == [want, want]
        assert built.engine.hit_counts().sum() > 0
    finally:
        built.engine.engine.close()
