"""A chat's next turn on the CPU backend (`PerSlotEngines` over `CpuEngine`): a released
sequence's KV is kept, a later prompt that starts with its tokens is computed only past them
(in whichever slot the worker gives it), its logits are those of the whole prompt computed
afresh, and without tokens (or after a failure) nothing is kept."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.engine_models import PROMPT, model_path
from strata.bench import chat_turns
from strata.engine.cpu.engine import CpuEngine
from strata.engine.cpu.layers import CpuModel
from strata.engine.engine import ContextFullError
from strata.gguf import open_model
from strata.serve.batch import PerSlotEngines


@pytest.fixture(scope="module")
def model(tmp_models):
    return CpuModel(open_model(model_path(tmp_models, "Q4_K_M")))


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_a_next_turn_reuses_the_kv_in_any_free_slot(model):
    eng = PerSlotEngines(lambda: CpuEngine(model, max_context=64), 2)
    assert eng.keeps_prefix and eng.shape.n_vocab == 640
    first = eng.prefill(0, PROMPT)
    t1 = int(np.argmax(first))
    t2 = int(np.argmax(eng.decode([0], [t1])[0]))
    t3 = int(np.argmax(eng.decode([0], [t2])[0]))
    eng.release(0, tokens=PROMPT + [t1, t2, t3])  # t3 was sampled, never fed
    turn2 = PROMPT + [t1, t2, t3, 44, 45]
    got = eng.prefill(1, turn2)  # the worker hands it slot 1: slot 0's engine moves there
    assert eng.n_reused == len(PROMPT) + 2
    fresh = CpuEngine(model, max_context=64).prefill(turn2)
    assert _rel(got, fresh) < 1e-5
    assert eng.engines[1].n_past == len(turn2)
    # the same prompt again after a release without tokens: nothing kept
    eng.release(1)
    eng.prefill(0, turn2)
    assert eng.n_reused == 0
    # a prompt the kept tokens cover whole, not the one they were prefilled from, still
    # computes its last token (the KV alone does not give its logits)
    eng.release(0, tokens=turn2 + [7])
    again = eng.prefill(0, turn2[:-1])
    assert eng.n_reused == len(turn2) - 2
    assert _rel(again, CpuEngine(model, max_context=64).prefill(turn2[:-1])) < 1e-5
    # the prompt a kept sequence was prefilled from: nothing computed, its logits bit for bit
    eng.release(0, tokens=turn2[:-1] + [3, 4])
    np.testing.assert_array_equal(eng.prefill(1, turn2[:-1]), again)
    assert eng.n_reused == len(turn2) - 1 and eng.engines[1].n_past == len(turn2) - 1
    # fed tokens that do not start with the prompt keep no record of it
    eng.release(1, tokens=[1] * (len(turn2) - 1))
    eng.prefill(0, turn2[:-1])
    assert eng.n_reused == 0


def test_a_running_sequences_prompt_is_copied_not_computed_again(model):
    """A request's `n` choices: the second prompt equal to a running one's takes its K/V and
    logits (nothing computed, the same bits), and both decode as one sequence would; a prompt
    sharing only a prefix copies the prefix's K/V and computes the rest, as a fresh engine
    does. A running sequence lends its prompt's positions only, not its generated ones."""
    eng = PerSlotEngines(lambda: CpuEngine(model, max_context=64), 3)
    assert eng.copies_prefix
    first = eng.prefill(0, PROMPT)
    t1 = int(np.argmax(first))
    second = eng.prefill(1, PROMPT)
    assert eng.n_reused == len(PROMPT) and eng.engines[1].n_past == len(PROMPT)
    np.testing.assert_array_equal(second, first)
    second[0] = 1e9  # the caller's copy: the record is not
    np.testing.assert_array_equal(eng.prefill(2, PROMPT), first)
    eng.release(2)
    out = eng.decode([0, 1], [t1, t1])
    np.testing.assert_array_equal(out[0], out[1])
    alone = CpuEngine(model, max_context=64)
    alone.prefill(PROMPT)
    assert _rel(out[0], alone.decode_step(t1)) < 1e-6

    # slot 0 now holds PROMPT + t1: a prompt of PROMPT + t1 + more reuses the prompt only.
    # The logits are those of an engine fed the same pieces (the CPU engine's chunks of under
    # 8 tokens round activations as longer ones do not: ~0.2% against one whole prefill)
    def pieces(*parts):
        e = CpuEngine(model, max_context=64)
        return [e.prefill(p) for p in parts][-1]

    longer = PROMPT + [t1, 33, 34]
    got = eng.prefill(2, longer)
    assert eng.n_reused == len(PROMPT)
    assert _rel(got, pieces(PROMPT, longer[len(PROMPT):])) < 1e-6
    assert _rel(got, pieces(longer)) < 1e-2
    eng.release(2)
    branch = PROMPT[:4] + [500, 501]
    got = eng.prefill(2, branch)
    assert eng.n_reused == 4
    assert _rel(got, pieces(branch)) < 1e-2
    # the source's own sequence went on untouched
    assert _rel(eng.decode([0], [5])[0], alone.decode_step(5)) < 1e-6


def test_copy_prefix_refuses_what_the_source_lacks(model):
    a, b = CpuEngine(model, max_context=16), CpuEngine(model, max_context=4)
    a.prefill(PROMPT)
    with pytest.raises(ValueError, match="cannot copy 8 positions of a 7-position sequence"):
        b.copy_prefix(a, 8)
    with pytest.raises(ValueError, match="do not fit this engine's context of 4"):
        b.copy_prefix(a, 5)
    b.copy_prefix(a, 3)
    assert b.n_past == 3
    np.testing.assert_array_equal(b.kv.k[:, :3], a.kv.k[:, :3])


def test_a_failed_prefill_keeps_nothing(model):
    eng = PerSlotEngines(lambda: CpuEngine(model, max_context=16), 1)
    eng.prefill(0, PROMPT)
    eng.release(0, tokens=PROMPT)
    with pytest.raises(ContextFullError):
        eng.prefill(0, PROMPT + list(range(1, 11)))  # 17 tokens: past the context
    assert eng.engines[0].n_past == 0
    eng.prefill(0, PROMPT)
    assert eng.n_reused == 0


def test_rewind_refuses_positions_the_sequence_lacks(model):
    e = CpuEngine(model, max_context=16)
    e.prefill(PROMPT)
    with pytest.raises(ValueError, match="cannot keep 8 positions of a 7-position sequence"):
        e.rewind(8)
    e.rewind(3)
    assert e.n_past == 3


def test_serves_worker_reuses_a_turns_kv_on_the_cpu(model):
    """The chat bench's two runs through serve's worker: with reuse every turn after the first
    finds all of its history but the previous answer's last token, and the answers are the
    whole-prompt run's."""
    eng = PerSlotEngines(lambda: CpuEngine(model, max_context=128), 1)
    res = chat_turns.measure(eng, system=20, turns=3, user=6, answer=5, seed=2)
    rows = res["turns"]
    assert [r["prompt_tokens"] for r in rows] == [26, 37, 48]
    assert [r["cached_tokens"] for r in rows] == [0, 26 + 4, 37 + 4]
    assert [r["cached_tokens"] for r in res["whole"]] == [0, 0, 0]
    assert all(r["answer_tokens_equal_before_first_difference"] == 5 for r in rows)


def test_a_prompt_cancelled_between_chunks_leaves_them_for_a_retry(model):
    """A client that leaves during its long prompt and sends it again (an editor's retry after
    Esc): the worker stops the first at a chunk boundary, keeps the chunks it ran, and the
    retry computes only past them; its answer is the uninterrupted prompt's, token for token.
    A failure, unlike a cancel, still keeps nothing (`test_a_failed_prefill_keeps_nothing`)."""
    from strata.bench.serve_batch import _Client, _Greedy
    from strata.serve.job import Job, Sampling
    from strata.serve.metrics import Metrics
    from strata.serve.worker import Worker

    prompt = PROMPT * 3  # 21 tokens: 7 chunks of 3
    doomed: list[Job] = []

    class CancelsAfterSix(CpuEngine):  # the client leaves once 6 positions are in
        def _run(self, ids):
            out = super()._run(ids)
            if doomed and self.n_past >= 6:
                doomed.pop().cancel()
            return out

    def answer(eng_factory, n_slots, cancel_first):
        metrics = Metrics()
        worker = Worker(PerSlotEngines(eng_factory, n_slots), _Greedy(True), metrics)
        worker.start()
        clients = []
        try:
            for i in range(2 if cancel_first else 1):
                c = _Client(prompt)
                j = Job(prompt, Sampling(max_tokens=4, temperature=0.0), c.sink)
                if cancel_first and i == 0:
                    doomed.append(j)
                worker.submit(j)
                assert c.done.wait(60)
                clients.append(c)
        finally:
            worker.stop()
        return clients, metrics

    factory = lambda: CancelsAfterSix(model, max_context=64, prefill_chunk=3)  # noqa: E731
    (first, retry), metrics = answer(factory, 2, True)
    assert first.reason == "cancelled" and first.tokens == []
    assert metrics.cancelled == {"prefill": 1}
    assert retry.reason == "length" and retry.n_cached == 6
    (whole,), _ = answer(lambda: CpuEngine(model, max_context=64, prefill_chunk=3), 1, False)
    assert whole.n_cached == 0 and retry.tokens == whole.tokens and len(whole.tokens) == 4
