"""A float64 numpy forward of qwen3moe, written from the Hugging Face Qwen3MoE formulas, for tests.

Independent of the engine by construction: every tensor is dequantized with gguf-py
(`gguf.quants.dequantize`, never strata's decoders), the file is read with gguf-py's own
`GGUFReader`, and the math is plain numpy in float64 with no KV cache (every call recomputes the
whole sequence). Formulas (Qwen3MoeForCausalLM):

  h = embed[tokens]
  per layer:  x = rmsnorm(h) * w_attn_norm
              q, k, v = x Wq^T, x Wk^T, x Wv^T;  q, k = rmsnorm per head * q_norm / k_norm
              q, k = rope_neox(q, k, pos; theta = freq_base)
              a = softmax(q k^T / sqrt(head_dim) + causal mask) v   (kv head = h // n_rep)
              h = h + a Wo^T
              x = rmsnorm(h) * w_ffn_norm
              p = softmax(x Wr^T);  top-k of p, renormalised to sum 1
              h = h + sum_j p_j * W2_j (silu(W1_j x) * W3_j x)
  logits = (rmsnorm(h) * w_out_norm) Wout^T

`RefModel.load(path, x8=True)` also rounds the activations of every product with a K-quant
weight (Q4_K, Q5_K, Q6_K) to 8 bits per 32 values (scale = absmax / 127, code = round(x /
scale)): the rounding the CPU engine documents for those formats, so that a tight bound still
holds; the plain reference checks the issue's 2% bound on top.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.quants import dequantize

X8_TYPES = frozenset({T.Q4_K, T.Q5_K, T.Q6_K})


def round_x8(x: np.ndarray) -> np.ndarray:
    """x [..., n] (n a multiple of 32) rounded to 8 bits per 32 values along the last axis."""
    b = x.reshape(*x.shape[:-1], -1, 32)
    d = np.abs(b).max(axis=-1, keepdims=True) / 127.0
    q = np.rint(np.divide(b, d, out=np.zeros_like(b), where=d > 0))
    return (q * d).reshape(x.shape)


def _f64(tensor) -> np.ndarray:
    """A gguf-py ReaderTensor as float64 in numpy order (outermost dimension first)."""
    shape = tuple(int(d) for d in reversed(tensor.shape))
    return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float64).reshape(shape)


def _meta(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise KeyError(key)
        return default
    return f.parts[f.data[0]][0].item()


@dataclass
class RefModel:
    """All tensors of a qwen3moe file as float64 arrays, and its hyper-parameters."""

    t: dict[str, np.ndarray]
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert_used: int
    freq_base: float
    eps: float
    x8: frozenset = frozenset()  # tensors whose products round their activations (round_x8)
    # the rounding those products use: round_x8, or a stand-in with the same contract that also
    # finds or flips near-ties (helpers.ties)
    rounder: Callable[[np.ndarray], np.ndarray] | None = None

    @classmethod
    def load(cls, path, *, x8: bool = False) -> RefModel:
        r = GGUFReader(str(path))
        arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
        k = arch + "."
        t = {x.name.removesuffix(".weight"): _f64(x) for x in r.tensors}
        n_embd = int(_meta(r, k + "embedding_length"))
        n_head = int(_meta(r, k + "attention.head_count"))
        return cls(
            t=t, n_layer=int(_meta(r, k + "block_count")), n_head=n_head,
            n_head_kv=int(_meta(r, k + "attention.head_count_kv")),
            head_dim=int(_meta(r, k + "attention.key_length", n_embd // n_head)),
            n_expert_used=int(_meta(r, k + "expert_used_count")),
            freq_base=float(_meta(r, k + "rope.freq_base", 10000.0)),
            eps=float(_meta(r, k + "attention.layer_norm_rms_epsilon", 1e-6)),
            x8=frozenset(x.name.removesuffix(".weight") for x in r.tensors
                         if x8 and x.tensor_type in X8_TYPES),
        )

    def mm(self, name: str, x: np.ndarray, expert: int | None = None) -> np.ndarray:
        """x @ W^T for tensor `name` (one expert's matrix of a stacked tensor)."""
        w = self.t[name] if expert is None else self.t[name][expert]
        if name in self.x8:
            x = (self.rounder or round_x8)(x)
        return x @ w.T


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_neox(x: np.ndarray, pos: np.ndarray, base: float) -> np.ndarray:
    """x: [n_tok, n_heads, head_dim]; HF's rotate_half form."""
    hd = x.shape[-1]
    inv = 1.0 / base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.outer(pos.astype(np.float64), inv)
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], axis=-1)
    return x * cos + rot * sin


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _attention(m: RefModel, x: np.ndarray, il: int, pos: np.ndarray) -> np.ndarray:
    t, b = m.t, f"blk.{il}."
    n = x.shape[0]
    q = m.mm(b + "attn_q", x).reshape(n, m.n_head, m.head_dim)
    k = m.mm(b + "attn_k", x).reshape(n, m.n_head_kv, m.head_dim)
    v = m.mm(b + "attn_v", x).reshape(n, m.n_head_kv, m.head_dim)
    q = rope_neox(rms_norm(q, t[b + "attn_q_norm"], m.eps), pos, m.freq_base)
    k = rope_neox(rms_norm(k, t[b + "attn_k_norm"], m.eps), pos, m.freq_base)
    rep = m.n_head // m.n_head_kv
    k = np.repeat(k, rep, axis=1)  # HF repeat_kv: head h reads kv head h // rep
    v = np.repeat(v, rep, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(m.head_dim)
    scores = scores + np.triu(np.full((n, n), -np.inf), 1)
    out = np.einsum("hqk,khd->qhd", _softmax(scores), v).reshape(n, -1)
    return m.mm(b + "attn_output", out)


def _moe(m: RefModel, x: np.ndarray, il: int) -> np.ndarray:
    b = f"blk.{il}."
    probs = _softmax(m.mm(b + "ffn_gate_inp", x))  # [n_tok, n_expert]
    out = np.zeros_like(x)
    for i in range(x.shape[0]):
        top = np.argsort(-probs[i], kind="stable")[:m.n_expert_used]
        w = probs[i, top] / probs[i, top].sum()
        for e, we in zip(top, w, strict=True):
            g = m.mm(b + "ffn_gate_exps", x[i], e)
            u = m.mm(b + "ffn_up_exps", x[i], e)
            out[i] += we * m.mm(b + "ffn_down_exps", g / (1.0 + np.exp(-g)) * u, e)
    return out


def forward(m: RefModel, tokens) -> np.ndarray:
    """float64 logits [n_tok, n_vocab] of every position of `tokens` (no cache)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    pos = np.arange(tokens.size)
    h = m.t["token_embd"][tokens]
    for il in range(m.n_layer):
        b = f"blk.{il}."
        h = h + _attention(m, rms_norm(h, m.t[b + "attn_norm"], m.eps), il, pos)
        h = h + _moe(m, rms_norm(h, m.t[b + "ffn_norm"], m.eps), il)
    return m.mm("output" if "output" in m.t else "token_embd",
                rms_norm(h, m.t["output_norm"], m.eps))


def greedy(m: RefModel, prompt, n: int) -> tuple[list[int], np.ndarray]:
    """n greedy tokens after `prompt`, and the logits [n_vocab] that chose the first."""
    seq = list(prompt)
    first = None
    for _ in range(n):
        logits = forward(m, seq)[-1]
        if first is None:
            first = logits
        seq.append(int(np.argmax(logits)))
    return seq[len(prompt):], first
