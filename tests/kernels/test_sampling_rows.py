"""The sampler's draw over every token (top-k 0, top-p 1, min-p 0: no sort) and one launch
picking several sequences' tokens (grid rows), against the float64 mirror (simulator)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.sampling_ref import ref_sample
from strata.cuda_kernels.sampling import (KMAX, MAX_BIAS, N_FPARAMS, N_IPARAMS, argmax, bias_table,
                                          make_params, sample)
from strata.engine.sampler import SamplingParams, filtered_support
from strata.plan.pick import PICK_CHUNK, pick_blocks, pick_cand_len

FULL = dict(top_k=0, top_p=1.0, min_p=0.0)
NO_BIAS = bias_table((), 1)


def _no_bias(n_rows):
    return np.full((n_rows, MAX_BIAS), -1, np.int32), np.zeros((n_rows, MAX_BIAS), np.float32)


def _launch(logits, tokens, n, f, i):
    state = np.zeros(2, np.uint64)
    cand_v = np.full(pick_cand_len(logits.size), np.nan, np.float32)
    cand_i = np.full(pick_blocks(logits.size) * KMAX, -7, np.int32)
    sample(logits, tokens, n, f, i, state, cand_v, cand_i, *NO_BIAS)
    assert state.tolist() == [0, 0]


@pytest.mark.parametrize("case", ["spread", "one_block_wins", "empty_block", "penalty", "hot"])
def test_every_token_draw_matches_the_reference(case):
    """Three blocks (the last part-full); the mass spread over all of them, or in one, a block
    of -inf and NaN only, a penalised leader; each step's token is the mirror's."""
    rng = np.random.default_rng(["spread", "one_block_wins", "empty_block", "penalty",
                                 "hot"].index(case))
    n_vocab = 2 * PICK_CHUNK + 811
    rp = 1.8 if case == "penalty" else 1.0
    temp = {"hot": 3.0, "one_block_wins": 0.5}.get(case, 1.0)
    full = dict(temperature=temp, repeat_penalty=rp, penalty_last_n=64, seed=99, **FULL)
    f, i = make_params(**full)
    tokens = np.full(24, -1, np.int32)
    tokens[:4] = [3, PICK_CHUNK + 5, 2 * PICK_CHUNK + 800, 3]
    n = np.array([4], np.int32)
    seen = set()
    for _ in range(12):
        logits = rng.standard_normal(n_vocab).astype(np.float32)
        if case == "one_block_wins":
            logits[PICK_CHUNK:2 * PICK_CHUNK] += 12.0
        elif case == "empty_block":
            logits[:PICK_CHUNK] = -np.inf
            logits[[10, 20]] = np.nan  # ranked as -inf
        elif case == "penalty":
            logits[tokens[:n[0]]] += 9.0  # leaders until the penalty divides them
        want = ref_sample(logits, tokens[:n[0]].copy(), **full)
        _launch(logits, tokens, n, f, i)
        assert tokens[n[0] - 1] == want
        seen.add(int(want) // PICK_CHUNK)
    if case == "spread":
        assert seen == {0, 1, 2}  # the draw reached every block
    if case == "empty_block":
        assert 0 not in seen


def test_every_token_draw_is_the_host_samplers_distribution():
    """The mirror's weights for top-k 0, top-p 1, min-p 0 are the host `Sampler`'s
    probabilities over the whole vocabulary."""
    rng = np.random.default_rng(3)
    lg = (rng.standard_normal(5000) * 2).astype(np.float32)
    lg[7] = -np.inf
    ids, p = filtered_support(lg, SamplingParams(temperature=1.3, **FULL))
    w = np.exp((lg.astype(np.float64) - lg.max()) / 1.3)
    np.testing.assert_array_equal(ids, np.flatnonzero(w > 0))
    np.testing.assert_allclose(p, (w / w.sum())[ids], rtol=1e-9)


def test_one_launch_picks_each_rows_token_by_its_own_settings():
    """Four rows in one launch: greedy, top-k 40, every token, and top-k 5 with a penalty;
    rows 0 and 2 with a logit bias of their own (row 1's table holds entries it does not use);
    each row's token is the mirror's for its own logits, history and settings, and each row's
    length moves on by one."""
    from strata.engine.sampler import apply_logit_bias
    rng = np.random.default_rng(21)
    n_rows, n_vocab, cap = 4, PICK_CHUNK + 300, 16
    settings = [dict(temperature=0.0, top_k=40, top_p=1.0, min_p=0.0),
                dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
                dict(temperature=1.2, **FULL),
                dict(temperature=1.0, top_k=5, top_p=1.0, min_p=0.0, repeat_penalty=2.0,
                     presence_penalty=0.5, frequency_penalty=0.25)]
    full = [dict(repeat_penalty=1.0, penalty_last_n=64, seed=1000 + r) | s
            for r, s in enumerate(settings)]
    biases = [((5, 4.0), (PICK_CHUNK + 7, 3.0)), (), ((11, -100.0), (PICK_CHUNK + 299, 5.0)), ()]
    fp = np.zeros((n_rows, N_FPARAMS), np.float32)
    ip = np.zeros((n_rows, N_IPARAMS), np.int64)
    bid, bval = _no_bias(n_rows)
    for r, p in enumerate(full):
        fp[r], ip[r] = make_params(**p, n_bias=len(biases[r]))
        bid[r], bval[r] = bias_table(biases[r], n_vocab)
    bid[1], bval[1] = bias_table(((3, 50.0),), n_vocab)  # in the table, not in use
    tokens = rng.integers(0, n_vocab, (n_rows, cap)).astype(np.int32)
    n = np.array([3, 5, 2, 7], np.int32)
    state = np.zeros((n_rows, 2), np.uint64)
    cand_v = np.zeros((n_rows, pick_cand_len(n_vocab)), np.float32)
    cand_i = np.zeros((n_rows, pick_blocks(n_vocab) * KMAX), np.int32)
    for _ in range(3):
        logits = (rng.standard_normal((n_rows, n_vocab)) * 2).astype(np.float32)
        logits[3, tokens[3, n[3] - 1]] += 8.0  # row 3's last token leads until penalised
        want = [ref_sample(apply_logit_bias(logits[r], biases[r]), tokens[r, :n[r]].copy(),
                           **full[r]) for r in range(n_rows)]
        before = n.copy()
        sample(logits, tokens, n, fp, ip, state, cand_v, cand_i, bid, bval)
        np.testing.assert_array_equal(n, before + 1)
        assert [int(tokens[r, before[r]]) for r in range(n_rows)] == want
        assert not state.any()


def test_argmax_rows_and_the_row_checks():
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((3, 2000)).astype(np.float32)
    logits[1, 1999] = 50.0
    tokens = np.zeros((3, 4), np.int32)
    n = np.array([0, 1, 2], np.int32)
    state = np.zeros((3, 2), np.uint64)
    argmax(logits, tokens, n, state)
    assert n.tolist() == [1, 2, 3] and not state.any()
    assert [tokens[r, r] for r in range(3)] == [int(np.argmax(x)) for x in logits]
    with pytest.raises(ValueError, match="n_tokens: shape"):
        argmax(logits, tokens, np.zeros(2, np.int32), state)
    with pytest.raises(ValueError, match="state: shape"):
        argmax(logits, tokens, n, np.zeros((2, 2), np.uint64))
    f, i = make_params(temperature=1.0)
    with pytest.raises(ValueError, match="fparams: shape"):
        sample(logits, tokens, n, f, i, state, np.zeros((3, KMAX), np.float32),
               np.zeros((3, KMAX), np.int32), *_no_bias(3))


@pytest.mark.parametrize("mode", ["argmax", "top-k", "every token"])
def test_a_nan_logit_sets_the_rows_flag_and_only_its_own(mode):
    """A third state entry records that a row's logits held a NaN (in any block; the token is
    still chosen, NaN ranked as -inf); it stays set across launches until cleared, and a row
    without NaN keeps it at zero. A two-entry state records nothing."""
    rng = np.random.default_rng(8)
    n_vocab = 2 * PICK_CHUNK + 100
    logits = rng.standard_normal((2, n_vocab)).astype(np.float32)
    logits[1, PICK_CHUNK + 77] = np.nan  # row 1, second block
    tokens = np.zeros((2, 8), np.int32)
    n = np.array([1, 1], np.int32)
    state = np.zeros((2, 3), np.uint64)
    params = {"top-k": dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05),
              "every token": dict(temperature=1.0, **FULL)}.get(mode)

    def launch(lg, st):
        if params is None:
            argmax(lg, tokens, n, st)
            return
        f, i = make_params(**params, seed=3)
        cand = np.zeros((2, pick_cand_len(n_vocab)), np.float32)
        sample(lg, tokens, n, np.stack([f, f]), np.stack([i, i]), st, cand,
               np.zeros((2, pick_blocks(n_vocab) * KMAX), np.int32), *_no_bias(2))

    launch(logits, state)
    assert state[:, 2].tolist() == [0, 1] and not state[:, :2].any()
    assert tokens[1, 1] != PICK_CHUNK + 77 and n.tolist() == [2, 2]
    launch(np.nan_to_num(logits, nan=0.0), state)  # clean logits: the flag stays
    assert state[:, 2].tolist() == [0, 1]
    two = np.zeros((2, 2), np.uint64)
    launch(logits, two)
    assert not two.any()


@pytest.mark.parametrize("params", [dict(temperature=1.0, **FULL),
                                    dict(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05)])
def test_plus_inf_logits_share_the_draw_as_on_the_host(params):
    """+inf logits (a repeat penalty's overflow on a huge logit) take the whole draw, shared
    evenly, as the host's `filtered_support` has it: each draw is one of them, the mirror's."""
    rng = np.random.default_rng(2)
    n_vocab = 2 * PICK_CHUNK + 5
    infs = [17, PICK_CHUNK + 3, 2 * PICK_CHUNK + 1]  # one in each block
    tokens = np.zeros(40, np.int32)
    n = np.array([0], np.int32)
    host_ids, host_p = filtered_support(
        np.where(np.isin(np.arange(n_vocab), infs), np.inf, 0.0).astype(np.float32),
        SamplingParams(**params))
    assert host_ids.tolist() == infs and np.allclose(host_p, 1 / 3)
    seen = set()
    for seed in range(12):
        logits = rng.standard_normal(n_vocab).astype(np.float32)
        logits[infs] = np.inf
        full = dict(repeat_penalty=1.0, penalty_last_n=0, seed=seed) | params
        f, i = make_params(**full)
        want = ref_sample(logits, tokens[:n[0]].copy(), **full)
        _launch(logits, tokens, n, f, i)
        assert tokens[n[0] - 1] == want and want in infs
        seen.add(int(want))
    assert len(seen) >= 2  # shared, not always the first
