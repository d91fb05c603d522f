"""The layer split's engine under numba's CUDA simulator (CI has no GPU): a two-layer model
split over two stages (both on the simulator's one device, each with its own arena), each stage
caching one expert of its own layer, so the prompt streams through each stage's ring and decode
reads misses from the one host store; the hidden state (and the token handed back) crosses
through the pinned host staging buffer (`--handoff host`); logits against the float64
reference, greedy tokens on the device, each stage's regions holding only its own layer, the hit
counters per stage; serve's slot reusing a finished turn's KV (`rewind`); a short prompt run as
decode steps through both stages.

Slow (the simulator runs each CUDA thread as a Python thread): the smallest model the
synthesizer writes, a three-token prompt, one decode step.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers.device_pick import check_device_generate, check_nan_refused
from helpers.reference import RefModel, forward

from strata.synth import PRESETS, write_model

pytestmark = pytest.mark.slow
MICRO2 = dataclasses.replace(
    PRESETS["tiny"], name="micro2", n_layer=2, n_embd=128, n_head=2, n_head_kv=1, head_dim=64,
    n_expert=4, n_expert_used=2, n_ff_expert=64, n_vocab=512, n_ctx_train=512)
PROMPT = [5, 77, 300]


def test_split_engine_in_the_simulator(tmp_models):
    from strata.engine.cuda.options import CudaOptions
    from strata.engine.multi import SplitEngine, SplitModel
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
    lines: list[str] = []
    sm = SplitModel(mf, opts, SplitOptions(cuts=(1,), stage_cache=(1, 1), helper_tiers=False,
                                           handoff="host"),
                    devices=[0, 0], backends=cards, log=lines.append)
    assert [m.layers for m in sm.stages] == [(0, 1), (1, 2)]
    assert sm.links[0].how == sm.back.how == "pinned host"
    assert any("hidden state GPU 0 -> GPU 0: pinned host (--handoff host)" in x for x in lines)
    for g, m in enumerate(sm.stages):
        dp = m.arena.device_plan
        names = dp.arena.region("weights").sub.names
        assert all(n.startswith(f"blk.{g}.") or not n.startswith("blk.") for n in names)
        assert ("output.weight" in names) == (g == 1)
        assert dp.cache.n_slots == 1 and set(dp.cache.slot_layer.tolist()) == {g}
        assert m.kv_sides[g] is not None and m.kv_sides[1 - g] is None
    eng = SplitEngine(sm, use_graph=False)
    got = eng.prefill(PROMPT)
    assert eng.traffic.n_streamed > 0  # each stage streamed its layer's missed experts
    ref_model = RefModel.load(path)
    tok = int(np.argmax(got))
    ref = forward(ref_model, PROMPT + [tok])
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)
    assert rel(got, ref[-2]) < 0.02 and tok == int(np.argmax(ref[-2]))
    # one step: the token picked on the last stage's GPU, handed back to stage 0 for the step
    toks = eng.decode_tokens(2)
    got2 = eng._read_logits()  # the step's logits, still in the last stage's buffer
    assert toks[0] == tok and eng.n_past == len(PROMPT) + 1 and rel(got2, ref[-1]) < 0.02
    assert toks[1] == int(np.argmax(got2)) == int(np.argmax(ref[-1]))
    hits = eng.hits().counts
    assert hits.sum() == 2 * MICRO2.n_expert_used and hits[:, 0].sum() <= 2
    # `generate` with each token picked on the last stage's GPU and handed back, against the
    # host's choice (the step run ahead of a stop token taken back on every stage)
    got = check_device_generate(eng, PROMPT)
    assert got[:2] == toks
    check_nan_refused(eng, PROMPT, eng.last.norms["output_norm"], got)
    # serve's slot over the split keeps a finished turn's KV: the next turn computes only its
    # new tokens (after the prompt and the answer's token the last step fed)
    from strata.serve.batch import SplitSlot

    slot = SplitSlot(eng)
    assert slot.keeps_prefix
    first = slot.prefill(0, PROMPT)
    slot.decode([0], [tok])
    slot.release(0, PROMPT + [tok])
    turn = PROMPT + [tok, 9]
    again = slot.prefill(0, turn)
    assert slot.n_reused == 4 and eng.n_past == 5
    assert rel(first, ref[-2]) < 0.02 and rel(again, forward(ref_model, turn)[-1]) < 0.02
    with pytest.raises(ValueError, match="cannot keep 6 positions of a 5-position"):
        eng.rewind(6)
    # a short prompt as decode steps through both stages (`prompt_steps`; the suite's plans
    # take the prompt path unless told): the prompt path's logits, and a step after them
    eng.reset()
    eng.prompt_steps = len(PROMPT)
    n_chunks = eng.traffic.n_chunks
    steps = eng.prefill(PROMPT)
    assert (eng.n_step_prompts, eng.traffic.n_chunks, eng.n_past) == (1, n_chunks, 3)
    assert rel(steps, ref[-2]) < 0.02 and eng.decode_tokens(2) == toks
    sm.close()
