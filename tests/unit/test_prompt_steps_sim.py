"""Short prompts as decode steps (`strata.engine.cuda.prompt_steps`) under numba's CUDA simulator,
on a one-layer model with an empty expert cache (the prompt path streams every expert through the
ring, a step reads every one from mapped host memory): the logits a prompt run as steps leaves
against the float64 reference forward, the bookkeeping (positions, the prompt path untouched,
the steps' expert reads counted as decode reads), a longer prompt still on the prompt path, and
decoding on from either; in the batched engine, a row other than 0 and a reused prefix whose new
tokens run as steps.

Slow (the simulator runs each CUDA thread as a Python thread): a few tokens each. The GPU test
(tests/gpu/test_engine_gpu.py) compares both paths' greedy tokens at real sizes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.reference import RefModel, forward
from strata.synth import PRESETS, write_model

pytestmark = pytest.mark.slow
MICRO = dataclasses.replace(
    PRESETS["tiny"], name="micro-steps", n_layer=1, n_embd=128, n_head=2, n_head_kv=1,
    head_dim=64, n_expert=4, n_expert_used=2, n_ff_expert=32, n_vocab=512, n_ctx_train=512)


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _model(tmp_models):
    from strata.gguf import open_model
    from strata.memory.numba_backend import NumbaBackend

    path = tmp_models / "micro-steps-Q8_0.gguf"
    if not path.is_file():
        write_model(path, MICRO, mix="Q8_0", seed=5, progress=False)
    card = NumbaBackend(0, memory_info=lambda: (1 << 30, 1 << 30))  # the simulator has no size
    return path, open_model(path), card


def test_single_engine_runs_short_prompts_as_steps(tmp_models):
    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.cuda.model import CudaModel
    from strata.engine.cuda.options import CudaOptions
    from strata.plan.options import PlanOptions

    path, mf, card = _model(tmp_models)
    opts = CudaOptions(plan=PlanOptions(max_context=256, expert_cache=0, ring_mib=1),
                       graph=False, progress=False, prompt_steps=3)
    eng = CudaEngine(CudaModel(mf, opts, backend=card), use_graph=False)
    assert eng.prompt_steps == 3
    ref = RefModel.load(path)
    k = MICRO.n_expert_used
    first, more, last = [5, 77, 300], [11, 12, 13, 14], [40]

    got = eng.prefill(first)  # 3 tokens: steps
    assert (eng.n_step_prompts, eng.traffic.n_chunks, eng.traffic.n_streamed) == (1, 0, 0)
    assert eng.last_prompt_use is None and eng.n_past == 3
    np.testing.assert_array_equal(eng.hits().counts, [[0, 3 * k]])  # each step read k experts
    got2 = eng.prefill(more)  # 4 tokens: the prompt path, after the steps' KV
    assert (eng.n_step_prompts, eng.traffic.n_chunks) == (1, 1) and eng.traffic.n_streamed > 0
    got3 = eng.prefill(last)  # steps again, at position 7
    assert eng.n_step_prompts == 2 and eng.n_past == 8
    tok = int(np.argmax(got3))
    got4 = eng.decode_step(tok)
    want = forward(ref, first + more + last + [tok])
    for logits, pos in ((got, 2), (got2, 6), (got3, 7), (got4, 8)):
        assert _rel(logits, want[pos]) < 0.02, pos
        assert int(np.argmax(logits)) == int(np.argmax(want[pos])), pos

    eng.reset()  # the same prompt on the prompt path: the same logits but for 8-bit x rounding
    eng.prompt_steps = 0
    again = eng.prefill(first)
    assert eng.n_step_prompts == 2 and eng.last_prompt_use is not None
    assert _rel(again, got) < 0.01 and int(np.argmax(again)) == int(np.argmax(got))


def test_batch_engine_runs_a_rows_new_tokens_as_steps(tmp_models):
    from strata.engine.cuda.batch import batch_options, load_batch
    from strata.plan.options import PlanOptions

    path, mf, card = _model(tmp_models)
    opts = batch_options(mf, 2, PlanOptions(max_context=256), graph=False, progress=False,
                         prompt_steps=2)
    eng = load_batch(mf, opts, backend=card)
    assert eng.prompt_steps == 2
    ref = RefModel.load(path)
    a, b = [5, 77, 300], [9, 41]
    got_a = eng.prefill(0, a)  # row 0, the prompt path
    got_b = eng.prefill(1, b)  # row 1, two steps of that row
    assert eng.n_step_prompts == 1 and eng.traffic.n_chunks == 1
    tok = {0: int(np.argmax(got_a)), 1: int(np.argmax(got_b))}
    both = eng.decode([0, 1], [tok[0], tok[1]])
    for s, (p, first) in enumerate(((a, got_a), (b, got_b))):
        want = forward(ref, p + [tok[s]])
        assert _rel(first, want[-2]) < 0.02 and _rel(both[s], want[-1]) < 0.02, s

    # slot 1 leaves, its KV kept; its next turn reuses it and runs its new tokens as steps
    eng.release(1, b + [tok[1]])
    turn = b + [tok[1], 7]
    got = eng.prefill(1, turn)
    assert eng.n_reused == 3 and eng.n_step_prompts == 2 and eng.traffic.n_chunks == 1
    want = forward(ref, turn)
    assert _rel(got, want[-1]) < 0.02 and int(np.argmax(got)) == int(np.argmax(want[-1]))
