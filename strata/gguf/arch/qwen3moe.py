"""qwen3moe: the tensor names and metadata keys llama.cpp writes for Qwen3-MoE models.

Per block: RMSNorm, q/k/v/o projections with per-head RMSNorm on q and k (before neox RoPE), a
softmax router over all experts, top-k experts renormalised, SwiGLU experts stored stacked as 3-D
tensors [n_expert, rows, cols].
"""

from __future__ import annotations

from strata.gguf.errors import TensorError
from strata.gguf.metadata import Metadata
from strata.gguf.shape import LayerTensors, ModelShape
from strata.gguf.tensors import TensorInfo

NAME = "qwen3moe"

# Per-block dense tensors, in the order the forward uses them.
DENSE_NAMES = (
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
    "ffn_norm", "ffn_gate_inp",
)
EXPERT_NAMES = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
DEFAULT_ROPE_FREQ_BASE = 10000.0  # llama.cpp's default when the key is absent
DEFAULT_RMS_EPS = 1e-6


def _expect(tensors: dict[str, TensorInfo], path: str, name: str,
            ne: tuple[int, ...]) -> TensorInfo:
    t = tensors.get(name)
    if t is None:
        raise TensorError(path, f"missing tensor {name!r} (expected dimensions {list(ne)})")
    if t.ne != ne:
        raise TensorError(path, f"tensor {name!r} has dimensions {list(t.ne)}, the metadata "
                                f"implies {list(ne)}")
    return t


def build_shape(meta: Metadata, tensors: dict[str, TensorInfo], file_bytes: int) -> ModelShape:
    """The `ModelShape` of a qwen3moe file; every tensor checked against the metadata."""
    p = meta.path
    k = NAME + "."
    n_layer = meta.int(k + "block_count")
    n_embd = meta.int(k + "embedding_length")
    n_head = meta.int(k + "attention.head_count")
    n_head_kv = meta.int(k + "attention.head_count_kv")
    head_dim = meta.int(k + "attention.key_length", default=n_embd // max(n_head, 1))
    v_dim = meta.int(k + "attention.value_length", default=head_dim)
    n_expert = meta.int(k + "expert_count")
    n_expert_used = meta.int(k + "expert_used_count")
    n_ff = meta.int(k + "expert_feed_forward_length")
    n_ctx_train = meta.int(k + "context_length")
    rope_base = meta.float(k + "rope.freq_base", default=DEFAULT_ROPE_FREQ_BASE)
    eps = meta.float(k + "attention.layer_norm_rms_epsilon", default=DEFAULT_RMS_EPS)

    def bad(key: str, why: str) -> TensorError:
        return TensorError(p, f"metadata {k + key}: {why}")

    if n_layer <= 0 or n_embd <= 0 or n_head <= 0 or head_dim <= 0 or n_ff <= 0:
        raise bad("block_count/embedding_length/...", "dimensions must be positive")
    if n_head_kv <= 0 or n_head % n_head_kv:
        raise bad("attention.head_count_kv", f"{n_head_kv} does not divide head_count {n_head}")
    if v_dim != head_dim:
        raise bad("attention.value_length", f"{v_dim} differs from key_length {head_dim}")
    if not 0 < n_expert_used <= n_expert:
        raise bad("expert_used_count", f"{n_expert_used} not in 1..expert_count ({n_expert})")

    embd = tensors.get("token_embd.weight")
    if embd is None or len(embd.ne) != 2 or embd.ne[0] != n_embd:
        raise TensorError(p, f"tensor 'token_embd.weight' missing or not [{n_embd}, n_vocab]")
    n_vocab = embd.ne[1]
    glob = [embd, _expect(tensors, p, "output_norm.weight", (n_embd,))]
    if "output.weight" in tensors:  # absent: the head is tied to the embedding
        glob.append(_expect(tensors, p, "output.weight", (n_embd, n_vocab)))

    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    dense_ne = {
        "attn_norm": (n_embd,), "attn_q": (n_embd, q_dim), "attn_k": (n_embd, kv_dim),
        "attn_v": (n_embd, kv_dim), "attn_q_norm": (head_dim,), "attn_k_norm": (head_dim,),
        "attn_output": (q_dim, n_embd), "ffn_norm": (n_embd,), "ffn_gate_inp": (n_embd, n_expert),
    }
    expert_ne = {
        "ffn_gate_exps": (n_embd, n_ff, n_expert), "ffn_up_exps": (n_embd, n_ff, n_expert),
        "ffn_down_exps": (n_ff, n_embd, n_expert),
    }
    for name in tensors:  # a block past block_count would be ignored: the file is inconsistent
        parts = name.split(".")
        if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() \
                and int(parts[1]) >= n_layer:
            raise TensorError(p, f"tensor {name!r} is in block {int(parts[1])}, but "
                                 f"{k}block_count is {n_layer} (blocks 0..{n_layer - 1})")
    layers = []
    for i in range(n_layer):
        dense = tuple(_expect(tensors, p, f"blk.{i}.{n}.weight", dense_ne[n]) for n in DENSE_NAMES)
        experts = tuple(_expect(tensors, p, f"blk.{i}.{n}.weight", expert_ne[n])
                        for n in EXPERT_NAMES)
        layers.append(LayerTensors(dense=dense, experts=experts))

    return ModelShape(
        arch=NAME, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, n_expert=n_expert, n_expert_used=n_expert_used, n_ff_expert=n_ff,
        n_vocab=n_vocab, n_ctx_train=n_ctx_train, rope_freq_base=rope_base, rms_norm_eps=eps,
        global_tensors=tuple(glob), layers=tuple(layers), file_bytes=file_bytes,
        tensors=dict(tensors),
    )
