"""The batched CUDA engine (`strata serve --batch N`) on a real GPU:

    STRATA_TEST_GPU=1 python -m pytest -s tests/gpu/test_batch_gpu.py

* three sequences decoded together (CUDA graphs, the small-batch matvec and batched MoE kernels)
  give each one the greedy tokens it gets decoded alone, and the float64 reference's;
* sequences join and leave between steps (a row freed below the last is refilled by a move of
  the last row's KV): the survivors' tokens do not change;
* the serve worker over the engine: concurrent jobs complete with the tokens decoded alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.gpu_engine import model_path
from helpers.reference import RefModel, greedy

pytestmark = pytest.mark.gpu
N_GEN = 10
PROMPTS = ([17, 402, 5, 311, 77], [260, 9, 600, 33], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])


@pytest.fixture(scope="module")
def setup(tmp_models):
    from strata.engine.cuda.batch import batch_options, load_batch
    from strata.gguf import open_model
    from strata.plan.options import PlanOptions

    path = model_path(tmp_models, "Q4_K_M")
    mf = open_model(path)
    eng = load_batch(mf, batch_options(mf, 3, PlanOptions(max_context=256, ring_mib=1),
                                       progress=False))
    return path, eng


def _alone(eng, prompt, n):
    """n greedy tokens of `prompt` with nothing else in the engine, and the first logits."""
    for s in range(eng.n_slots):
        eng.release(s)
    logits = eng.prefill(0, prompt)
    first, toks = logits, []
    for _ in range(n):
        toks.append(int(np.argmax(logits)))
        if len(toks) < n:
            logits = eng.decode([0], [toks[-1]])[0]
    eng.release(0)
    return toks, first


def test_batched_tokens_equal_alone_and_the_reference(setup):
    path, eng = setup
    alone = [_alone(eng, p, N_GEN) for p in PROMPTS]
    ref = RefModel.load(path)
    for p, (toks, first) in zip(PROMPTS, alone):
        want, want_first = greedy(ref, p, N_GEN)
        assert toks == want
        assert np.linalg.norm(first - want_first) / np.linalg.norm(want_first) < 0.02
    logits = [eng.prefill(s, p) for s, p in enumerate(PROMPTS)]
    toks: list[list[int]] = [[] for _ in PROMPTS]
    for _ in range(N_GEN):
        for s in range(3):
            toks[s].append(int(np.argmax(logits[s])))
        if len(toks[0]) < N_GEN:
            logits = list(eng.decode([2, 0, 1], [toks[2][-1], toks[0][-1], toks[1][-1]])[[1, 2, 0]])
    assert toks == [t for t, _ in alone]
    assert set(eng.step.graphs) >= {1, 3}  # graphs captured for one row and for three


def test_sequences_join_and_leave_between_steps(setup):
    _, eng = setup
    alone = [_alone(eng, p, N_GEN)[0] for p in PROMPTS]
    got: dict[int, list[int]] = {}
    last = {0: eng.prefill(0, PROMPTS[0])}
    got[0] = [int(np.argmax(last[0]))]
    for step in range(N_GEN - 1):
        if step == 2:  # slot 1 joins
            last[1] = eng.prefill(1, PROMPTS[1])
            got[1] = [int(np.argmax(last[1]))]
        if step == 3:  # slot 2 joins
            last[2] = eng.prefill(2, PROMPTS[2])
            got[2] = [int(np.argmax(last[2]))]
        if step == 5:  # slot 0 (row 0) leaves: slot 2's sequence moves into its row
            eng.release(0)
            del last[0]
        slots = sorted(last)
        rows = eng.decode(slots, [got[s][-1] for s in slots])
        for s, row in zip(slots, rows):
            last[s] = row
            got[s].append(int(np.argmax(row)))
    assert got[0] == alone[0][:len(got[0])]
    assert got[1] == alone[1][:len(got[1])]
    assert got[2] == alone[2][:len(got[2])]
    for s in list(last):
        eng.release(s)


def test_serve_worker_over_the_batched_engine(setup):
    from strata.bench.serve_batch import run_clients

    _, eng = setup
    alone = [_alone(eng, p, 6)[0] for p in PROMPTS]
    clients = run_clients(eng, list(PROMPTS), 6)
    assert [c.tokens for c in clients] == alone
