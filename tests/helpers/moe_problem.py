"""A small random MoE problem (weights in one buffer at scattered offsets) and its float64
reference, shared by the simulator tests of the prefill matmul and the GPU tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from helpers.kernel_blocks import random_rows, reference

ALIGN = 256  # every matrix starts on a 256-byte boundary of the buffer, as cache/ring slots do


@dataclass
class MoeProblem:
    x: np.ndarray          # [n_tok, d] f32
    ids: np.ndarray        # [n_tok, k] int32
    w: np.ndarray          # [n_tok, k] f32
    buf: np.ndarray        # uint8 weight buffer
    base: dict             # "gate"/"up"/"down" -> int64 [n_exp] byte offsets
    mats: dict             # "gate"/"up"/"down" -> float64 [n_exp, rows, cols] (dequantized)
    types: dict            # "gate"/"up"/"down" -> ggml type


def make_problem(rng, *, n_tok, k_top, n_exp, d, ff, gate_type, down_type, skew=False):
    """Random activations, routing (optionally skewed onto few experts) and expert weights."""
    p = np.arange(n_exp, 0, -1.0) ** 3 if skew else np.ones(n_exp)
    ids = np.stack([rng.choice(n_exp, size=k_top, replace=False, p=p / p.sum())
                    for _ in range(n_tok)]).astype(np.int32)
    w = rng.uniform(0.1, 1.0, size=(n_tok, k_top)).astype(np.float32)
    shapes = {"gate": (ff, d, gate_type), "up": (ff, d, gate_type), "down": (d, ff, down_type)}
    chunks, base, mats, cursor = [], {k: np.zeros(n_exp, np.int64) for k in shapes}, {}, 0
    for name, (rows, cols, t) in shapes.items():
        mats[name] = np.zeros((n_exp, rows, cols))
    for e in rng.permutation(n_exp):  # experts land in the buffer out of order
        for name, (rows, cols, t) in shapes.items():
            gap = ALIGN * int(rng.integers(0, 3))
            raw = random_rows(t, rows, cols, rng)
            pad = (-(cursor + gap)) % ALIGN
            chunks.append(rng.integers(0, 256, gap + pad, dtype=np.uint8))
            cursor += gap + pad
            base[name][e] = cursor
            chunks.append(raw.reshape(-1))
            cursor += raw.size
            mats[name][e] = reference(t, raw, cols)
    buf = np.concatenate(chunks + [np.zeros(64, np.uint8)])
    # activations scaled so x @ W^T is O(1), as after an RMSNorm: nothing leaves f16 range
    scale = 1.0 / (np.sqrt(d) * np.sqrt(np.mean(mats["gate"] ** 2)))
    x = (rng.standard_normal((n_tok, d)) * scale).astype(np.float32)
    return MoeProblem(x, ids, w, buf, base, mats, {k: v[2] for k, v in shapes.items()})


def silu(v):
    return v / (1.0 + np.exp(-v))


def reference_moe(pr: MoeProblem, *, half: bool):
    """(h per entry [n_tok*k, ff], out [n_tok, d]) in float64; `half` rounds what the tensor-core
    path rounds to f16 (activations, weights, the SwiGLU output)."""
    r16 = (lambda a: a.astype(np.float16).astype(np.float64)) if half else (lambda a: a)
    x = r16(pr.x.astype(np.float64))
    n_tok, k = pr.ids.shape
    h = np.zeros((n_tok * k, pr.mats["gate"].shape[1]))
    out = np.zeros((n_tok, pr.mats["down"].shape[1]))
    for t in range(n_tok):
        for s in range(k):
            e = pr.ids[t, s]
            hv = r16(silu(x[t] @ r16(pr.mats["gate"][e]).T) * (x[t] @ r16(pr.mats["up"][e]).T))
            h[t * k + s] = hv
            out[t] += pr.w[t, s] * (hv @ r16(pr.mats["down"][e]).T)
    return h, out


def rel_err(got, ref):
    return float(np.linalg.norm(np.asarray(got, np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))
