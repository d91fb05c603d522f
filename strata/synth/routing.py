"""Routing skew: routers that send random tokens to experts with a chosen popularity curve.

How it is made. A few hidden dimensions (`dims`, a random subset of n_embd) belong to routing
alone: the token embedding writes them, every `attn_output` and `ffn_down_exps` row for them is
zero, so the residual stream keeps them equal to the embedding through every layer; the routers
read only them. Every embedding row there is `amplitude * direction + noise`. Router row of the
expert at rank r is `bias[r] * direction + spread * w[r]`, with `w` orthonormal noise directions
(per layer), divided by that layer's `ffn_norm` weight so the norm's gains cancel. A router logit
is then `bias[r] * A_t + spread * z_tr` divided by the token's RMS, where A_t > 0 is the token's
share of `direction` and z_tr its noise: the RMS is a positive factor common to all experts, so
top-k selection depends on the token alone, at every depth. The biases are fitted (on the
embedding rows as written, dequantized) so that each rank is selected with probability
k * share[r], where the shares follow the coverage curve 1 - (1 - f)^B: the top fraction f of
experts receives that fraction of all selections (B = 1: uniform). Each layer maps ranks to
expert ids with its own random permutation (`ranks`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from strata.synth.config import SynthConfig
from strata.synth.errors import SynthError

MAX_SKEW = 64.0
P_MAX = 0.995  # a rank cannot be chosen by every token: selections are capped here
AMPLITUDE = 1.0  # embedding's direction part per routing dim, against noise std 1
SPREAD = 1.5  # router noise weight (the softmax temperature of the gate)
FIT_ITERS, REFIT_ITERS = 150, 12
FIT_TOL = 0.005  # stop once every rank's selection rate is this close to its target


def rng_for(seed: int, *keys: int | str) -> np.random.Generator:
    """An independent, reproducible stream for one purpose (`keys`) of a model's `seed`."""
    words = [int(seed) & 0xFFFFFFFF]
    words += [zlib.crc32(k.encode()) if isinstance(k, str) else int(k) for k in keys]
    return np.random.default_rng(np.random.SeedSequence(words))


def check_skew(skew: float | None) -> float:
    """The skew exponent B (None means 1: uniform); a `SynthError` outside [1, MAX_SKEW]."""
    b = 1.0 if skew is None else float(skew)
    if not 1.0 <= b <= MAX_SKEW:
        raise SynthError(f"--skew must be between 1 (uniform) and {MAX_SKEW:g}, got {skew!r}")
    return b


def target_probabilities(n_expert: int, n_used: int, skew: float) -> np.ndarray:
    """Probability that a token selects the expert of each rank: [n_expert] float64, summing to
    n_used, following shares C((r+1)/E) - C(r/E) with C(f) = 1 - (1-f)^B; ranks that would exceed
    `P_MAX` are capped and their excess spread over the others in proportion."""
    f = np.arange(n_expert + 1) / n_expert
    p = n_used * np.diff(1.0 - (1.0 - f) ** skew)
    capped = np.zeros(n_expert, bool)
    for _ in range(n_expert):
        over = p > P_MAX
        if not over.any():
            break
        capped |= over
        p[capped] = P_MAX
        free = ~capped
        p[free] *= (n_used - P_MAX * capped.sum()) / p[free].sum()
    return p


def coverage(counts: np.ndarray, fraction: float) -> float:
    """Share of all selections received by the top `fraction` of experts (ranked by count)."""
    c = np.sort(np.asarray(counts, np.float64))[::-1]
    n_top = int(round(fraction * len(c)))
    return float(c[:n_top].sum() / c.sum())


@dataclass(frozen=True, slots=True)
class RoutingDesign:
    """The routing dimensions and direction, the skew, and each layer's rank order."""

    dims: np.ndarray  # [n_dims] int64, sorted hidden dimensions reserved for routing
    direction: np.ndarray  # [n_dims] float64, unit
    skew: float
    probabilities: np.ndarray  # [n_expert] float64, per rank, sums to n_expert_used
    ranks: np.ndarray  # [n_layer, n_expert] int64: expert id at each rank (0 = hottest)

    @property
    def shares(self) -> np.ndarray:
        """Intended share of all selections per rank: [n_expert], sums to 1."""
        return self.probabilities / self.probabilities.sum()


def n_routing_dims(cfg: SynthConfig) -> int:
    return int(min(max(2 * cfg.n_expert, 32), cfg.n_embd // 4))


def design(cfg: SynthConfig, seed: int, skew: float | None) -> RoutingDesign:
    """The cheap part of the routing (no fitting): used for the header and by every tensor."""
    b = check_skew(skew)
    rng = rng_for(seed, "routing")
    dims = np.sort(rng.choice(cfg.n_embd, n_routing_dims(cfg), replace=False))
    direction = rng.standard_normal(len(dims))
    ranks = np.stack([rng.permutation(cfg.n_expert) for _ in range(cfg.n_layer)])
    return RoutingDesign(dims=dims, direction=direction / np.linalg.norm(direction), skew=b,
                         probabilities=target_probabilities(cfg.n_expert, cfg.n_expert_used, b),
                         ranks=ranks)


def embedding_rows(rd: RoutingDesign, cfg: SynthConfig, rows: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    """Float embedding rows for token ids `rows`: noise of std 1 everywhere (uniform: ten times
    cheaper than normal, and sums of it are normal enough), plus the routing direction in the
    routing dims: [len(rows), n_embd] float32."""
    x = rng.random((len(rows), cfg.n_embd), dtype=np.float32)
    x -= np.float32(0.5)
    x *= np.float32(np.sqrt(12.0))
    x[:, rd.dims] += np.float32(AMPLITUDE * np.sqrt(len(rd.dims))) * rd.direction.astype(
        np.float32)
    return x


def noise_basis(direction: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[len(direction) - 1, len(direction)] orthonormal rows, all orthogonal to `direction`
    (made once per model; each layer draws its routers' noise directions from it)."""
    g = rng.standard_normal((len(direction), len(direction)))
    g[:, 0] = direction
    q, _ = np.linalg.qr(g)
    return q[:, 1:].T


def noise_directions(basis: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """One layer's [n, n_dims] noise directions: a random signed subset of `basis` (orthonormal)
    while it lasts, then random unit rows in the span of `basis`."""
    take = rng.permutation(len(basis))[:n]
    w = basis[take] * rng.choice([-1.0, 1.0], size=(len(take), 1))
    if n > len(w):
        extra = rng.standard_normal((n - len(w), len(basis))) @ basis
        w = np.concatenate([w, extra / np.linalg.norm(extra, axis=1, keepdims=True)])
    return w


def selection_rates(bias: np.ndarray, along: np.ndarray, noise: np.ndarray, k: int) -> np.ndarray:
    """Fraction of tokens selecting each rank when logits are bias * along + noise."""
    logits = along[:, None] * bias[None, :] + noise  # [n_tokens, n_expert]
    top = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    return np.bincount(top.ravel(), minlength=len(bias)) / len(along)


def fit_biases(along: np.ndarray, noise: np.ndarray, target: np.ndarray, k: int, *,
               start: np.ndarray | None = None, n_iter: int = FIT_ITERS) -> np.ndarray:
    """Per-rank biases whose top-k selection rates over these tokens approach `target`.

    along: [n_tokens] the tokens' positive share of the routing direction; noise: [n_tokens,
    n_expert]. A rank chosen too rarely moves up by the gap between target and rate in
    logit units, with a step that shrinks as the fit settles."""
    n = len(along)
    lo, hi = 0.5 / n, 1 - 0.5 / n
    goal = np.clip(target, lo, hi)
    scale = float(noise.std()) / float(along.mean())
    bias = np.zeros(len(target)) if start is None else start.copy()
    best, best_err = bias.copy(), np.inf
    for it in range(n_iter):
        rate = np.clip(selection_rates(bias, along, noise, k), lo, hi)
        err = float(np.abs(rate - goal).max())
        if err < best_err:
            best, best_err = bias.copy(), err
        if err < FIT_TOL:
            break
        step = scale * (0.6 if it < n_iter // 2 else 0.25)
        bias += step * (np.log(goal / (1 - goal)) - np.log(rate / (1 - rate)))
        bias -= bias.mean()
    return best


def fit_layer(rd: RoutingDesign, sample: np.ndarray, w: np.ndarray, k: int, *,
              start: np.ndarray | None = None) -> np.ndarray:
    """Biases (rank order) of one layer's router with noise directions `w` [n_expert, n_dims].

    sample: [n_tokens, n_dims] the routing dims of embedding rows as written (dequantized)."""
    along = sample @ rd.direction
    if (along <= 0).any():
        raise SynthError("routing design: a token has no positive share of the routing "
                         "direction (embedding too small for the routing dims)")
    noise = SPREAD * (sample @ w.T)
    n_iter = FIT_ITERS if start is None else REFIT_ITERS
    return fit_biases(along, noise, rd.probabilities, k, start=start, n_iter=n_iter)


def router_matrix(rd: RoutingDesign, cfg: SynthConfig, layer: int, w: np.ndarray,
                  bias: np.ndarray, norm_weight: np.ndarray) -> np.ndarray:
    """`ffn_gate_inp` of `layer`: [n_expert, n_embd] float32, zero outside the routing dims."""
    rows = bias[:, None] * rd.direction[None, :] + SPREAD * w  # rank order
    out = np.zeros((cfg.n_expert, cfg.n_embd), np.float32)
    out[rd.ranks[layer][:, None], rd.dims[None, :]] = rows / norm_weight[rd.dims][None, :]
    return out
