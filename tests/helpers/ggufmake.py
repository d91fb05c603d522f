"""A minimal qwen3moe GGUF writer for tests of the model file itself (not the synthesizer):
F32 tensors of a given shape, with hooks to drop, reshape or retype pieces."""

from __future__ import annotations

import numpy as np
import gguf

SMALL = dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_expert=4,
             n_expert_used=2, n_ff=32, n_vocab=50, n_ctx=128)


def tensor_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """numpy-order shapes of every tensor of a qwen3moe model with config `c`."""
    e, v, hd = c["n_embd"], c["n_vocab"], c["head_dim"]
    q, kv, ff, ne = c["n_head"] * hd, c["n_head_kv"] * hd, c["n_ff"], c["n_expert"]
    s = {"token_embd.weight": (v, e), "output_norm.weight": (e,), "output.weight": (v, e)}
    for i in range(c["n_layer"]):
        b = f"blk.{i}."
        s.update({
            b + "attn_norm.weight": (e,), b + "attn_q.weight": (q, e), b + "attn_k.weight": (kv, e),
            b + "attn_v.weight": (kv, e), b + "attn_q_norm.weight": (hd,),
            b + "attn_k_norm.weight": (hd,), b + "attn_output.weight": (e, q),
            b + "ffn_norm.weight": (e,), b + "ffn_gate_inp.weight": (ne, e),
            b + "ffn_gate_exps.weight": (ne, ff, e), b + "ffn_up_exps.weight": (ne, ff, e),
            b + "ffn_down_exps.weight": (ne, e, ff),
        })
    return s


def write(path, *, arch="qwen3moe", drop_keys=(), drop_tensors=(), reshape=None, retype=None,
          seed=0, **over) -> str:
    """Write a small model; `reshape` maps name -> numpy shape, `retype` name -> (ggml type, raw)."""
    c = dict(SMALL, **over)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    keys = {
        "block_count": c["n_layer"], "context_length": c["n_ctx"],
        "embedding_length": c["n_embd"], "attention.head_count": c["n_head"],
        "attention.head_count_kv": c["n_head_kv"], "attention.key_length": c["head_dim"],
        "attention.value_length": c["head_dim"], "expert_count": c["n_expert"],
        "expert_used_count": c["n_expert_used"], "expert_feed_forward_length": c["n_ff"],
    }
    for k, val in keys.items():
        if k not in drop_keys:
            w.add_uint32(f"{arch}.{k}", val)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    for name, shape in tensor_shapes(c).items():
        if name in drop_tensors:
            continue
        if retype and name in retype:
            t, raw = retype[name]
            w.add_tensor(name, raw, raw_dtype=t)
            continue
        shape = (reshape or {}).get(name, shape)
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)
