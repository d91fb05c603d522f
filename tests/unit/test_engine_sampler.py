"""The sampler: greedy, each filter against its definition, the penalties, seeds, and the
empirical distribution of draws against the filtered softmax."""

from __future__ import annotations

import math

import numpy as np
import pytest

from strata.engine.sampler import (LOGPROB_FLOOR, Sampler, SamplingParams, apply_logit_bias,
                                   apply_penalties, filtered_probs, token_logprobs)

OFF = dict(top_k=0, top_p=1.0, min_p=0.0)
LOGITS = np.array([2.0, 1.0, 0.5, 3.0, -1.0, 0.0], np.float32)


def _softmax(z, t=1.0):
    e = np.exp((z - z.max()) / t)
    return e / e.sum()


def test_greedy_is_the_arg_max():
    s = Sampler(SamplingParams(temperature=0))
    assert s(LOGITS) == 3
    assert s(np.array([0.0, 5.0, 5.0], np.float32)) == 1  # first of equal maxima


def test_unfiltered_probabilities_are_the_tempered_softmax():
    p = filtered_probs(LOGITS, SamplingParams(temperature=0.7, **OFF))
    np.testing.assert_allclose(p, _softmax(LOGITS.astype(np.float64), 0.7), rtol=1e-12)


def test_top_k_keeps_the_k_largest():
    p = filtered_probs(LOGITS, SamplingParams(temperature=1.0, **{**OFF, "top_k": 2}))
    assert set(np.flatnonzero(p)) == {0, 3}
    np.testing.assert_allclose(p[[3, 0]], _softmax(np.array([3.0, 2.0])))


def test_top_p_keeps_the_smallest_set_reaching_p():
    full = _softmax(LOGITS.astype(np.float64))
    order = np.argsort(-full)
    # the two most likely tokens hold less than 0.85, the three most likely more
    assert full[order[:2]].sum() < 0.85 < full[order[:3]].sum()
    p = filtered_probs(LOGITS, SamplingParams(temperature=1.0, **{**OFF, "top_p": 0.85}))
    assert set(np.flatnonzero(p)) == set(order[:3])


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    full = _softmax(LOGITS.astype(np.float64))
    p = filtered_probs(LOGITS, SamplingParams(temperature=1.0, **{**OFF, "min_p": 0.3}))
    assert set(np.flatnonzero(p)) == set(np.flatnonzero(full >= 0.3 * full.max()))
    assert p.sum() == pytest.approx(1.0)


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    out = apply_penalties(LOGITS, np.array([0, 4, 0]), 2.0)
    assert out[0] == pytest.approx(1.0) and out[4] == pytest.approx(-2.0)
    np.testing.assert_array_equal(np.delete(out, [0, 4]), np.delete(LOGITS, [0, 4]))
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=10.0))
    s.accept([3])
    assert s(LOGITS) == 0  # token 3 was recent: its 3.0 became 0.3


def test_presence_and_frequency_penalties_subtract_once_and_per_occurrence():
    """OpenAI's definition: minus presence for a token among the recent ones, minus frequency
    times its count there; after the repeat penalty (llama.cpp's order); a token outside the
    window untouched; negative penalties favour repeats."""
    recent = np.array([0, 4, 0, 0, 2])
    out = apply_penalties(LOGITS, recent, 1.0, presence=0.5, frequency=0.25)
    want = LOGITS.copy()
    want[0] -= 0.5 + 3 * 0.25
    want[4] -= 0.5 + 0.25
    want[2] -= 0.5 + 0.25
    np.testing.assert_array_equal(out, want)
    both = apply_penalties(LOGITS, recent, 2.0, presence=0.5, frequency=0.25)
    assert both[0] == np.float32(2.0 / 2 - 1.25) and both[4] == np.float32(-1.0 * 2 - 0.75)
    assert apply_penalties(LOGITS, recent, 1.0, presence=-1.0)[2] == np.float32(1.5)
    s = Sampler(SamplingParams(temperature=0, frequency_penalty=0.6, repeat_last_n=3))
    s.accept([3, 3, 1])  # token 3 twice in the window: 3.0 - 1.2 < 2.0
    assert s(LOGITS) == 0
    s = Sampler(SamplingParams(temperature=0, frequency_penalty=0.6, repeat_last_n=1))
    s.accept([3, 3, 1])  # only the last token counts: 3 stays the best
    assert s(LOGITS) == 3
    s = Sampler(SamplingParams(temperature=0, presence_penalty=1.5))
    s.accept([3, 3, 3, 3])  # presence counts once: 3.0 - 1.5 < 2.0
    assert s(LOGITS) == 0


def test_penalties_off_leave_the_logits_as_they_are():
    assert SamplingParams().penalised is False
    assert SamplingParams(presence_penalty=0.1).penalised
    assert SamplingParams(frequency_penalty=-0.1).penalised
    assert not SamplingParams(repeat_penalty=1.3, repeat_last_n=0).penalised
    out = apply_penalties(LOGITS, np.array([0, 3]), 1.0, 0.0, 0.0)
    np.testing.assert_array_equal(out, LOGITS)


def test_a_seed_makes_draws_repeatable():
    params = SamplingParams(temperature=1.0, seed=123, **OFF)
    s1, s2 = Sampler(params), Sampler(params)
    draws = [s1(LOGITS) for _ in range(50)]
    assert draws == [s2(LOGITS) for _ in range(50)]
    assert len(set(draws)) > 1  # really sampling, not stuck on one token


def test_draws_follow_the_filtered_distribution():
    params = SamplingParams(temperature=0.9, top_k=4, top_p=0.97, min_p=0.02, seed=1)
    want = filtered_probs(LOGITS, params)
    s = Sampler(params)
    n = 20000
    counts = np.bincount([s(LOGITS) for _ in range(n)], minlength=LOGITS.size)
    assert np.all(counts[want == 0] == 0)
    # each kept token within 5 standard errors of its expected count
    se = np.sqrt(n * want * (1 - want))
    assert np.all(np.abs(counts - n * want) <= 5 * se + 1e-9)


@pytest.mark.parametrize("bad, match", [
    (dict(temperature=-1), "temperature"), (dict(top_k=-2), "top_k"), (dict(top_p=0), "top_p"),
    (dict(min_p=1.5), "min_p"), (dict(repeat_penalty=0), "repeat_penalty"),
    (dict(seed=-3), "seed"), (dict(repeat_last_n=-1), "repeat_last_n"),
    (dict(presence_penalty=float("nan")), "presence_penalty"),
    (dict(frequency_penalty=float("inf")), "frequency_penalty"),
])
def test_bad_parameters_name_themselves(bad, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**bad)


def _reference_probs(logits, p):
    """The filters by their definitions over the whole vocabulary (a full stable sort)."""
    z = logits.astype(np.float64)
    keep = np.isfinite(z)
    if p.top_k and p.top_k < z.size:
        keep &= z >= np.sort(z[keep])[-p.top_k]
    z = np.where(keep, z / p.temperature, -np.inf)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if p.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]
        probs[order[before >= p.top_p]] = 0.0
    if p.min_p > 0.0:
        probs[probs < p.min_p * probs.max()] = 0.0
    return probs / probs.sum()


@pytest.mark.parametrize("spread,top_k,top_p,min_p", [
    (4.0, 40, 0.95, 0.05),    # the defaults on a peaked vocabulary
    (4.0, 0, 0.9, 0.0),       # top-p alone: the cut among the first 1024 candidates
    (2.4, 0, 0.95, 0.0),      # ... among 16384
    (0.01, 0, 0.9, 0.0),      # nearly flat: 1024 tokens hold less than p, a full sort
    (2.0, 5000, 0.99, 0.01),
])
def test_the_large_vocabulary_path_matches_the_definitions(spread, top_k, top_p, min_p):
    rng = np.random.default_rng(int(spread * 100) + top_k)
    logits = (rng.standard_normal(151936) * spread).astype(np.float32)
    logits[[7, 99]] = -np.inf
    params = SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p, min_p=min_p)
    want = _reference_probs(logits, params)
    got = filtered_probs(logits, params)
    assert set(np.flatnonzero(got)) == set(np.flatnonzero(want))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)


def test_a_tie_across_the_candidate_boundary_takes_the_full_sort():
    """1100 equally likely best tokens: the 1024 candidates tie with tokens outside them, so the
    cut is made on the whole vocabulary, lower ids first."""
    logits = np.zeros(5000, np.float32)
    logits[3000:4100] = 9.0
    params = SamplingParams(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0)
    got = filtered_probs(logits, params)
    want = _reference_probs(logits, params)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)
    assert np.flatnonzero(got).min() == 3000


@pytest.mark.parametrize("t", [5e-324, 1e-310, 1e-200])
def test_a_vanishing_temperature_is_the_arg_max_not_nan(t):
    # z / t overflows to inf at these temperatures; the distribution must still be the limit.
    p = filtered_probs(LOGITS, SamplingParams(temperature=t, **OFF))
    np.testing.assert_array_equal(p, np.eye(LOGITS.size)[3])
    ties = filtered_probs(np.array([1.0, 4.0, 4.0], np.float32), SamplingParams(temperature=t, **OFF))
    np.testing.assert_array_equal(ties, [0.0, 0.5, 0.5])
    assert Sampler(SamplingParams(temperature=t, seed=0))(LOGITS) == 3


def test_logits_with_nothing_finite_are_a_named_error():
    with pytest.raises(ValueError, match="no finite logit"):
        Sampler(SamplingParams(temperature=1.0))(np.full(4, -np.inf, np.float32))


def test_an_overflowing_repeat_penalty_makes_the_repeated_tokens_certain():
    # penalty < 1 favours repeats; at 1e-300 a positive float32 logit overflows to +inf, which
    # must be the limit (those tokens certain), not a token dropped as non-finite
    p = SamplingParams(temperature=1.0, repeat_penalty=1e-300, **OFF)
    s = Sampler(p)
    s.accept([0, 1])
    z = apply_penalties(LOGITS, np.array([0, 1]), p.repeat_penalty)
    assert np.isposinf(z[[0, 1]]).all()
    np.testing.assert_array_equal(filtered_probs(z, p), [0.5, 0.5, 0, 0, 0, 0])
    assert all(s(LOGITS) in (0, 1) for _ in range(20))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_nan_logits_are_an_error_never_a_token(temperature):
    z = LOGITS.copy()
    z[[2, 4]] = np.nan
    with pytest.raises(ValueError, match=r"logits contain NaN at \[2, 4\]"):
        Sampler(SamplingParams(temperature=temperature))(z)


# -- logit bias ----------------------------------------------------------------------------

def test_a_logit_bias_moves_the_arg_max_and_the_distribution():
    s = Sampler(SamplingParams(temperature=0, logit_bias=((0, 1.5),)))
    assert s(LOGITS) == 0  # 2.0 + 1.5 passes token 3's 3.0
    assert Sampler(SamplingParams(temperature=0, logit_bias=((3, -100.0),)))(LOGITS) == 0
    s = Sampler(SamplingParams(temperature=0.9, logit_bias=((1, 2.0), (4, -0.5)), seed=3, **OFF))
    draws = np.bincount([s(LOGITS) for _ in range(20000)], minlength=LOGITS.size) / 20000
    z = LOGITS.astype(np.float64)
    z[1] += 2.0
    z[4] -= 0.5
    np.testing.assert_allclose(draws, _softmax(z, 0.9), atol=0.015)  # ~4 sigma at 20k draws


def test_the_bias_comes_before_the_penalties():
    """llama.cpp's order: the bias, then the penalties (which see the biased logit's sign)."""
    # biased first: (3 - 1) / 2 = 1.0 beats 0.8; penalised first: 3 / 2 - 1 = 0.5 would not
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0, logit_bias=((0, -1.0),)))
    s.accept([0])
    assert s(np.array([3.0, 0.8], np.float32)) == 0
    # biased negative, then multiplied: (3 - 3.5) * 2 = -1.0 beats -1.5 (3 / 2 - 3.5 = -2 not)
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0, logit_bias=((0, -3.5),)))
    s.accept([0])
    assert s(np.array([3.0, -1.5], np.float32)) == 0
    z = apply_penalties(apply_logit_bias(np.array([3.0], np.float32), ((0, -3.5),)),
                        np.array([0]), 2.0)
    assert z[0] == pytest.approx(-1.0)


def test_logit_bias_errors_are_named():
    with pytest.raises(ValueError, match="unique"):
        SamplingParams(logit_bias=((1, 1.0), (1, 2.0)))
    with pytest.raises(ValueError, match="finite"):
        SamplingParams(logit_bias=((1, float("inf")),))
    with pytest.raises(ValueError, match="token id 9 is outside the vocabulary"):
        Sampler(SamplingParams(temperature=0, logit_bias=((9, 1.0),)))(LOGITS)


# -- log-probabilities ---------------------------------------------------------------------

def _log_softmax_reference(z) -> list[float]:
    """Per element with math.fsum: no numpy reduction shared with the code under test."""
    z = [float(v) for v in z]
    m = max(z)
    lse = m + math.log(math.fsum(math.exp(v - m) for v in z))
    return [v - lse for v in z]


def test_token_logprobs_are_the_log_softmax_and_the_best_first():
    rng = np.random.default_rng(5)
    z = (rng.standard_normal(4000) * 4).astype(np.float32)
    ref = _log_softmax_reference(z)
    lp, top = token_logprobs(z, 17, 5)
    assert lp == pytest.approx(ref[17], abs=1e-6)
    best = sorted(range(z.size), key=lambda i: (-ref[i], i))[:5]
    assert [t for t, _ in top] == best
    assert [v for _, v in top] == pytest.approx([ref[i] for i in best], abs=1e-6)
    assert token_logprobs(z, 17, 0) == (lp, ())


def test_token_logprobs_ties_take_the_lower_id_and_floor_the_impossible():
    z = np.array([1.0, 5.0, 1.0, 5.0, -np.inf, 1.0], np.float32)
    lp, top = token_logprobs(z, 4, 3)
    assert [t for t, _ in top] == [1, 3, 0]  # the tie at the cut: 0 before 2 and 5
    assert lp == LOGPROB_FLOOR
    _, everything = token_logprobs(z, 0, 50)  # more asked than the vocabulary holds
    assert [t for t, _ in everything] == [1, 3, 0, 2, 5, 4]
    assert everything[-1][1] == LOGPROB_FLOOR
    assert math.fsum(math.exp(v) for _, v in everything) == pytest.approx(1.0)


def test_token_logprobs_refuse_nan_and_nothing_finite():
    with pytest.raises(ValueError, match="NaN"):
        token_logprobs(np.array([0.0, np.nan], np.float32), 0, 1)
    with pytest.raises(ValueError, match="no finite value"):
        token_logprobs(np.full(3, -np.inf, np.float32), 0, 1)
