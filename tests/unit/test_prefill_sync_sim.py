"""The prompt path's per-layer host sync (strata.engine.cuda.prefill): which layers run their MoE
before the expert counts reach the host (`counts_can_wait`), and, under numba's CUDA simulator,
that skipping the sync changes nothing: a two-layer model prefilled with and without
`prefill_sync_every_layer` gives bit-identical logits, the same prompt traffic and the same
adaptive-cache counts, both against the float64 reference — once with every expert cached (no
sync in any layer) and once with an empty cache (layer 1's experts prefetched into the ring
while layer 0 runs, so layer 1 skips the sync; layer 0 keeps it).

The same model also checks `prefill_small_tiles`: the four-token prompt's grouped GEMMs on
16-row tiles give bit-identical logits (a tile's rows change which MMAs run, not any value's sum).

Slow (the simulator runs each CUDA thread as a Python thread): a four-token prompt, six prompts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers.reference import RefModel, forward

from strata.synth import PRESETS, write_model

MICRO2 = dataclasses.replace(
    PRESETS["tiny"], name="micro2", n_layer=2, n_embd=128, n_head=2, n_head_kv=1, head_dim=64,
    n_expert=4, n_expert_used=2, n_ff_expert=64, n_vocab=512, n_ctx_train=512)
PROMPT = [135, 117, 365, 319]  # 8 entries (the prefetch threshold); expert 1 unused in both layers


def test_counts_wait_only_when_every_expert_is_held_or_staged():
    from strata.engine.cuda.prefill import counts_can_wait

    held = np.array([True, False, True, False])
    assert counts_can_wait(np.ones(4, bool), {})  # all resident
    assert counts_can_wait(held, {1: "slot", 3: "slot"})  # the rest staged whole
    assert not counts_can_wait(held, {1: "slot"})  # expert 3 would need streaming
    assert not counts_can_wait(held, {})  # nothing prefetched
    assert not counts_can_wait(held, {1: "slot", 2: "slot"})  # staged the wrong ones
    assert not counts_can_wait(np.ones(4, bool), {0: "slot"})  # a stale stage: keep the sync
    assert not counts_can_wait(np.zeros(4, bool), {})


def test_small_tiles_only_where_asked_and_their_schedule_fits():
    """`PromptRun._grouped_tile`: the 16-row tile needs the option, few rows an expert and a tile
    schedule the plan's buffers hold; otherwise each format's default (None)."""
    from types import SimpleNamespace

    from strata.cuda_kernels.matmul_tiles import SMALL_TC_TILE
    from strata.cuda_kernels.route import max_tiles
    from strata.engine.cuda.prefill import PromptRun

    def run(on, schedule):
        return SimpleNamespace(m=SimpleNamespace(options=SimpleNamespace(prefill_small_tiles=on)),
                               k=8, n_expert=128, P={"tile_group": np.zeros(schedule, np.int32)})
    fits = max_tiles(32 * 8, 128, SMALL_TC_TILE.bm)  # 16 + 128
    assert PromptRun._grouped_tile(run(True, fits), 32) is SMALL_TC_TILE
    assert PromptRun._grouped_tile(run(True, fits - 1), 32) is None  # the schedule would overflow
    assert PromptRun._grouped_tile(run(False, fits), 32) is None
    assert PromptRun._grouped_tile(run(True, 10 ** 6), 4096) is None  # 32 rows an expert


def _model(path, expert_cache):
    from strata.engine.cuda.model import CudaModel
    from strata.engine.cuda.options import CudaOptions
    from strata.gguf import open_model
    from strata.memory.numba_backend import NumbaBackend
    from strata.plan.options import PlanOptions

    card = NumbaBackend(0, memory_info=lambda: (1 << 30, 1 << 30))  # the simulator has no size
    opts = CudaOptions(plan=PlanOptions(max_context=256, expert_cache=expert_cache, ring_mib=1),
                       graph=False, progress=False, adaptive_cache=True)
    return CudaModel(open_model(path), opts, backend=card)


def _prefill(m, eng, seen, *, sync_every_layer):
    """Logits, traffic, adaptive counts, the layers that skipped the sync and the run."""
    from strata.experts import PrefillTraffic

    m.options = dataclasses.replace(m.options, prefill_sync_every_layer=sync_every_layer)
    seen.clear()
    eng.reset()
    eng.traffic = PrefillTraffic()
    m.adaptive.counts[:] = 0
    logits = eng.prefill(PROMPT)
    return (logits, eng.traffic, m.adaptive.counts.copy(), [il for il, _ in seen],
            [run for _, run in seen])


@pytest.mark.slow
@pytest.mark.parametrize("expert_cache", [None, 0], ids=["all-cached", "ring-prefetch"])
def test_skipping_the_sync_changes_no_result(tmp_models, monkeypatch, expert_cache):
    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.cuda.prefill import PREFETCH_ENTRIES_PER_EXPERT, PromptRun

    seen = []  # (layer, run) of each MoE that ran without the sync
    inner = PromptRun._moe_in_vram
    monkeypatch.setattr(PromptRun, "_moe_in_vram",
                        lambda run, il, *a: seen.append((il, run)) or inner(run, il, *a))

    path = tmp_models / "micro2-Q8_0.gguf"
    if not path.is_file():
        write_model(path, MICRO2, mix="Q8_0", seed=3, progress=False)
    m = _model(path, expert_cache)
    eng = CudaEngine(m, use_graph=False)
    assert len(PROMPT) * MICRO2.n_expert_used >= PREFETCH_ENTRIES_PER_EXPERT * MICRO2.n_expert
    n_held = [int(m.held(il).sum()) for il in range(MICRO2.n_layer)]
    syncs = []
    real_sync = m.stream.synchronize
    m.stream.synchronize = lambda: syncs.append(1) or real_sync()
    old = _prefill(m, eng, seen, sync_every_layer=True)
    n_old = len(syncs)
    new = _prefill(m, eng, seen, sync_every_layer=False)
    n_new = len(syncs) - n_old
    del m.stream.synchronize

    assert old[3] == []  # the forced path syncs every layer
    if expert_cache is None:
        assert n_held == [MICRO2.n_expert] * MICRO2.n_layer and m.plan.prefill.ring_slots == 0
        assert new[3] == [0, 1]
        assert (n_old, n_new) == (MICRO2.n_layer + 1, 2)  # per layer + logits; chunk + logits
        assert new[1].n_streamed == 0 and new[1].n_resident > 0
    else:
        assert n_held == [0, 0] and m.plan.prefill.ring_slots >= MICRO2.n_expert
        assert new[3] == [1]  # layer 0 is not prefetched: its counts pick the streamed experts
        run = new[4][0]
        assert not any(run.ring._busy)  # every prefetched slot acquired and released
        assert (run.late_counts[1, :-1] == 0).any()  # an unused expert was pointed too
        assert new[1].per_layer_streamed[1] == int((run.late_counts[1, :-1] > 0).sum())
        assert new[1].n_resident == 0 and new[1].bytes_streamed > 0
    np.testing.assert_array_equal(new[0], old[0])  # the same kernels on the same inputs
    assert new[1] == old[1] and new[1].n_chunks == 1
    np.testing.assert_array_equal(new[2], old[2])
    assert new[2].sum() > 0  # the adaptive cache saw the routing (decayed after the prompt)
    ref = forward(RefModel.load(path), PROMPT)[-1]
    assert np.linalg.norm(new[0] - ref) / np.linalg.norm(ref) < 0.02
    assert int(np.argmax(new[0])) == int(np.argmax(ref))
    m.close()


@pytest.mark.slow
def test_small_tiles_change_no_result(tmp_models, monkeypatch):
    from strata.cuda_kernels import matmul
    from strata.cuda_kernels.matmul_tiles import SMALL_TC_TILE
    from strata.engine.cuda.engine import CudaEngine

    path = tmp_models / "micro2-Q8_0.gguf"
    if not path.is_file():
        write_model(path, MICRO2, mix="Q8_0", seed=3, progress=False)
    m = _model(path, 0)  # an empty cache: layer 0 streams (synced), layer 1 is prefetched
    eng = CudaEngine(m, use_graph=False)
    tiles = []
    launch = matmul._launch
    monkeypatch.setattr(matmul, "_launch", lambda **kw: tiles.append(kw["tile"]) or launch(**kw))
    logits = {}
    for small in (False, True):
        m.options = dataclasses.replace(m.options, prefill_small_tiles=small)
        tiles.clear()
        eng.reset()
        logits[small] = eng.prefill(PROMPT)
        assert (SMALL_TC_TILE in tiles) == small, tiles
    assert tiles.count(SMALL_TC_TILE) == 2 * MICRO2.n_layer, tiles  # gate/up and down a layer
    np.testing.assert_array_equal(logits[True], logits[False])
    m.close()
