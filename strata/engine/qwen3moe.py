"""The qwen3moe forward pass, written once over a backend's `Layers`.

Per block: RMSNorm; q, k, v projections; per-head RMSNorm of q and k; NeoX RoPE; causal GQA
attention through the KV cache; output projection and residual; RMSNorm; a softmax router over
all experts, top-k renormalised; SwiGLU experts weighted and summed; residual. Then the final
RMSNorm and the output head on the last token.
"""

from __future__ import annotations

import numpy as np

from strata.engine.engine import Callback
from strata.engine.layers import Layers
from strata.gguf import ModelShape


def forward(ops: Layers, shape: ModelShape, tokens: np.ndarray, start: int, *,
            cb: Callback | None = None) -> np.ndarray:
    """Run `tokens` (int64[n_tok]) at positions start..start+n_tok-1; returns the last token's
    logits, float32[n_vocab]. `cb(name, layer, tensor)` sees every intermediate."""
    def see(name: str, layer: int, x):
        if cb is not None:
            cb(name, layer, ops.to_host(x))

    positions = np.arange(start, start + tokens.size, dtype=np.int64)
    h = ops.embed(tokens)  # [n_tok, n_embd]
    see("inp_embd", -1, h)
    for il in range(shape.n_layer):
        b = f"blk.{il}."
        x = ops.rms_norm(h, b + "attn_norm")
        see("attn_norm", il, x)
        q = ops.linear(x, b + "attn_q")  # [n_tok, n_head * head_dim]
        k = ops.linear(x, b + "attn_k")  # [n_tok, n_head_kv * head_dim]
        v = ops.linear(x, b + "attn_v")
        see("Qcur", il, q)
        see("Kcur", il, k)
        see("Vcur", il, v)
        q, k = ops.qk_norm_rope(q, k, il, positions)
        see("Qcur_rope", il, q)
        see("Kcur_rope", il, k)
        a = ops.attention(q, k, v, il, start)  # [n_tok, n_head * head_dim]
        see("kqv_out", il, a)
        o = ops.linear(a, b + "attn_output")
        see("attn_out", il, o)
        h = ops.add(h, o)
        see("ffn_inp", il, h)
        x = ops.rms_norm(h, b + "ffn_norm")
        see("ffn_norm", il, x)
        logits, ids, weights = ops.route(x, il)
        see("ffn_moe_logits", il, logits)
        see("ffn_moe_weights", il, weights)
        if cb is not None:
            cb("ffn_moe_topk", il, np.asarray(ops.to_host(ids)))
        m = ops.experts(x, il, ids, weights)
        see("ffn_moe_out", il, m)
        h = ops.add(h, m)
        see("l_out", il, h)
    x = ops.rms_norm(ops.last_row(h), "output_norm")
    see("result_norm", -1, x)
    out = ops.linear(x, "output")  # [1, n_vocab]
    see("result_output", -1, out)
    return ops.to_host(out)[0]
