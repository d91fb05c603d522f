"""Softmax + top-k + renormalisation against numpy (simulator)."""

from __future__ import annotations

import numpy as np
import pytest

from strata.cuda_kernels.router import route


def _ref(logits, k, norm):
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, -1)
    return ids, (w / w.sum(-1, keepdims=True) if norm else w)


@pytest.mark.parametrize("n_expert,k,norm", [(128, 8, True), (40, 3, False), (512, 16, True)])
def test_route(n_expert, k, norm):
    rng = np.random.default_rng(n_expert)
    n_tok = 5
    logits = rng.standard_normal((n_tok, n_expert)).astype(np.float32) * 3
    ids = np.full((n_tok, k), -7, np.int32)
    w = np.full((n_tok, k), np.nan, np.float32)
    route(logits, ids, w, norm_topk=norm)
    want_ids, want_w = _ref(logits.astype(np.float64), k, norm)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(w, want_w, rtol=1e-5)


def test_route_refuses_too_many_experts_and_k():
    with pytest.raises(ValueError, match="1..512"):
        route(np.zeros((1, 513), np.float32), np.zeros((1, 2), np.int32), np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match="k = 17"):
        route(np.zeros((1, 64), np.float32), np.zeros((1, 17), np.int32), np.zeros((1, 17), np.float32))
