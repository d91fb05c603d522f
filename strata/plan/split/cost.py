"""The split's cost model: the coverage curve H(f) = 1 - (1 - f)^b of the fraction f of a
layer's experts a cache holds, its exponent b (the profile's, fitted to its routing shares when
it has them; 3 without), and one layer's decode time given how many of its experts are held.

A decode token reads, per layer, the layer's dense weights and its k routed experts: a held
expert from the card's VRAM at the card's rate, a missed one from mapped host memory at the
host rate. Compute is bandwidth-bound at batch 1, so time is bytes over rate.
"""

from __future__ import annotations

import numpy as np

from strata.plan.profile import RoutingProfile
from strata.plan.split.options import COVER_B_DEFAULT

B_RANGE = (0.05, 200.0)  # the fitted exponent is searched in this range (log-spaced)


def cover(f: np.ndarray | float, b: float) -> np.ndarray | float:
    """H(f) = 1 - (1 - f)^b: the share of a layer's routed tokens caught holding fraction f."""
    return 1.0 - (1.0 - np.clip(f, 0.0, 1.0)) ** b


def _measured_curve(profile: RoutingProfile) -> np.ndarray:
    """[n_expert + 1]: the share a cache holding the j hottest experts of each layer catches,
    averaged over layers (C[0] = 0)."""
    s = -np.sort(-profile.share, axis=1)  # [n_layer, n_expert], hottest first
    out = np.zeros(profile.n_expert + 1)
    out[1:] = np.cumsum(s, axis=1).mean(axis=0)
    return out


def fit_cover_b(profile: RoutingProfile) -> float:
    """b of the profile: least squares of H against its measured coverage curve when it has
    routing shares (H is monotone in b, so a golden-section search in log b converges), else 3."""
    if profile.share is None:
        return COVER_B_DEFAULT
    want = _measured_curve(profile)
    f = np.arange(profile.n_expert + 1) / profile.n_expert

    def err(log_b: float) -> float:
        return float(np.sum((cover(f, np.exp(log_b)) - want) ** 2))

    lo, hi = np.log(B_RANGE[0]), np.log(B_RANGE[1])
    g = (np.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = err(a), err(b)
    for _ in range(80):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = err(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = err(b)
    return float(np.exp((lo + hi) / 2))


def layer_seconds(held: np.ndarray, *, n_expert: int, k: int, b: float, dense_bytes: np.ndarray,
                  blob_bytes: np.ndarray, bandwidth: float, host_bandwidth: float) -> np.ndarray:
    """Predicted decode seconds of each layer per token. `held` [..., n_layer] experts held per
    layer; `dense_bytes`, `blob_bytes` [n_layer] (one expert's gate+up+down)."""
    h = cover(held / n_expert, b)
    return dense_bytes / bandwidth + k * blob_bytes * (h / bandwidth + (1.0 - h) / host_bandwidth)
