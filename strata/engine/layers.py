"""`Layers`: the operations a backend implements so the shared forward (`qwen3moe.forward`)
can run on it. Activations are the backend's own arrays (numpy on the CPU, device arrays on a
GPU); weights are named by their GGUF tensor names without the `.weight` suffix."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

Act = Any  # a backend activation: [n_tok, width] f32


class Layers(Protocol):
    """One backend's implementation of the forward's building blocks."""

    def embed(self, tokens: np.ndarray) -> Act:
        """Rows `tokens` of token_embd: [n_tok, n_embd]."""

    def rms_norm(self, x: Act, weight: str) -> Act:
        """RMSNorm of every row of x with the norm weight `weight`."""

    def linear(self, x: Act, weight: str) -> Act:
        """x @ W.T for the (quantized) matrix `weight`: [n_tok, n_out]."""

    def qk_norm_rope(self, q: Act, k: Act, layer: int, positions: np.ndarray) -> tuple[Act, Act]:
        """Per-head RMSNorm of q and k (attn_q_norm / attn_k_norm), then NeoX RoPE at
        `positions`; returns them as [n_tok, n_head(_kv), head_dim]."""

    def attention(self, q: Act, k: Act, v: Act, layer: int, start: int) -> Act:
        """Store k, v at positions start.. in the KV cache, then causal GQA attention of q over
        positions 0..start+t: [n_tok, n_head * head_dim]."""

    def route(self, x: Act, layer: int) -> tuple[Act, Act, Act]:
        """Router logits [n_tok, n_expert], then the top-k experts of the softmax, renormalised:
        (logits, ids [n_tok, k], weights [n_tok, k])."""

    def experts(self, x: Act, layer: int, ids: Act, weights: Act) -> Act:
        """sum_j weights[:, j] * SwiGLU expert ids[:, j] (x): [n_tok, n_embd]."""

    def add(self, a: Act, b: Act) -> Act:
        """a + b (a may be overwritten)."""

    def last_row(self, x: Act) -> Act:
        """The last token's row, [1, width]."""

    def to_host(self, x: Act) -> np.ndarray:
        """A float32 numpy copy (or view) of x."""
