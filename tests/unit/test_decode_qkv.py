"""The decode step's attention projections: the RMSNorm fused into one lane matvec launch (Q4_K_M
layers too: q, k Q4_K and v Q6_K through the mixed kernel; no RMSNorm launch), one per format for
a pair without a mixed kernel, and the separate RMSNorm + matvecs where a weight has no lane
kernel; the q, k, v values against a float64 reference either way (of the x the CPU engine's
8-bit rounding gives, for the formats whose lane matvecs dot 8-bit x: `lanes_x8`)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import strata.engine.cuda.decode as decode_mod
from helpers.kernel_blocks import dots_x8, random_rows, reference, x_seen
from strata.engine.cuda.decode import DecodeStep

N_EMBD, N_Q, N_KV = 256, 8, 4
EPS = 1e-6


def _step(fmts, rng):
    """A DecodeStep over just what `_qkv` reads: one layer's norm and q/k/v weights."""
    x = (rng.standard_normal((1, N_EMBD)) * 3.0).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, N_EMBD).astype(np.float32)
    matrices, refs = {}, {}
    for name, fmt, n in zip(("attn_q", "attn_k", "attn_v"), fmts, (N_Q, N_KV, N_KV)):
        rows = random_rows(fmt, n, N_EMBD, rng)
        matrices[f"blk.0.{name}"] = SimpleNamespace(data=rows.reshape(-1), ggml_type=fmt)
        refs[name] = reference(fmt, rows, N_EMBD)
    step = DecodeStep.__new__(DecodeStep)
    step.m = SimpleNamespace(matrices=matrices, norms={"blk.0.attn_norm": nw},
                             shape=SimpleNamespace(rms_norm_eps=EPS))
    step.x, step.x1 = x, x.reshape(N_EMBD)
    step.xn = np.full((1, N_EMBD), np.nan, np.float32)
    step.xn1 = step.xn.reshape(N_EMBD)
    step.q = np.full((1, N_Q), np.nan, np.float32)
    step.k = np.full((1, N_KV), np.nan, np.float32)
    step.v = np.full((1, N_KV), np.nan, np.float32)
    x64 = x[0].astype(np.float64)
    xn = x64 / np.sqrt(np.mean(x64 * x64) + EPS) * nw
    # 8-bit x: the normed vector in float32 (as the kernel computes it), then rounded
    xq = x_seen((x[0] * np.float32(1 / np.sqrt(np.mean(x64 * x64) + EPS))) * nw, True)
    fmt_bytes = {f: sum(m.data.nbytes for m, g in zip(matrices.values(), fmts) if g == f)
                 for f in fmts}  # a launch per format (or the mixed one, deciding per format)
    return step, {n: r @ (xq if dots_x8(f, fmt_bytes[f]) else xn)
                  for (n, r), f in zip(refs.items(), fmts)}


def _counting(monkeypatch):
    calls = []
    for name in ("rms_norm", "matvec", "matvec_pair", "matvec_normed"):
        real = getattr(decode_mod, name)

        def call(*args, _real=real, _name=name, **kwargs):
            calls.append(_name if _name != "matvec_normed" else (_name, len(args[3])))
            return _real(*args, **kwargs)
        monkeypatch.setattr(decode_mod, name, call)
    return calls


@pytest.mark.parametrize("fmts,launches", [
    (("Q4_K", "Q4_K", "Q6_K"), [("matvec_normed", 3)]),
    (("Q4_K", "Q4_K", "IQ4_XS"), [("matvec_normed", 2), ("matvec_normed", 1)]),
    (("Q8_0", "Q8_0", "Q8_0"), [("matvec_normed", 3)]),
    (("F16", "Q8_0", "Q8_0"), ["rms_norm", "matvec", "matvec_pair"]),
])
def test_qkv_launches_and_values(monkeypatch, fmts, launches):
    step, want = _step(fmts, np.random.default_rng(len(launches)))
    calls = _counting(monkeypatch)
    step._qkv("blk.0.", 0)
    assert calls == launches
    for name, got in (("attn_q", step.q), ("attn_k", step.k), ("attn_v", step.v)):
        rel = np.linalg.norm(got[0] - want[name]) / np.linalg.norm(want[name])
        assert rel < 1e-5, (name, rel)
