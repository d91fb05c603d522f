"""helpers.ties, the tie-aware distance to the 8-bit-rounding reference: it absorbs what float32
can flip and nothing more."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import reference as ref
from helpers import ties
from helpers.engine_models import PROMPT, model_path


@pytest.fixture(scope="module")
def q4(tmp_models):
    path = model_path(tmp_models, "Q4_K_M")
    return ref.RefModel.load(path, x8=True), ref.RefModel.load(path)


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_the_rounder_rounds_as_round_x8_and_flips_one_code_by_one_step():
    x = np.random.default_rng(3).standard_normal((5, 64))
    plain = ties.TieRounder(eps=1e-2)
    np.testing.assert_array_equal(plain(x), ref.round_x8(x))
    assert plain.n_calls == 1 and plain.found  # eps this wide finds some
    call, i = plain.found[0]
    flipped = ties.TieRounder(eps=1e-2, flips=[(call, i)])(x)
    diff = np.flatnonzero(flipped.reshape(-1) != ref.round_x8(x).reshape(-1))
    assert diff.tolist() == [i]
    block = x.reshape(-1, 32)[i // 32]
    step = np.abs(block).max() / 127.0
    assert abs(abs(flipped.reshape(-1)[i] - ref.round_x8(x).reshape(-1)[i]) - step) < 1e-12


def test_float32_noise_before_rounding_is_absorbed_and_not_rounding_is_not(q4):
    m8, m = q4
    want = ref.forward(m8, PROMPT)[-1]
    moved = 0
    for seed in range(8):  # what another machine's float32 order does to the rounded values
        rng = np.random.default_rng(seed)
        noisy = dataclasses.replace(
            m8, rounder=lambda x, rng=rng: ref.round_x8(x * (1 + 1e-7 * rng.standard_normal(x.shape))))
        got = ref.forward(noisy, PROMPT)[-1]
        moved += _rel(got, want) > 1e-4  # a tie went the other way
        dist, _ = ties.x8_distance(got, m8, PROMPT)
        assert dist < 1e-6, f"seed {seed}: {dist:.2e}"
    assert moved, "no seed flipped a tie: the test shows nothing"
    # the unrounded reference is not the rounded one under any set of flips
    dist, _ = ties.x8_distance(ref.forward(m, PROMPT)[-1], m8, PROMPT)
    assert dist > 1e-3, dist


def test_too_many_ties_is_refused(q4):
    m8, _ = q4
    with pytest.raises(AssertionError, match="near-ties in the reference"):
        ties.x8_distance(ref.forward(m8, PROMPT)[-1], m8, PROMPT, eps=1e-2)
