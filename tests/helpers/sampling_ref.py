"""A float64 numpy mirror of the on-device sampler's rules (penalty, top-k, top-p, min-p,
temperature, inverse-CDF draw with the sampler's own hash of (seed, step))."""

from __future__ import annotations

import numpy as np

from strata.cuda_kernels.sampling import KMAX, THREADS, uniform


def penalise(logits, hist, rp, last_n, presence=0.0, frequency=0.0):
    """The window's tokens: repeat penalty once each, then minus presence + frequency * count,
    each step rounded to float32 as the device rounds it."""
    out = logits.copy()
    window = hist[max(0, len(hist) - last_n):].tolist()
    for tok in set(window):
        v = out[tok]
        v = v / np.float32(rp) if v > 0 else v * np.float32(rp)
        if presence or frequency:
            v = v - (np.float32(presence) + np.float32(frequency) * np.float32(window.count(tok)))
        out[tok] = v
    return out


def ref_support(lg, *, temperature, top_k, top_p, min_p, with_past=False):
    """(ids, weights): the candidates the device sampler keeps for float64 logits `lg`, best
    first, and their weights at the temperature (not normalised). Top-k 0 with a cut: top-p is
    a share of every token's mass (the device's blocks' masses), and `with_past` adds whether
    the cut lies past the 256 candidates (the device then hands the choice to the host)."""
    k = top_k if 0 < top_k <= KMAX else KMAX
    lg = np.where(np.isnan(lg), -np.inf, lg)  # NaN ranks as -inf, as the device stages it
    order = np.argsort(-lg, kind="stable")[:min(k, lg.size)]
    v = lg[order]
    with np.errstate(invalid="ignore"):  # +inf at the top: exactly 1 each, as the host's
        p = np.where(v == v[0], 1.0, np.exp((v - v[0]) / temperature))
        total = p.sum()
    every = top_k == 0 and k < lg.size
    if every:
        with np.errstate(invalid="ignore"):
            total = np.where(lg == v[0], 1.0, np.exp((lg - v[0]) / temperature)).sum()
    keep, cum = len(v), 0.0
    for i in range(len(v)):
        if i > 0 and (p[i] < min_p or cum >= top_p * total):
            keep = i
            break
        cum += p[i]
    past = every and keep == len(v) and cum < top_p * total
    return (order[:keep], p[:keep], past) if with_past else (order[:keep], p[:keep])


def ref_sample(logits, hist, *, temperature, top_k, top_p, min_p, repeat_penalty,
               penalty_last_n, seed, block=THREADS, presence_penalty=0.0, frequency_penalty=0.0):
    """The token the sampler must append for float32 `logits` after history `hist` (where a
    top-k 0 cut lies past its 256 candidates, the best one: see `ref_past`)."""
    lg = penalise(logits, hist, repeat_penalty, min(penalty_last_n, block), presence_penalty,
                  frequency_penalty).astype(np.float64)
    if temperature <= 0:
        return int(np.argmax(lg))
    if top_k == 0 and top_p >= 1.0 and min_p <= 0.0:  # every token, in id order
        lg = np.where(np.isnan(lg), -np.inf, lg)  # NaN ranks as -inf, as the device stages it
        ids = np.arange(lg.size)
        with np.errstate(invalid="ignore"):  # +inf at the top: exactly 1 each, as the host's
            w = np.where(lg == lg.max(), 1.0, np.exp((lg - lg.max()) / temperature))
    else:
        ids, w, past = ref_support(lg, temperature=temperature, top_k=top_k, top_p=top_p,
                                   min_p=min_p, with_past=True)
        if past:
            return int(ids[0])
    target = uniform(seed, len(hist)) * w.sum()
    return int(ids[np.argmax(np.cumsum(w) > target)])


def ref_past(logits, hist, *, temperature, top_k, top_p, min_p, repeat_penalty,
             penalty_last_n, seed=0, block=THREADS, presence_penalty=0.0, frequency_penalty=0.0):
    """Whether the device flags its draw for the host (a top-k 0 cut past its candidates)."""
    if temperature <= 0 or top_k != 0 or (top_p >= 1.0 and min_p <= 0.0):
        return False
    lg = penalise(logits, hist, repeat_penalty, min(penalty_last_n, block), presence_penalty,
                  frequency_penalty).astype(np.float64)
    return ref_support(lg, temperature=temperature, top_k=0, top_p=top_p, min_p=min_p,
                       with_past=True)[2]
