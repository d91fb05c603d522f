"""The synthetic tiny model through a float64 reference forward: finite, well-spread logits, and
routing that follows the requested skew.

The forward here is written from the Qwen3-MoE formulas (RMSNorm, per-head q/k RMSNorm, neox RoPE,
GQA causal attention, softmax router with renormalised top-k, SwiGLU experts, final norm, head),
reads the file with gguf-py's GGUFReader and dequantizes with gguf-py: nothing of the
synthesizer is reused. It also records which experts each layer selected.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from strata.synth import PRESETS, write_model
from strata.synth.metadata import KEY_EXPERT_RANK, KEY_EXPERT_SHARE
from strata.synth.routing import coverage
from strata.synth.vocab import build_vocab

CFG = PRESETS["tiny"]


def _load(path) -> tuple[dict[str, np.ndarray], GGUFReader]:
    r = GGUFReader(str(path))
    t = {}
    for x in r.tensors:
        shape = tuple(int(d) for d in reversed(x.shape))
        t[x.name.removesuffix(".weight")] = np.asarray(
            dequantize(x.data, x.tensor_type), np.float64).reshape(shape)
    return t, r


def _array_field(reader: GGUFReader, key: str) -> np.ndarray:
    f = reader.fields[key]
    return np.array([f.parts[i][0] for i in f.data])


def _rms(x, w, eps=CFG.rms_norm_eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, base=CFG.rope_freq_base):
    half = x.shape[-1] // 2
    ang = np.outer(pos, base ** (-np.arange(half) / half))  # [n, half]
    c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _attention(t, b, x, pos):
    n, hd = len(x), CFG.head_dim
    q = _rope(_rms((x @ t[b + "attn_q"].T).reshape(n, CFG.n_head, hd), t[b + "attn_q_norm"]), pos)
    k = _rope(_rms((x @ t[b + "attn_k"].T).reshape(n, CFG.n_head_kv, hd), t[b + "attn_k_norm"]),
              pos)
    v = (x @ t[b + "attn_v"].T).reshape(n, CFG.n_head_kv, hd)
    k, v = np.repeat(k, CFG.n_gqa, axis=1), np.repeat(v, CFG.n_gqa, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + np.triu(np.full((n, n), -np.inf), 1)
    return np.einsum("hqk,khd->qhd", _softmax(s), v).reshape(n, -1) @ t[b + "attn_output"].T


def _moe(t, b, x, picks):
    p = _softmax(x @ t[b + "ffn_gate_inp"].T)  # [n, n_expert]
    top = np.argsort(-p, axis=1)[:, :CFG.n_expert_used]  # [n, k]
    picks.append(top)
    out = np.zeros_like(x)
    for i, experts in enumerate(top):
        w = p[i, experts] / p[i, experts].sum()
        for e, we in zip(experts, w, strict=True):
            g, u = t[b + "ffn_gate_exps"][e] @ x[i], t[b + "ffn_up_exps"][e] @ x[i]
            out[i] += we * (t[b + "ffn_down_exps"][e] @ (g / (1 + np.exp(-g)) * u))
    return out


def forward(t, tokens) -> tuple[np.ndarray, list[np.ndarray]]:
    """Logits [n, n_vocab] and, per layer, the selected experts [n, k] of each position."""
    pos, h, picks = np.arange(len(tokens)), t["token_embd"][tokens], []
    for il in range(CFG.n_layer):
        b = f"blk.{il}."
        h = h + _attention(t, b, _rms(h, t[b + "attn_norm"]), pos)
        h = h + _moe(t, b, _rms(h, t[b + "ffn_norm"]), picks)
    return _rms(h, t["output_norm"]) @ t["output"].T, picks


@pytest.fixture(scope="module")
def skewed(tmp_models):
    path = tmp_models / "tiny-skew3.gguf"
    write_model(path, CFG, mix="Q8_0", seed=7, skew=3.0, progress=False)
    return _load(path)


def _route_random_tokens(t, seed: int, n_seq: int = 24, seq_len: int = 32):
    rng = np.random.default_rng(seed)
    counts = np.zeros((CFG.n_layer, CFG.n_expert), np.int64)
    logits = []
    for _ in range(n_seq):
        lg, picks = forward(t, rng.integers(0, CFG.n_vocab, seq_len))
        logits.append(lg)
        for il, top in enumerate(picks):
            counts[il] += np.bincount(top.ravel(), minlength=CFG.n_expert)
    return np.concatenate(logits), counts


@pytest.mark.parametrize("mix", ["Q8_0", "Q4_K_M", "IQ_MIX"])
def test_logits_finite_and_spread(tmp_models, mix):
    path = tmp_models / f"tiny-logits-{mix}.gguf"
    write_model(path, CFG, mix=mix, seed=3, progress=False)
    t, _ = _load(path)
    logits, _ = forward(t, np.random.default_rng(0).integers(0, CFG.n_vocab, 48))
    assert np.isfinite(logits).all()
    assert 0.1 < logits.std() < 100
    assert logits.std(axis=0).mean() > 0.1  # positions differ, not one constant vector
    n_real = build_vocab(CFG.n_vocab).n_real  # unused fillers are never predicted
    assert _softmax(logits)[:, n_real:].sum(axis=1).max() < 1e-3
    assert np.all(logits[:, n_real:].max(axis=1) < logits[:, :n_real].min(axis=1))


def test_measured_coverage_follows_skew3(skewed):
    t, reader = skewed
    _, counts = _route_random_tokens(t, seed=11)
    target = {f: 1 - (1 - f) ** 3 for f in (0.25, 0.5)}
    for il in range(CFG.n_layer):
        for f, want in target.items():
            assert abs(coverage(counts[il], f) - want) < 0.05, (il, f, counts[il])
    # the metadata names each layer's ranking: its hottest experts are the measured hottest
    rank = _array_field(reader, KEY_EXPERT_RANK).reshape(CFG.n_layer, CFG.n_expert)
    for il in range(CFG.n_layer):
        measured = counts[il][rank[il]]  # counts in intended rank order
        assert measured[0] >= measured[CFG.n_expert // 2:].max()
        assert np.all(np.diff(measured[: CFG.n_expert // 2]) <= measured.sum() * 0.05)
    share = _array_field(reader, KEY_EXPERT_SHARE)
    assert abs(share.sum() - 1) < 1e-5 and np.all(np.diff(share) <= 1e-7)


def test_uniform_routing_without_skew(tmp_models):
    path = tmp_models / "tiny-uniform.gguf"
    write_model(path, CFG, mix="Q8_0", seed=5, progress=False)
    t, _ = _load(path)
    _, counts = _route_random_tokens(t, seed=12, n_seq=12)
    for il in range(CFG.n_layer):
        assert abs(coverage(counts[il], 0.5) - 0.5) < 0.06, counts[il]
