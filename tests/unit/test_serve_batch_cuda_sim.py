"""The batched CUDA engine (`strata serve --batch N` on the GPU) under numba's CUDA simulator, on
a one-layer model: two sequences decoded in one step get the logits and greedy tokens they get
decoded alone, and both match the float64 reference forward; the logits a step returns are the
caller's (the next step does not overwrite them).

Slow (the simulator runs each CUDA thread as a Python thread): the model is the smallest the
synthesizer writes and every sequence is a few tokens; tests/gpu/test_batch_gpu.py covers the
real sizes, the CUDA graphs, and sequences joining and leaving (rows refilled by KV moves).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.reference import RefModel, forward
from strata.synth import PRESETS, write_model

pytestmark = pytest.mark.slow
MICRO = dataclasses.replace(
    PRESETS["tiny"], name="micro-batch", n_layer=1, n_embd=128, n_head=2, n_head_kv=1,
    head_dim=64, n_expert=4, n_expert_used=2, n_ff_expert=32, n_vocab=512, n_ctx_train=512)
PROMPTS = {0: [5, 77], 1: [300, 9, 41]}


def _micro_engine(tmp_models):
    """(the micro model's path, a 2-slot batch engine over it, 256 tokens each, no graphs)."""
    from strata.engine.cuda.batch import batch_options, load_batch
    from strata.gguf import open_model
    from strata.memory.numba_backend import NumbaBackend
    from strata.plan.options import PlanOptions

    path = tmp_models / "micro-batch-Q8_0.gguf"
    if not path.is_file():
        write_model(path, MICRO, mix="Q8_0", seed=3, progress=False)
    mf = open_model(path)
    card = NumbaBackend(0, memory_info=lambda: (1 << 30, 1 << 30))  # the simulator has no size
    return path, load_batch(mf, batch_options(mf, 2, PlanOptions(max_context=256), graph=False,
                                              progress=False), backend=card)


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_batched_decode_matches_alone_and_the_reference(tmp_models):
    from strata.engine.engine import ContextFullError

    path, eng = _micro_engine(tmp_models)
    assert (eng.n_slots, eng.max_context) == (2, 256)
    kv = eng.m.plan.kv  # one 256-token KV region per sequence
    assert (kv.resident_tokens, kv.n_seq) == (256, 2)
    assert eng.m.kv_layout.n_ctx == 512 and eng.sides[1][0][0].layout.n_ctx == 256
    ref = RefModel.load(path)

    first = {s: eng.prefill(s, p) for s, p in PROMPTS.items()}
    tok = {s: int(np.argmax(first[s])) for s in PROMPTS}
    together = eng.decode([1, 0], [tok[1], tok[0]])  # rows in the order of the slots given
    assert together.shape == (2, MICRO.n_vocab)
    kept = together.copy()
    for s in PROMPTS:
        want = forward(ref, PROMPTS[s] + [tok[s]])
        assert _rel(first[s], want[-2]) < 0.02 and _rel(together[1 - s], want[-1]) < 0.02

    # slot 0 leaves: a step must name exactly the sequences still held
    eng.release(0)
    assert eng.n_active == 1
    with pytest.raises(ValueError, match="every held sequence"):
        eng.decode([0], [1])
    with pytest.raises(ContextFullError, match="context holds 256"):
        eng.prefill(0, [1] * 257)

    # slot 1's sequence again, alone: the logits and greedy token it had in the batch
    eng.release(1)
    assert eng.n_active == 0
    np.testing.assert_allclose(eng.prefill(1, PROMPTS[1]), first[1], rtol=1e-5, atol=1e-5)
    alone = eng.decode([1], [tok[1]])[0]
    np.testing.assert_array_equal(together, kept)  # a later step left them alone
    np.testing.assert_allclose(alone, together[0], rtol=1e-4, atol=1e-4)
    assert int(np.argmax(alone)) == int(np.argmax(together[0]))

    # rows in order are returned as a copy too: the next step's logits land elsewhere
    kept = alone.copy()
    later = eng.decode([1], [int(np.argmax(alone))])[0]
    np.testing.assert_array_equal(alone, kept)
    assert not np.allclose(later, alone, rtol=1e-3, atol=1e-3)
    want = forward(ref, PROMPTS[1] + [tok[1], int(np.argmax(alone))])[-1]
    assert _rel(later, want) < 0.02


def test_decode_picked_chooses_what_the_host_would(tmp_models):
    """`decode_picked` (serve's step where the device draws a sequence's settings): one sequence
    greedy, one drawing over every token with a seed; each token is what the host's choice
    gives on the logits `decode` returns for the same step (greedy: the argmax; sampled: the
    device sampler's float64 mirror). The next step mixed: one sequence's logits handed back
    for the caller to choose from, the other's token picked."""
    from helpers.sampling_ref import ref_past, ref_sample
    from strata.engine.sampler import Sampler, SamplingParams

    _, eng = _micro_engine(tmp_models)
    greedy = SamplingParams(temperature=0.0)
    drawn = SamplingParams(temperature=1.3, top_k=0, top_p=1.0, min_p=0.0, seed=2024)
    assert eng.picks(greedy) and eng.picks(drawn)
    assert not eng.picks(SamplingParams(temperature=1.0, top_k=300))  # past the 256 best

    def start():
        first = {s: eng.prefill(s, p) for s, p in PROMPTS.items()}
        return {s: int(np.argmax(first[s])) for s in PROMPTS}

    tok = start()
    logits = eng.decode([0, 1], [tok[0], tok[1]])
    want = [int(np.argmax(logits[0])),
            ref_sample(logits[1], np.array(PROMPTS[1] + [tok[1]]), temperature=1.3, top_k=0,
                       top_p=1.0, min_p=0.0, repeat_penalty=1.0, penalty_last_n=64,
                       seed=2024)]
    follow = eng.decode([0, 1], want)  # the next step's logits after those tokens
    eng.release(0)
    eng.release(1)
    assert start() == tok
    got = eng.decode_picked([0, 1], [tok[0], tok[1]], [greedy, drawn])
    assert got == want
    # the next step mixed: slot 0's logits for the caller to choose from, slot 1 greedy
    mixed = eng.decode_picked([0, 1], got, [None, greedy])
    np.testing.assert_allclose(mixed[0], follow[0], rtol=1e-4, atol=1e-4)
    assert mixed[1] == int(np.argmax(follow[1]))
    with pytest.raises(ValueError, match="needs a seed"):
        eng.decode_picked([0, 1], got, [greedy, SamplingParams(temperature=1.0, top_k=40)])
    with pytest.raises(ValueError, match="does not draw"):
        eng.decode_picked([0, 1], got, [greedy, SamplingParams(temperature=1.0, top_k=300,
                                                               seed=1)])

    # a top-p cut over every token (top-k 0): drawn on the device where the cut falls among its
    # 256 best (a cold temperature), else (a hot one: past them) that row's logits come back
    cold = SamplingParams(temperature=0.05, top_k=0, top_p=0.9, min_p=0.0, seed=5)
    hot = SamplingParams(temperature=50.0, top_k=0, top_p=0.9, min_p=0.0, seed=5)
    assert eng.picks(cold) and eng.may_fall_back(hot) and not eng.may_fall_back(greedy)
    eng.release(0)
    eng.release(1)
    tok = start()
    logits = eng.decode([0, 1], [tok[0], tok[1]])
    cut = dict(top_k=0, top_p=0.9, min_p=0.0, repeat_penalty=1.0, penalty_last_n=64, seed=5)
    hist = [np.array(PROMPTS[s] + [tok[s]]) for s in (0, 1)]
    assert not ref_past(logits[0], hist[0], temperature=0.05, **cut)
    assert ref_past(logits[1], hist[1], temperature=50.0, **cut)
    want = ref_sample(logits[0], hist[0], temperature=0.05, **cut)
    eng.release(0)
    eng.release(1)
    assert start() == tok
    got = eng.decode_picked([0, 1], [tok[0], tok[1]], [cold, hot])
    assert got[0] == want and isinstance(got[1], np.ndarray)
    np.testing.assert_allclose(got[1], logits[1], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="cannot hold a top-p"):
        eng.begin_picked([0, 1], None, [cold, hot])
    # the flag is cleared: the next step picks as before
    assert all(isinstance(x, int) for x in eng.decode_picked([0, 1], [want, 3], [greedy, greedy]))

    # penalties, greedy: the device's window is the row's history, prompt included, as the host
    # sampler's once the prompt is accepted (a large negative frequency penalty makes the window's
    # most frequent token win, so the penalty, not the logits, decides)
    eng.release(0)
    eng.release(1)
    tok = start()
    logits = eng.decode([0, 1], [tok[0], tok[1]])
    pen = [SamplingParams(temperature=0.0, frequency_penalty=-40.0, presence_penalty=1.0),
           SamplingParams(temperature=0.0, repeat_penalty=1.5, presence_penalty=3.0)]
    want = []
    for s, p in enumerate(pen):
        host = Sampler(p)
        host.accept(PROMPTS[s] + [tok[s]])
        want.append(host(logits[s]))
    assert want[0] != int(np.argmax(logits[0]))
    eng.release(0)
    eng.release(1)
    assert start() == tok
    assert eng.decode_picked([0, 1], [tok[0], tok[1]], pen) == want

    # a logit bias, in the rows' device tables: greedy, the host `Sampler`'s token (the leader
    # banned); drawn over every token, the mirror's over the host's biased logits
    from strata.engine.sampler import apply_logit_bias
    eng.release(0)
    eng.release(1)
    tok = start()
    logits = eng.decode([0, 1], [tok[0], tok[1]])
    ban = int(np.argmax(logits[0]))
    biased = [SamplingParams(temperature=0.0, logit_bias=((ban, -100.0), (7, 0.5))),
              SamplingParams(temperature=1.3, top_k=0, top_p=1.0, min_p=0.0, seed=77,
                             logit_bias=((int(np.argmax(logits[1])), -30.0), (2, 9.0)))]
    assert all(eng.picks(p) for p in biased)
    want = [Sampler(biased[0])(logits[0]),
            ref_sample(apply_logit_bias(logits[1], biased[1].logit_bias),
                       np.array(PROMPTS[1] + [tok[1]]), temperature=1.3, top_k=0, top_p=1.0,
                       min_p=0.0, repeat_penalty=1.0, penalty_last_n=64, seed=77)]
    assert want[0] != ban
    eng.release(0)
    eng.release(1)
    assert start() == tok
    assert eng.decode_picked([0, 1], [tok[0], tok[1]], biased) == want


def test_one_row_runs_the_single_engines_step(tmp_models):
    """A step of one row runs `DecodeStep` on row 0 (the single engine's fused launches): its
    logits are the single `CudaEngine`'s bit for bit. A batch-invariant engine's one-row step
    runs the batched kernels' float32 path instead, whose logits differ by the 8-bit rounding.
    A sequence that shares steps, then goes on alone, keeps the reference's greedy tokens."""
    from strata.engine.cuda.batch import batch_options, load_batch
    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.cuda.model import CudaModel
    from strata.engine.cuda.options import CudaOptions
    from strata.gguf import open_model
    from strata.memory.numba_backend import NumbaBackend
    from strata.plan.options import PlanOptions

    path = tmp_models / "micro-batch-Q8_0.gguf"
    if not path.is_file():
        write_model(path, MICRO, mix="Q8_0", seed=3, progress=False)
    mf = open_model(path)
    card = NumbaBackend(0, memory_info=lambda: (1 << 30, 1 << 30))
    plan = PlanOptions(max_context=256)
    fast = load_batch(mf, batch_options(mf, 2, plan, graph=False, progress=False), backend=card)
    same = load_batch(mf, batch_options(mf, 2, plan, graph=False, progress=False), backend=card,
                      invariant=True)
    assert fast.step.one is not None and same.step.one is None
    single = CudaEngine(CudaModel(mf, CudaOptions(plan=plan, graph=False, progress=False),
                                  backend=card), use_graph=False)
    p = PROMPTS[1]
    tok = int(np.argmax(single.prefill(p)))
    want = single.decode_step(tok)
    assert int(np.argmax(fast.prefill(0, p))) == tok == int(np.argmax(same.prefill(0, p)))
    np.testing.assert_array_equal(fast.decode([0], [tok])[0], want)
    other = same.decode([0], [tok])[0]
    assert not np.array_equal(other, want) and _rel(other, want) < 0.02

    # joined by a second sequence (a batched step), then alone again (the fused step): the
    # KV rows the batched step wrote are read by the single engine's launches
    ref = RefModel.load(path)
    seq = p + [tok, int(np.argmax(want))]
    first0 = fast.prefill(1, PROMPTS[0])
    both = fast.decode([0, 1], [seq[-1], int(np.argmax(first0))])
    seq.append(int(np.argmax(both[0])))
    fast.release(1)
    alone = fast.decode([0], [seq[-1]])[0]
    full = forward(ref, seq)
    assert _rel(both[0], full[-2]) < 0.02 and _rel(alone, full[-1]) < 0.02
    assert int(np.argmax(alone)) == int(np.argmax(full[-1]))
    # switched on a loaded engine (serve_batch --compare): the one-row graphs are captured again
    fast.step.graphs.update({1: "stale", ("pick", 1): "stale", 2: "kept"})
    fast.step._warm.update({1, ("pick", 1), 2})
    fast.set_invariant(True)
    assert fast.step.one is None and fast.invariant
    assert set(fast.step.graphs) == {2} and fast.step._warm == {2}
    fast.set_invariant(False)
    assert fast.step.one is not None and not fast.invariant


def test_a_step_fed_on_the_device_is_the_step_fed_from_the_host(tmp_models):
    """`begin_picked` without tokens (serve's step run ahead) feeds the tokens the step before
    picked, from the device: the same tokens as feeding them from the host; it is refused
    after a release or after a step whose logits went to the host, and steps end in order."""
    from strata.engine.sampler import SamplingParams

    path, eng = _micro_engine(tmp_models)
    g = [SamplingParams(temperature=0.0)] * 2
    drawn = SamplingParams(temperature=1.3, top_k=0, top_p=1.0, min_p=0.0, seed=7)

    def start():
        return [int(np.argmax(eng.prefill(s, PROMPTS[s]))) for s in (0, 1)]

    tok = start()
    one = eng.decode_picked([0, 1], tok, [g[0], drawn])
    two = eng.decode_picked([0, 1], one, [g[0], drawn])
    for s in (0, 1):
        eng.release(s)
    assert start() == tok
    first = eng.begin_picked([0, 1], tok, [g[0], drawn])
    ahead = eng.begin_picked([0, 1], None, [g[0], drawn])
    with pytest.raises(RuntimeError, match="end the older"):
        eng.begin_picked([0, 1], None, g)
    with pytest.raises(RuntimeError, match="in the order they were begun"):
        eng.end_picked(ahead)
    assert eng.end_picked(first) == one and eng.end_picked(ahead) == two
    mixed = eng.begin_picked([0, 1], two, [None, g[1]])  # slot 0's logits go to the host
    eng.end_picked(mixed)
    with pytest.raises(ValueError, match="fed on the device follows"):
        eng.begin_picked([0, 1], None, g)
    eng.release(1)
    with pytest.raises(ValueError, match="fed on the device follows"):
        eng.begin_picked([0], None, g[:1])

    # a finished sequence's KV reused by the next prompt that starts the same (a chat's next
    # turn): only the rest is computed, and the logits are the float64 reference's
    fed = PROMPTS[0] + [tok[0], one[0], two[0]]  # what slot 0 fed: its prompt and 3 steps
    eng.release(0, tokens=fed + [999])  # one more than its KV holds: ignored
    turn = fed + [42, 7]
    got = eng.prefill(1, turn)
    assert eng.n_reused == len(fed)
    want = forward(RefModel.load(path), turn)[-1]
    assert _rel(got, want) < 0.02
    eng.release(1)  # no tokens: nothing kept
    eng.prefill(0, turn)
    assert eng.n_reused == 0


def test_a_running_sequences_prompt_is_copied_not_computed_again(tmp_models):
    """A request's `n` choices: a prompt equal to a running sequence's takes a copy of its
    row's K/V and its recorded logits (nothing computed, the same bits) and both decode alike;
    a prompt sharing a prefix copies those positions and computes the rest (the float64
    reference's logits); a finished sequence's own prompt is taken whole from its kept row."""
    path, eng = _micro_engine(tmp_models)
    ref = RefModel.load(path)
    prompt = PROMPTS[1]
    first = eng.prefill(0, prompt)
    second = eng.prefill(1, prompt)
    assert eng.n_reused == len(prompt)
    np.testing.assert_array_equal(second, first)
    tok = int(np.argmax(first))
    out = eng.decode([0, 1], [tok, tok])
    np.testing.assert_allclose(out[1], out[0], rtol=1e-6, atol=1e-6)
    assert _rel(out[0], forward(ref, prompt + [tok])[-1]) < 0.02

    eng.release(1)
    branch = prompt[:1] + [200, 201]
    got = eng.prefill(1, branch)
    assert eng.n_reused == 1
    assert _rel(got, forward(ref, branch)[-1]) < 0.02

    eng.release(0, tokens=prompt + [tok])  # a hole below slot 1's row, its prompt recorded
    again = eng.prefill(0, prompt)
    assert eng.n_reused == len(prompt)
    np.testing.assert_array_equal(again, first)
    nxt = eng.decode([0, 1], [tok, int(np.argmax(got))])
    np.testing.assert_allclose(nxt[0], out[0], rtol=1e-4, atol=1e-4)
