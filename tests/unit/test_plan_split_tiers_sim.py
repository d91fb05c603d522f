"""Helper tiers at run time under numba's CUDA simulator: a two-layer model split over two
stages (one simulated device, an arena each), each stage caching one expert of its layer and
card 0's helper tier holding every other pair (its budget dwarfs this model), so stage 0's
misses hit the tier in its own arena and stage 1's hit it in the other stage's arena (the
"peer" path: one window over both). Logits and greedy tokens against the float64 reference;
the device's tier-hit counts against the count from the reference's own routing; nothing
tier-held is streamed through the prompt ring.

Slow (the simulator runs each CUDA thread as a Python thread): a three-token prompt, one decode
step.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import reference
from helpers.reference import RefModel, forward

from strata.synth import PRESETS, write_model

pytestmark = pytest.mark.slow
MICRO2 = dataclasses.replace(
    PRESETS["tiny"], name="micro2", n_layer=2, n_embd=128, n_head=2, n_head_kv=1, head_dim=64,
    n_expert=4, n_expert_used=2, n_ff_expert=64, n_vocab=512, n_ctx_train=512)
PROMPT = [5, 77, 300]


def _routing(ref_model, tokens) -> list[np.ndarray]:
    """The reference's top-k experts of the last token, per layer (float64 routing)."""
    picks: list[np.ndarray] = []
    inner = reference._moe

    def record(m, x, il):
        probs = reference._softmax(m.mm(f"blk.{il}.ffn_gate_inp", x))
        picks.append(np.argsort(-probs[-1], kind="stable")[:m.n_expert_used])
        return inner(m, x, il)

    reference._moe = record
    try:
        logits = forward(ref_model, tokens)
    finally:
        reference._moe = inner
    return logits, picks


def test_helper_tiers_in_the_simulator(tmp_models):
    from strata.engine.cuda.options import CudaOptions
    from strata.engine.multi import SplitEngine, SplitModel
    from strata.engine.multi.tiers import TierDecodeStep
    from strata.gguf import open_model
    from strata.memory.numba_backend import NumbaBackend
    from strata.plan.options import PlanOptions
    from strata.plan.split import SplitOptions

    path = tmp_models / "micro2-Q8_0.gguf"
    if not path.is_file():
        write_model(path, MICRO2, mix="Q8_0", seed=3, progress=False)
    mf = open_model(path)
    cards = [NumbaBackend(0, memory_info=lambda: (1 << 30, 1 << 30)) for _ in range(2)]
    opts = CudaOptions(plan=PlanOptions(max_context=256, ring_mib=1), graph=False,
                       progress=False)
    split = SplitOptions(cuts=(1,), stage_cache=(1, 1), tier_min_bytes=0)
    sm = SplitModel(mf, opts, split, devices=[0, 0], backends=cards, log=None)
    tier = sm.plan.stages[0].tier
    assert tier is not None and sm.plan.stages[1].tier is None
    held = {tuple(p) for p in tier.cache.pairs().tolist()}
    cached = [{tuple(p) for p in m.arena.device_plan.cache.pairs().tolist()} for m in sm.stages]
    assert len(held) == 6 and not held & (cached[0] | cached[1])
    assert sm.report["tier_pairs_filled"] == [6, 0]
    assert [t.reached for t in sm.tiers] == [(0,), (0,)]
    # the tier's bytes are the store's blobs (filled at load)
    m0 = sm.stages[0]
    top = m0.arena.device_plan.arena.region("helper_tier").offset
    lay = tier.cache
    for j in range(lay.n_slots):
        blob = sm.store.blob(int(lay.slot_layer[j]), int(lay.slot_expert[j]))
        off = top + int(lay.slot_offset[j])
        assert np.array_equal(m0.arena.buffer[off:off + blob.size].copy_to_host(), blob)

    eng = SplitEngine(sm, use_graph=False)
    assert all(isinstance(s, TierDecodeStep) for s in eng.steps)
    got = eng.prefill(PROMPT)
    assert eng.traffic.n_streamed == 0  # every used expert sits in a cache slot or the tier
    ref_model = RefModel.load(path)
    tok = int(np.argmax(got))
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)
    ref, picks1 = _routing(ref_model, PROMPT + [tok])
    assert rel(got, ref[-2]) < 0.02 and tok == int(np.argmax(ref[-2]))
    toks = eng.decode_tokens(2)  # one step, its input token picked on the device
    got2 = eng._read_logits()  # the step's logits, still in the last stage's buffer
    assert toks[0] == tok and rel(got2, ref[-1]) < 0.02
    assert toks[1] == int(np.argmax(got2)) == int(np.argmax(ref[-1]))

    expect = np.zeros((MICRO2.n_layer, 2), np.int64)  # the step's routing is picks1's
    for il, top_k in enumerate(picks1):
        g = 0 if il < 1 else 1
        for e in top_k:
            if (il, int(e)) not in cached[g] and (il, int(e)) in held:
                expect[il, 0] += 1
    assert np.array_equal(eng.tier_hits(), expect)
    hits = eng.hits().counts
    assert hits[:, 1].sum() == 0 and hits[:, 0].sum() == 2 * MICRO2.n_expert_used
    sm.close()
