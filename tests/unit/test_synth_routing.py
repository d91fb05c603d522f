"""Routing skew design: the target curve, the coverage measure, and the bias fit."""

from __future__ import annotations

import numpy as np
import pytest

from strata.synth import PRESETS, SynthError
from strata.synth.routing import (
    P_MAX, SPREAD, check_skew, coverage, design, embedding_rows, fit_layer, noise_basis,
    noise_directions, rng_for, selection_rates, target_probabilities,
)


@pytest.mark.parametrize("n_expert, k, b", [(128, 8, 3.0), (8, 3, 3.0), (8, 3, 1.0),
                                            (8, 3, 6.0), (64, 6, 1.5)])
def test_target_probabilities(n_expert, k, b):
    p = target_probabilities(n_expert, k, b)
    assert abs(p.sum() - k) < 1e-9 and np.all(p <= P_MAX + 1e-12) and np.all(np.diff(p) <= 1e-12)
    if b == 1.0:
        assert np.allclose(p, k / n_expert)
    if p.max() < P_MAX:  # uncapped: shares follow 1-(1-f)^B exactly
        assert abs(coverage(p, 0.25) - (1 - 0.75 ** b)) < 1e-9


def test_capped_ranks_when_the_curve_asks_too_much():
    p = target_probabilities(8, 3, 6.0)  # the top rank would need probability 1.9
    assert p[0] == P_MAX and p[1] == P_MAX


def test_coverage_ranks_by_count():
    assert coverage([1, 7, 0, 2], 0.25) == 0.7
    assert coverage([1, 7, 0, 2], 0.5) == 0.9


@pytest.mark.parametrize("bad", [0.5, 0, 65, float("nan")])
def test_skew_range(bad):
    with pytest.raises(SynthError, match="--skew must be between 1"):
        check_skew(bad)
    assert check_skew(None) == 1.0


def test_design_is_reproducible_and_ranks_are_permutations():
    cfg = PRESETS["tiny"]
    a, b = design(cfg, 4, 3.0), design(cfg, 4, 3.0)
    assert np.array_equal(a.ranks, b.ranks) and np.array_equal(a.dims, b.dims)
    assert not np.array_equal(a.ranks, design(cfg, 5, 3.0).ranks)
    assert all(sorted(r) == list(range(cfg.n_expert)) for r in a.ranks)
    assert len(set(a.dims)) == len(a.dims) and abs(np.linalg.norm(a.direction) - 1) < 1e-12


def test_noise_directions_are_orthonormal_and_orthogonal_to_the_direction():
    rd = design(PRESETS["tiny"], 0, 3.0)
    basis = noise_basis(rd.direction, rng_for(0, "b"))
    w = noise_directions(basis, 8, rng_for(0, "w"))
    assert np.allclose(w @ w.T, np.eye(8), atol=1e-10) and np.allclose(w @ rd.direction, 0)


@pytest.mark.parametrize("name", ["tiny", "qwen3-30b-a3b"])
def test_fit_reaches_the_target_rates(name):
    cfg = PRESETS[name]
    rd = design(cfg, 1, 3.0)
    rows = embedding_rows(rd, cfg, np.arange(2048), rng_for(1, "e"))[:, rd.dims]
    sample = rows.astype(np.float64)
    w = noise_directions(noise_basis(rd.direction, rng_for(1, "b")), cfg.n_expert,
                         rng_for(1, "w"))
    bias = fit_layer(rd, sample, w, cfg.n_expert_used)
    rate = selection_rates(bias, sample @ rd.direction, SPREAD * (sample @ w.T),
                           cfg.n_expert_used)
    assert np.abs(rate - rd.probabilities).max() < 0.01
    assert abs(coverage(rate, 0.5) - 0.875) < 0.005
