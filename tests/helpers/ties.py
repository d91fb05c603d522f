"""The distance from an engine's logits to the 8-bit-rounding float64 reference, up to near-ties.

`RefModel.load(path, x8=True)` rounds the activations of every K-quant product to 8 bits
(code = round(x / scale)), as the CPU engine does. Where x / scale lies within float32's reach
of a half-way point, the engine (float32 state) and the reference (float64) may round it to
different codes, and both are right. On the test models one such code moves the last logits by
up to 1.75e-3 (CI saw exactly that: blk.0's down projection of expert 8 has a value 7.5e-7 of a
step from half-way), about as much as all the rounding together (1.4e-3 on Q4_K_M), so a bound
loose enough for it would no longer tell rounding from not rounding.

So the reference first finds its near-ties (`eps` of the block's rms code from half-way, far
wider than float32's rounding of the engine's state: 3e-7 relative on the logits), then the
effect of flipping each one alone, and the distance is the smallest over every set of flips (the
effects add: each moves the logits by ~1e-3, so pairs interact at ~1e-6). A bound of 1e-5
then holds however a machine's float32 order resolves those ties, and a wrong rounding elsewhere
still fails it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from helpers import reference as ref

EPS = 1e-6
MAX_TIES = 16  # 65,536 sets of flips: beyond that the test input should change, not the bound


class TieRounder:
    """`round_x8` that counts its calls, records the near-ties it meets as (call, index into the
    flattened x), and rounds the listed `flips` to the other neighbouring code."""

    def __init__(self, eps: float = EPS, flips=()):
        self.eps = eps
        self.flips = set(flips)
        self.found: list[tuple[int, int]] = []
        self.n_calls = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        b = x.reshape(*x.shape[:-1], -1, 32)
        d = np.abs(b).max(axis=-1, keepdims=True) / 127.0
        f = np.divide(b, d, out=np.zeros_like(b), where=d > 0)  # codes before rounding
        q = np.rint(f)
        rms = np.sqrt(np.mean(f * f, axis=-1, keepdims=True))
        margin = np.abs(f - np.floor(f) - 0.5)  # 0 at a half-way point
        near = np.flatnonzero((margin < self.eps * rms).reshape(-1))
        self.found += [(self.n_calls, int(i)) for i in near]
        flat_q, flat_f = q.reshape(-1), f.reshape(-1)
        for call, i in self.flips:
            if call == self.n_calls:
                lo = np.floor(flat_f[i])
                flat_q[i] = lo + 1 if flat_q[i] == lo else lo
        self.n_calls += 1
        return (q * d).reshape(x.shape)


def _last_logits(m: ref.RefModel, tokens, rounder: TieRounder) -> np.ndarray:
    return ref.forward(dataclasses.replace(m, rounder=rounder), tokens)[-1]


def x8_distance(logits, m: ref.RefModel, tokens, *, eps: float = EPS,
                max_ties: int = MAX_TIES) -> tuple[float, int]:
    """(relative distance from `logits` [n_vocab] to the x8 reference's last logits under the
    best set of near-tie flips, how many ties were flipped for it). `m`: loaded with x8=True (a
    file without K-quants has no rounding, hence no ties)."""
    probe = TieRounder(eps)
    base = _last_logits(m, tokens, probe)
    ties = probe.found
    assert len(ties) <= max_ties, (
        f"{len(ties)} near-ties in the reference (more than {max_ties}): choose another input")
    effects = np.array([_last_logits(m, tokens, TieRounder(eps, [t])) - base for t in ties])
    effects = effects.reshape(len(ties), base.size)  # [k, n_vocab]
    got = np.asarray(logits, np.float64)
    norm = np.linalg.norm(base)
    sets = (np.arange(2 ** len(ties))[:, None] >> np.arange(len(ties))) & 1  # [2^k, k] 0/1
    best, best_n = np.inf, 0
    step = max(1, 2 ** 22 // base.size)  # candidates per batch: at most 32 MB of float64
    for lo in range(0, len(sets), step):
        chunk = sets[lo:lo + step]
        want = base + chunk.astype(np.float64) @ effects
        dist = np.linalg.norm(got - want, axis=1) / norm
        i = int(np.argmin(dist))
        if dist[i] < best:
            best, best_n = float(dist[i]), int(chunk[i].sum())
    return best, best_n
