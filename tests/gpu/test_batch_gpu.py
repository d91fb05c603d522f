"""The batched CUDA engine (`strata serve --batch N`) on a real GPU:

    STRATA_TEST_GPU=1 python -m pytest -s tests/gpu/test_batch_gpu.py

* a batch-invariant engine (`--batch-invariant`): three sequences decoded together (CUDA
  graphs, the small-batch matvec and batched MoE kernels) give each one the greedy tokens it
  gets decoded alone, and the float64 reference's;
* the default engine: a step of one sequence is the single engine's (`CudaEngine`'s logits bit
  for bit, graph replays, from a prompt run as steps in both), steps of several the invariant
  engine's; its prompt path agrees with the single engine's to rounding;
* prompts of a few tokens run as decode steps of their own row give the prompt path's tokens;
* sequences join and leave between steps (a row freed below the last is refilled by a move of
  the last row's KV): the survivors' tokens do not change;
* the serve worker over the engine: concurrent jobs complete with the tokens decoded alone;
* a prompt stopped between its chunks (a cancelled request) leaves them for a retry, whose
  logits are the uninterrupted prompt's;
* a request's choices share their prompt (a row's K/V copied to another, the recorded logits
  returned), and decode the tokens each gets alone;
* tokens picked on the device (`decode_picked`) equal the host's argmax, alone and in a step
  mixed with a row left to the host, and NaN logits are flagged, not picked from;
* the tensor-core batch matvec (`batch_tc`) against float64 and the one-token kernel, batch
  invariant;
* the small-batch kernels on the device: each token's matvec (`lanes_batch`) and MoE
  (`batch_moe`'s lane kernels, gate_up grouped by expert) equal to the one-token kernels' to
  float32 rounding (bit for bit where the compiler fuses the same way), and the matvec within
  float32 rounding of gguf-py's dequantization.
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
                                       progress=False), invariant=True)
    return path, eng


@pytest.fixture(scope="module")
def fast(setup):
    """The default engine (`strata serve`): one sequence's steps run the single engine's."""
    from strata.engine.cuda.batch import batch_options, load_batch
    from strata.gguf import open_model
    from strata.plan.options import PlanOptions

    mf = open_model(setup[0])
    return load_batch(mf, batch_options(mf, 3, PlanOptions(max_context=256, ring_mib=1),
                                        progress=False))


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


def test_short_prompts_run_as_steps_of_their_rows(setup):
    """Prompts of up to `prompt_steps` tokens run as decode steps of their own row (graphs
    captured per row): the batch then decodes the tokens each prompt gets on the prompt path."""
    path, eng = setup
    want = [_alone(eng, p, N_GEN)[0] for p in PROMPTS]  # the prompt path (the suite's default)
    eng.prompt_steps = 6
    try:
        n0, chunks0 = eng.n_step_prompts, eng.traffic.n_chunks
        logits = [eng.prefill(s, p) for s, p in enumerate(PROMPTS)]  # rows 0, 1 as steps
        assert (eng.n_step_prompts - n0, eng.traffic.n_chunks - chunks0) == (2, 1)
        toks = [[int(np.argmax(x))] for x in logits]
        for _ in range(N_GEN - 1):
            out = eng.decode([0, 1, 2], [t[-1] for t in toks])
            for t, x in zip(toks, out):
                t.append(int(np.argmax(x)))
        assert toks == want
    finally:
        eng.prompt_steps = 0
        for s in range(eng.n_slots):
            eng.release(s)


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


def test_one_sequence_runs_the_single_engines_step(setup, fast):
    from helpers.gpu_engine import load

    path, same = setup
    assert fast.step.one is not None and same.step.one is None
    p = PROMPTS[0]
    # the prompt path: each engine's plan (its cache fill, loans, ring) picks how a chunk's
    # experts are computed, so the logits agree to rounding, not bit for bit (H200: 0.2%)
    _, single = load(path, max_context=256)
    want, got = single.prefill(p), fast.prefill(0, p)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
    fast.release(0)
    # the prompt as decode steps in both: from here on the two run the same step's kernels
    _, single = load(path, max_context=256, prompt_steps=len(p))
    fast.prompt_steps, n0 = len(p), fast.n_step_prompts
    try:
        want, got = single.prefill(p), fast.prefill(0, p)
    finally:
        fast.prompt_steps = 0
    assert (single.n_step_prompts, fast.n_step_prompts - n0) == (1, 1)
    np.testing.assert_array_equal(got, want)
    for _ in range(N_GEN):
        tok = int(np.argmax(want))
        want, got = single.decode_step(tok), fast.decode([0], [tok])[0]
        np.testing.assert_array_equal(got, want)
    assert 1 in fast.step.graphs  # the later steps were graph replays
    fast.release(0)
    # several sequences: the batched kernels, as the invariant engine's, bit for bit
    tok = {e: _start(e, PROMPTS) for e in (fast, same)}
    for _ in range(3):
        rows = {e: e.decode([0, 1, 2], tok[e]) for e in (fast, same)}
        np.testing.assert_array_equal(rows[fast], rows[same])
        tok = {e: [int(np.argmax(r)) for r in rows[e]] for e in (fast, same)}
    for e in (fast, same):
        for s in range(3):
            e.release(s)


def test_choices_share_their_prompt(setup):
    """A request's `n` choices: the second prompt equal to a running one's takes a device copy
    of its row's K/V and its recorded logits (bit for bit), a third sharing a prefix copies
    those positions and computes the rest; decoded together, each gets the greedy tokens it
    gets alone."""
    _, eng = setup
    prompt = [(37 * i + 11) % 600 + 1 for i in range(48)]  # past any prompt-steps limit
    branch = prompt[:20] + [5, 6]
    want = [_alone(eng, prompt, N_GEN), _alone(eng, branch, N_GEN)]
    first = eng.prefill(0, prompt)
    np.testing.assert_array_equal(eng.prefill(1, prompt), first)
    assert eng.n_reused == len(prompt)
    third = eng.prefill(2, branch)
    assert eng.n_reused == 20
    assert np.linalg.norm(third - want[1][1]) / np.linalg.norm(want[1][1]) < 1e-2
    logits = [first, first, third]
    toks: list[list[int]] = [[], [], []]
    for _ in range(N_GEN):
        for t, x in zip(toks, logits):
            t.append(int(np.argmax(x)))
        if len(toks[0]) < N_GEN:
            logits = list(eng.decode([0, 1, 2], [t[-1] for t in toks]))
    assert toks == [want[0][0], want[0][0], want[1][0]]
    for s in range(eng.n_slots):
        eng.release(s)


def test_a_prompt_stopped_between_chunks_keeps_them_for_a_retry(setup):
    """A cancelled request's prompt (`strata.engine.interrupt`) stops at a chunk boundary, the
    chunks it ran stay its row's: released with the prompt, a retry computes only past them
    and its logits are the uninterrupted prompt's (same chunk boundaries)."""
    from strata.engine.cuda.batch import batch_options, load_batch
    from strata.engine.interrupt import PrefillInterrupted, interruptible
    from strata.gguf import open_model
    from strata.plan.options import PlanOptions, PrefillRequest

    opts = PlanOptions(max_context=1024, ring_mib=1, prefill=PrefillRequest(False, 256))
    eng = load_batch(open_model(setup[0]), batch_options(open_model(setup[0]), 2, opts,
                                                          progress=False))
    prompt = [(29 * i + 7) % 600 + 1 for i in range(600)]  # chunks 256, 256, 88
    whole = eng.prefill(0, prompt)
    eng.release(0)
    stop_after = lambda: int(eng.rows.n_past[eng.rows.row_of[1]]) >= 256  # noqa: E731
    with interruptible(stop_after), pytest.raises(PrefillInterrupted):
        eng.prefill(1, prompt)
    eng.release(1, tokens=prompt)
    retry = eng.prefill(0, prompt)
    assert eng.n_reused == 256
    assert np.linalg.norm(retry - whole) / np.linalg.norm(whole) < 1e-3
    assert int(np.argmax(retry)) == int(np.argmax(whole))
    eng.release(0)


def _start(eng, prompts):
    for s in range(eng.n_slots):
        eng.release(s)
    return [int(np.argmax(eng.prefill(s, p))) for s, p in enumerate(prompts)]


def test_decode_picked_is_the_host_choice_mixed_and_flags_nan(setup):
    """`decode_picked` (serve's steps, CUDA graphs): greedy tokens picked on the device equal
    the argmax of `decode`'s logits step for step; a mixed step hands back one row's logits
    (the same argmax) beside the other's token; NaN logits (the output norm poisoned) give -1,
    and the flag is cleared for the next sequence."""
    from strata.engine.sampler import SamplingParams

    _, eng = setup
    greedy = SamplingParams(temperature=0.0)
    prompts = list(PROMPTS[:2])
    tok, want = _start(eng, prompts), []
    for _ in range(5):
        tok = [int(np.argmax(r)) for r in eng.decode([0, 1], tok)]
        want.append(tok)
    tok, got = _start(eng, prompts), []
    for i in range(5):
        if i == 2:
            out = eng.decode_picked([0, 1], tok, [None, greedy])
            assert isinstance(out[0], np.ndarray) and out[0].shape == (eng.shape.n_vocab,)
            tok = [int(np.argmax(out[0])), out[1]]
        else:
            tok = eng.decode_picked([0, 1], tok, [greedy, greedy])
        got.append(tok)
    assert got == want
    norm = eng.m.norms["output_norm"]
    saved = norm.copy_to_host()
    norm.copy_to_device(np.full(saved.shape, np.nan, np.float32))
    try:
        _start(eng, prompts[:1])
        assert eng.decode_picked([0], [5], [greedy]) == [-1]
    finally:
        norm.copy_to_device(saved)
    first = _start(eng, prompts[:1])
    assert eng.decode_picked([0], first, [greedy]) == [want[0][0]]
    eng.release(0)


@pytest.mark.parametrize("name,n_cols,n_rows", [("Q4_K", 2048, 96), ("Q4_K", 4096, 40),
                                                ("Q6_K", 2048, 70), ("Q6_K_P8", 2048, 70)])
def test_batch_matvec_on_the_device_equals_one_token(name, n_cols, n_rows):
    from numba import cuda

    from helpers.kernel_blocks import random_rows, reference, stored
    from strata.cuda_kernels.lanes_batch import matvec_batch
    from strata.cuda_kernels.matvec import matvec

    rng = np.random.default_rng(n_cols + n_rows)
    rows = random_rows(name, n_rows, n_cols, rng)
    w = cuda.to_device(stored(name, rows))
    ref = reference(name, rows, n_cols)
    for n in (2, 5, 8):   # 2048 columns: 2, 5 and 4 tokens a block; 4096: 2
        x = rng.standard_normal((n, n_cols)).astype(np.float32)
        y = cuda.to_device(np.full((n, n_rows), np.nan, np.float32))
        xd = cuda.to_device(x)
        matvec_batch(w, name, xd, y)
        got = y.copy_to_host()
        want = x.astype(np.float64) @ ref.T
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5, n
        for t in range(n):
            one = cuda.to_device(np.full(n_rows, np.nan, np.float32))
            matvec(w, name, xd[t], one, x8=False)  # float32 x, as the batch kernels (BatchStep)
            _same(got[t], one.copy_to_host(), f"matvec {name} {n_cols}->{n_rows} x{n} token {t}")


@pytest.mark.parametrize("name,n_cols,n_rows", [("Q4_K", 2048, 4096), ("Q4_K", 4096, 2048),
                                                ("Q6_K", 2048, 512), ("Q6_K", 2048, 20011),
                                                ("Q6_K_P8", 2048, 512), ("Q6_K_P8", 2048, 20011)])
def test_tc_matvec_on_the_device(name, n_cols, n_rows):
    """`batch_tc` at the 30B shapes: within float32 rounding of gguf-py's dequantization and of
    the one-token kernel, and batch invariant (token 0's row bit for bit at 2 and 8 tokens)."""
    from numba import cuda

    from helpers.kernel_blocks import random_rows, reference, stored
    from strata.cuda_kernels.batch_tc import matvec_tc
    from strata.cuda_kernels.matvec import matvec

    rng = np.random.default_rng(n_cols + n_rows)
    rows = random_rows(name, n_rows, n_cols, rng)
    w = cuda.to_device(stored(name, rows))
    ref = reference(name, rows, n_cols)
    x = rng.standard_normal((8, n_cols)).astype(np.float32)
    xd = cuda.to_device(x)
    got = {}
    for n in (2, 8):
        y = cuda.to_device(np.full((n, n_rows), np.nan, np.float32))
        matvec_tc(w, name, xd[:n], y)
        got[n] = y.copy_to_host()
    want = x.astype(np.float64) @ ref.T
    assert np.linalg.norm(got[8] - want) / np.linalg.norm(want) < 2e-6
    np.testing.assert_array_equal(got[2], got[8][:2])
    one = cuda.to_device(np.full(n_rows, np.nan, np.float32))
    matvec(w, name, xd[3], one, x8=False)  # float32 x, as the batch kernels (BatchStep)
    one = one.copy_to_host()
    assert np.linalg.norm(got[8][3] - one) / np.linalg.norm(one) < 2e-6


@pytest.mark.parametrize("tensor_cores", [False, True])
def test_batch_moe_on_the_device_equals_one_token(tensor_cores):
    """The lane kernels: each token's output the one-token kernel's to float32 rounding; the
    tensor-core kernels (`batch_moe_tc`): within 1e-5 of the one-token kernel's MoE sum."""
    from numba import cuda

    from helpers.kernel_blocks import random_rows
    from strata.cuda_kernels.batch_moe import batch_moe_decode
    from strata.cuda_kernels.moe import ExpertLayout, moe_decode

    rng = np.random.default_rng(3)
    layout = ExpertLayout(2048, 768, "Q4_K", "Q6_K")
    n_exp, n_tok, k = 6, 8, 4
    blob = np.zeros((n_exp, layout.expert_bytes), np.uint8)
    for e in range(n_exp):
        g, u = random_rows("Q4_K", 768, 2048, rng), random_rows("Q4_K", 768, 2048, rng)
        d = random_rows("Q6_K", 2048, 768, rng)
        blob[e, :g.size] = g.reshape(-1)
        blob[e, layout.up_off:layout.up_off + u.size] = u.reshape(-1)
        blob[e, layout.down_off:layout.down_off + d.size] = d.reshape(-1)
    slot_table = np.array([[0, -1, 1, -1, 2, 3]], np.int32)   # experts 1 and 3 missed
    slots = np.array([0, 2, 4, 5])
    store = dict(slot_table=cuda.to_device(slot_table),
                 cache=cuda.to_device(blob[slots].reshape(-1)),
                 slot_off=cuda.to_device(np.arange(4, dtype=np.int64) * layout.expert_bytes),
                 host=cuda.to_device(blob.reshape(-1)),
                 host_off=cuda.to_device((np.arange(n_exp, dtype=np.int64)
                                          * layout.expert_bytes).reshape(1, n_exp)))
    ids = np.stack([rng.choice(n_exp, k, replace=False) for _ in range(n_tok)]).astype(np.int32)
    wts = rng.uniform(0.1, 1, (n_tok, k)).astype(np.float32)
    x = (rng.standard_normal((n_tok, 2048)) * 0.05).astype(np.float32)
    out0 = rng.standard_normal((n_tok, 2048)).astype(np.float32)
    out = cuda.to_device(out0)
    counters = cuda.to_device(np.zeros((1, 2), np.int64))
    batch_moe_decode(cuda.to_device(x), cuda.to_device(ids), cuda.to_device(wts), layer=0,
                     layout=layout, **store, h=cuda.device_array((n_tok, k, 768), np.float32),
                     out=out, counters=counters, accumulate=True, tensor_cores=tensor_cores)
    got = out.copy_to_host()
    hits = int(np.isin(ids, [0, 2, 4, 5]).sum())
    assert counters.copy_to_host().tolist() == [[hits, n_tok * k - hits]]
    for t in range(n_tok):
        one = cuda.to_device(out0[t])
        moe_decode(cuda.to_device(x[t]), cuda.to_device(ids[t]), cuda.to_device(wts[t]),
                   layer=0, layout=layout, **store, h=cuda.device_array((k, 768), np.float32),
                   out=one, miss_list=cuda.device_array(k, np.int32),
                   counters=cuda.to_device(np.zeros((1, 2), np.int64)), accumulate=True,
                   x8=False)  # float32 x, as the batch kernels (BatchStep)
        want = one.copy_to_host()
        if tensor_cores:
            moe = want.astype(np.float64) - out0[t]
            err = np.linalg.norm(got[t] - want) / np.linalg.norm(moe)
            assert err < 1e-5, (t, err)
        else:
            _same(got[t], want, f"moe token {t}")


def _same(got, want, what):
    """The same steps in the same order: equal to float32 rounding (the compiler may fuse a
    multiply-add differently in the two kernels); prints whether the bits are equal too."""
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6 * float(np.abs(want).max()))
    if not np.array_equal(got, want):
        print(f"{what}: equal to rounding, not bit for bit")
