"""On-device argmax and sampling against a float64 numpy mirror of the same rules (simulator)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from helpers.sampling_ref import ref_sample as _ref_sample
from helpers.sampling_ref import ref_support
from strata.cuda_kernels.sampling import (KMAX, MAX_BIAS, argmax, argmax_blocks, bias_table,
                                          make_params, sample, uniform, uniform01)
from strata.plan.pick import pick_blocks, pick_cand_len


def _keyed_argmax(logits):
    """numpy's argmax with NaN ranked as -inf (first of the largest)."""
    return int(np.argmax(np.where(np.isnan(logits), -np.inf, logits)))


def test_argmax_appends_to_the_history():
    logits = np.array([1.0, 5.0, -2.0, 5.0, 4.0], np.float32)
    tokens = np.full(4, -1, np.int32)
    n = np.array([2], np.int32)
    state = np.zeros(2, np.uint64)
    argmax(logits, tokens, n, state)
    assert n[0] == 3 and tokens[2] == 1  # ties go to the lower id
    assert state.tolist() == [0, 0]  # left at zero for the next launch (a replayed graph)
    n[0] = 4  # a full history is left alone
    argmax(logits, tokens, n, state)
    assert n[0] == 4 and tokens.tolist() == [-1, -1, 1, -1] and state.tolist() == [0, 0]


def test_argmax_over_many_blocks():
    """Several blocks (the simulator's 256 logits a block), the best in different blocks,
    ties across blocks, NaN, -inf everywhere, and the state back at zero after each launch."""
    rng = np.random.default_rng(7)
    n_vocab = 1000
    assert argmax_blocks(n_vocab) >= 4
    cases = []
    for where in (0, 255, 256, 511, 999):  # first, block edges, last
        lg = rng.standard_normal(n_vocab).astype(np.float32)
        lg[where] = 9.0
        cases.append(lg)
    tied = rng.standard_normal(n_vocab).astype(np.float32)
    tied[[700, 300, 900]] = 7.5  # the same best in three blocks: the lowest id
    cases.append(tied)
    nan = rng.standard_normal(n_vocab).astype(np.float32)
    nan[[3, 600]] = np.nan  # NaN ranks as -inf
    cases.append(nan)
    negative = -np.abs(rng.standard_normal(n_vocab)).astype(np.float32) - 1.0
    cases.append(negative)
    cases.append(np.full(n_vocab, -np.inf, np.float32))  # the lowest id of the all-equal
    tokens = np.full(len(cases) + 1, -1, np.int32)
    n = np.array([0], np.int32)
    state = np.zeros(2, np.uint64)
    for c, lg in enumerate(cases):
        argmax(lg, tokens, n, state)
        assert n[0] == c + 1 and tokens[c] == _keyed_argmax(lg), c
        assert state.tolist() == [0, 0], c
    assert tokens[-2] == 0 and tokens[3] == 511


def test_argmax_checks_its_arguments():
    logits = np.ones(10, np.float32)
    tokens, n = np.zeros(4, np.int32), np.zeros(1, np.int32)
    with pytest.raises(ValueError, match="state"):
        argmax(logits, tokens, n, np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="state: 4 entries"):
        argmax(logits, tokens, n, np.zeros(4, np.uint64))
    with pytest.raises(ValueError, match="logits"):
        argmax(logits.astype(np.float64), tokens, n, np.zeros(2, np.uint64))


NO_BIAS = bias_table((), 1)  # (ids, values): a table with no entry in use


def _sample(logits, tokens, n, f, i, bias=NO_BIAS):
    """`sample` with fresh scratch, checking the launch leaves its state at zero and the
    logits as they were."""
    state = np.zeros(2, np.uint64)
    cand_v = np.full(pick_cand_len(logits.size), np.nan, np.float32)
    cand_i = np.full(pick_blocks(logits.size) * KMAX, -7, np.int32)
    before = logits.copy()
    sample(logits, tokens, n, f, i, state, cand_v, cand_i, *bias)
    assert state.tolist() == [0, 0]
    np.testing.assert_array_equal(logits, before)


@pytest.mark.parametrize("n_vocab", [1000, 9000])  # one block; three, the last part-full
@pytest.mark.parametrize("params", [
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0),
    dict(temperature=1.0, top_k=300, top_p=0.5, min_p=0.0, repeat_penalty=1.3),
    dict(temperature=0.0, top_k=40, top_p=1.0, min_p=0.0, repeat_penalty=5.0),
])
def test_sample_matches_the_reference_over_steps(params, n_vocab):
    rng = np.random.default_rng(hash(tuple(params.items())) % 2**32 + n_vocab)
    full = dict(repeat_penalty=1.0, penalty_last_n=64, seed=1234567891234) | params
    f, i = make_params(**full)
    tokens = np.full(16, -1, np.int32)
    tokens[:3] = rng.integers(0, n_vocab, 3)
    n = np.array([3], np.int32)
    for _ in range(3):
        logits = (rng.standard_normal(n_vocab) * 2.5).astype(np.float32)
        logits[tokens[n[0] - 1]] += 6  # give the penalty something to bite on
        want = _ref_sample(logits, tokens[:n[0]].copy(), **full)
        _sample(logits, tokens, n, f, i)
        assert tokens[n[0] - 1] == want


@pytest.mark.parametrize("params", [
    dict(temperature=0.0, top_k=40, top_p=1.0, min_p=0.0, frequency_penalty=1.5),
    dict(temperature=0.0, top_k=40, top_p=1.0, min_p=0.0, presence_penalty=2.0,
         repeat_penalty=1.25),
    dict(temperature=0.9, top_k=20, top_p=0.95, min_p=0.0, presence_penalty=0.75,
         frequency_penalty=0.5),
    dict(temperature=1.2, top_k=0, top_p=1.0, min_p=0.0, frequency_penalty=-0.5),
    dict(temperature=0.6, top_k=0, top_p=0.9, min_p=0.0, presence_penalty=1.0),
])
def test_presence_and_frequency_penalties_match_the_reference(params):
    """The window's tokens lose presence once and frequency per occurrence (a token three times
    in the window, one twice, one once; one repeat only outside the window), after the repeat
    penalty: the device's token is the reference's, greedy and drawn, over several blocks."""
    rng = np.random.default_rng(int(params["temperature"] * 10) + 3)
    n_vocab = 9000
    full = dict(repeat_penalty=1.0, penalty_last_n=6, seed=4242) | params
    f, i = make_params(**full)
    tokens = np.full(16, -1, np.int32)
    hist = [8100, 17, 4500, 17, 4500, 17, 8100]  # window (last 6): 17 x3, 4500 x2, 8100 x1
    tokens[:len(hist)] = hist
    n = np.array([len(hist)], np.int32)
    for step in range(3):
        logits = (rng.standard_normal(n_vocab) * 0.5).astype(np.float32)
        logits[[17, 4500, 8100]] += np.float32(3.0)  # lead before the penalties
        logits[8100] -= np.float32(0.5 * step)
        want = _ref_sample(logits, tokens[:n[0]].copy(), **full)
        _sample(logits, tokens, n, f, i)
        assert tokens[n[0] - 1] == want, step


def test_penalties_move_the_greedy_choice():
    """Greedy: frequency counts occurrences (the token seen three times falls behind the one
    seen once), presence does not (the same two, each once penalised, keep their order)."""
    logits = np.zeros(300, np.float32)
    logits[[5, 6, 7]] = [3.0, 2.5, 1.0]
    hist = [5, 5, 5, 6]
    for kw, best in ((dict(frequency_penalty=0.5), 6),   # 5: 3.0 - 1.5; 6: 2.5 - 0.5
                     (dict(presence_penalty=1.0), 5),    # 5: 2.0; 6: 1.5
                     (dict(presence_penalty=2.0, frequency_penalty=0.1), 7)):  # 5: 0.7, 6: 0.4
        f, i = make_params(temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, seed=1, **kw)
        tokens = np.full(8, -1, np.int32)
        tokens[:4] = hist
        n = np.array([4], np.int32)
        _sample(logits, tokens, n, f, i)
        assert tokens[4] == best, kw


def test_sample_merges_the_blocks_candidates():
    """Every one of the k largest in one block, or one in each; a penalised token in each
    block; the draw matches the reference each time."""
    rng = np.random.default_rng(11)
    n_vocab = 12000
    assert pick_blocks(n_vocab) == 3
    full = dict(temperature=2.0, top_k=8, top_p=1.0, min_p=0.0, repeat_penalty=1.5,
                penalty_last_n=64, seed=77)
    f, i = make_params(**full)
    tokens = np.full(8, -1, np.int32)
    tokens[:3] = [5, 5000, 11990]  # one in each block
    n = np.array([3], np.int32)
    for case in range(3):
        logits = rng.standard_normal(n_vocab).astype(np.float32)
        if case == 0:
            logits[8200:8208] += 8.0  # all eight in the last block
        elif case == 1:
            logits[[7, 4100, 8300]] += 8.0  # the head of the list spread over the blocks
            logits[[9, 4200]] = np.nan  # ranked as -inf
        else:
            logits[tokens[:3]] += 9.0  # the penalised tokens lead before the penalty
        want = _ref_sample(logits, tokens[:n[0]].copy(), **full)
        _sample(logits, tokens, n, f, i)
        assert tokens[n[0] - 1] == want, case


def test_sample_merges_in_several_rounds():
    """More blocks (18) than one merge holds at k = 256 (16 lists of 256): list 0 carries the
    best so far from one round to the next."""
    rng = np.random.default_rng(12)
    n_vocab = 17 * 4096 + 5
    full = dict(temperature=0.7, top_k=0, top_p=0.9, min_p=0.0, repeat_penalty=1.0,
                penalty_last_n=0, seed=5)
    f, i = make_params(**full)
    tokens = np.zeros(4, np.int32)
    n = np.array([0], np.int32)
    for case in range(2):
        logits = (rng.standard_normal(n_vocab) * 2).astype(np.float32)
        logits[n_vocab - 3] += 6.0 * case  # the best in the last block, alone
        want = _ref_sample(logits, tokens[:n[0]].copy(), **full)
        _sample(logits, tokens, n, f, i)
        assert tokens[n[0] - 1] == want, case


def test_sample_with_tied_logits_keeps_the_lower_ids():
    """Ties at the k-th value, within and across blocks: the k candidates are the lowest ids of
    the tied (a stable order, as the reference's), so the draw is the reference's exactly."""
    rng = np.random.default_rng(9)
    logits = rng.integers(0, 6, 9000).astype(np.float32)  # ~1,500 at the top value, 5
    full = dict(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                penalty_last_n=0)
    tokens = np.zeros(8, np.int32)
    n = np.array([0], np.int32)
    for seed in (3, 4, 5):
        f, i = make_params(**full, seed=seed)
        want = _ref_sample(logits, tokens[:n[0]].copy(), **full, seed=seed)
        _sample(logits, tokens, n, f, i)
        assert tokens[n[0] - 1] == want and logits[want] == 5.0


def test_sample_checks_its_scratch():
    logits = np.ones(5000, np.float32)
    tokens, n = np.zeros(4, np.int32), np.zeros(1, np.int32)
    f, i = make_params(temperature=1.0)
    state = np.zeros(2, np.uint64)
    short = np.zeros(2 * KMAX + 3, np.float32)  # two blocks' lists, not their masses
    with pytest.raises(ValueError, match="cand_v and cand_i need 516 and 512"):
        sample(logits, tokens, n, f, i, state, short, np.zeros(2 * KMAX, np.int32), *NO_BIAS)
    with pytest.raises(ValueError, match="state"):
        sample(logits, tokens, n, f, i, np.zeros(2, np.int32), np.zeros(2 * KMAX, np.float32),
               np.zeros(2 * KMAX, np.int32), *NO_BIAS)
    with pytest.raises(ValueError, match="bias_ids: shape"):
        sample(logits, tokens, n, f, i, state, np.zeros(2 * KMAX + 4, np.float32),
               np.zeros(2 * KMAX, np.int32), NO_BIAS[0][:10], NO_BIAS[1])


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
@pytest.mark.parametrize("cuts", [dict(top_k=40, top_p=0.95, min_p=0.05),
                                  dict(top_k=256, top_p=0.5, min_p=0.0),
                                  dict(top_k=7, top_p=1.0, min_p=0.2)])
def test_the_device_draws_from_the_host_samplers_distribution(temperature, cuts):
    """The device sampler's mirror (which the kernel matches token for token above) keeps the
    candidates and weights of the host's `Sampler` (`filtered_support`): the two backends
    sample the same distribution, with their own random numbers."""
    from strata.engine.sampler import SamplingParams, filtered_support
    rng = np.random.default_rng(int(temperature * 10) + cuts["top_k"])
    lg = (rng.standard_normal(5000) * 2).astype(np.float32)
    host_ids, host_p = filtered_support(lg, SamplingParams(temperature=temperature, **cuts))
    ids, w = ref_support(lg.astype(np.float64), temperature=temperature, **cuts)
    order = np.argsort(ids)
    np.testing.assert_array_equal(ids[order], host_ids)
    np.testing.assert_allclose((w / w.sum())[order], host_p, rtol=1e-9)


def test_seed_changes_the_draw_and_params_are_checked():
    draws = {uniform(s, 7) for s in range(50)}
    assert len(draws) == 50 and all(0.0 <= d < 1.0 for d in draws)
    with pytest.raises(ValueError, match="top_p"):
        make_params(temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="repeat_penalty"):
        make_params(temperature=1.0, repeat_penalty=0.0)
    with pytest.raises(ValueError, match="frequency_penalty"):
        make_params(temperature=1.0, frequency_penalty=float("nan"))
    with pytest.raises(ValueError, match="n_bias must be in"):
        make_params(temperature=1.0, n_bias=MAX_BIAS + 1)


def test_the_bias_table_is_checked():
    ids, vals = bias_table(((7, -1.5), (2, 100.0)), 10)
    assert ids.shape == vals.shape == (MAX_BIAS,)
    assert ids[:3].tolist() == [7, 2, -1] and vals[:3].tolist() == [-1.5, 100.0, 0.0]
    for bad, what in ((((10, 1.0),), "in 0..9"), (((3, 1.0), (3, 2.0)), "unique"),
                      (((-1, 1.0),), "in 0..9"), (((3, float("inf")),), "finite"),
                      (tuple((t, 1.0) for t in range(MAX_BIAS + 1)), "at most")):
        with pytest.raises(ValueError, match=what):
            bias_table(bad, 10 if len(bad) < 5 else 2 * MAX_BIAS)


@pytest.mark.parametrize("params", [
    dict(temperature=0.0, top_k=40, top_p=1.0, min_p=0.0),
    dict(temperature=0.0, top_k=40, top_p=1.0, min_p=0.0, repeat_penalty=1.5),
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, presence_penalty=0.5),
    dict(temperature=1.2, top_k=0, top_p=1.0, min_p=0.0),
    dict(temperature=0.6, top_k=0, top_p=0.9, min_p=0.0),
])
def test_a_logit_bias_is_the_hosts(params):
    """A bias in every block (the last part-full), one that makes a token the leader, one
    that bans the leader (-100), one on a penalised token (the bias goes on before the
    penalty): each step's token is the float64 mirror's over the host's `apply_logit_bias` of
    the logits, as the host `Sampler` applies it."""
    from strata.engine.sampler import apply_logit_bias
    rng = np.random.default_rng(int(params["temperature"] * 10) + int(params.get(
        "repeat_penalty", 1) * 7))
    n_vocab = 9000  # three blocks, the last part-full
    full = dict(repeat_penalty=1.0, penalty_last_n=8, seed=31) | params
    tokens = np.full(16, -1, np.int32)
    tokens[:3] = [4100, 12, 8990]
    n = np.array([3], np.int32)
    for step in range(3):
        logits = (rng.standard_normal(n_vocab) * 1.5).astype(np.float32)
        lead = int(np.argmax(logits))
        bias = ((8995, 6.0 + step), (4100, 3.5), (int(tokens[n[0] - 1]), 1.25), (77, -2.0),
                (lead, -100.0))
        bias = tuple(dict(bias).items())  # one entry an id (a repeat keeps the last: the ban)
        f, i = make_params(**full, n_bias=len(bias))
        want = _ref_sample(apply_logit_bias(logits, bias), tokens[:n[0]].copy(), **full)
        _sample(logits, tokens, n, f, i, bias_table(bias, n_vocab))
        assert tokens[n[0] - 1] == want, step
        assert want != lead
    # the same logits without the table's entries in use (n_bias 0): as unbiased
    f, i = make_params(**full)
    want = _ref_sample(logits, tokens[:n[0]].copy(), **full)
    _sample(logits, tokens, n, f, i, bias_table(bias, n_vocab))
    assert tokens[n[0] - 1] == want


@cuda.jit
def _draw(seeds, steps, out):
    i = cuda.threadIdx.x
    if i < out.size:
        out[i] = uniform01(seeds[i], steps[i])


@pytest.mark.filterwarnings("error::RuntimeWarning")  # the simulator's int64 overflow warning
def test_the_device_random_number_is_its_host_mirror():
    # seeds and steps whose hash inputs reach past 2^31 (where an int64 product would wrap)
    rng = np.random.default_rng(5)
    seeds = np.concatenate([[0, 1, 2**31, 2**32 - 1, 2**63 - 1],
                            rng.integers(0, 2**63 - 1, 27, dtype=np.int64)]).astype(np.int64)
    steps = rng.integers(0, 2**31 - 1, seeds.size, dtype=np.int64).astype(np.int32)
    out = np.zeros(seeds.size, np.float32)
    _draw[1, 32](seeds, steps, out)
    want = np.array([uniform(int(s), int(t)) for s, t in zip(seeds, steps)], np.float32)
    np.testing.assert_array_equal(out, want)
    assert len(set(out.tolist())) == out.size


@pytest.mark.parametrize("params", [
    dict(temperature=0.25, top_k=0, top_p=0.9, min_p=0.0),   # the cut among the 256 best
    dict(temperature=3.0, top_k=0, top_p=0.9, min_p=0.0),    # past them: flagged, the best
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3),    # min-p alone, among them
    dict(temperature=2.0, top_k=0, top_p=1.0, min_p=0.001),  # min-p past them
    dict(temperature=0.5, top_k=0, top_p=0.8, min_p=0.01, repeat_penalty=1.4),
])
def test_a_cut_over_every_token_draws_from_the_256_best_and_all_the_mass(params):
    """Top-k 0 with a top-p or min-p cut: top-p is a share of every token's mass (each block's,
    scaled to the largest logit), so the draw is the host's wherever the cut falls among the
    256 best; past them the state's second flag bit says so and the best is appended."""
    from strata.cuda_kernels.sampling import FLAG_PAST
    from helpers.sampling_ref import ref_past

    rng = np.random.default_rng(int(params["temperature"] * 100 + params["min_p"] * 1000))
    n_vocab = 9000  # three blocks, the last part-full
    full = dict(repeat_penalty=1.0, penalty_last_n=64, seed=99) | params
    f, i = make_params(**full)
    tokens = np.full(8, -1, np.int32)
    tokens[:2] = rng.integers(0, n_vocab, 2)
    n = np.array([2], np.int32)
    pasts = []
    for _ in range(3):
        logits = (rng.standard_normal(n_vocab) * 2.5).astype(np.float32)
        logits[tokens[n[0] - 1]] += 5
        hist = tokens[:n[0]].copy()
        want, past = _ref_sample(logits, hist, **full), ref_past(logits, hist, **full)
        state = np.zeros(3, np.uint64)
        cand_v = np.full(pick_cand_len(n_vocab), np.nan, np.float32)
        sample(logits, tokens, n, f, i, state, cand_v, np.full(3 * KMAX, -7, np.int32),
               *NO_BIAS)
        assert tokens[n[0] - 1] == want
        assert state.tolist() == [0, 0, FLAG_PAST if past else 0]
        pasts.append(past)
    # the first case's cut is always among the candidates, the second's always past them
    if params["temperature"] == 0.25:
        assert not any(pasts)
    if params["temperature"] == 3.0:
        assert all(pasts)


@pytest.mark.parametrize("temperature", [0.3, 0.4, 0.5])  # 5, 63, 220 tokens kept
def test_a_top_p_cut_over_every_token_is_the_host_samplers(temperature):
    """Where the device keeps a top-k 0 cut among its candidates, its support and weights are
    the host `Sampler`'s (`filtered_support` over the whole vocabulary)."""
    from strata.engine.sampler import SamplingParams, filtered_support
    rng = np.random.default_rng(int(temperature * 10))
    lg = (rng.standard_normal(20000) * 2).astype(np.float32)
    cuts = dict(top_k=0, top_p=0.9, min_p=0.0)
    host_ids, host_p = filtered_support(lg, SamplingParams(temperature=temperature, **cuts))
    ids, w, past = ref_support(lg.astype(np.float64), temperature=temperature, **cuts,
                               with_past=True)
    assert not past and 1 < ids.size < KMAX
    order = np.argsort(ids)
    np.testing.assert_array_equal(ids[order], host_ids)
    np.testing.assert_allclose((w / w.sum())[order], host_p, rtol=1e-9)
