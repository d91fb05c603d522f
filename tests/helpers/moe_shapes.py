"""`ModelShape`s of real qwen3moe models with exact byte tables, built without a file: planner
tests price them directly (pure and fast). Byte sizes come from `strata.quant.types`."""

from __future__ import annotations

from strata.gguf.arch.qwen3moe import DENSE_NAMES, EXPERT_NAMES
from strata.gguf.shape import LayerTensors, ModelShape
from strata.gguf.tensors import TensorInfo
from strata.quant.types import quant_type

QWEN3_30B = dict(n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_expert=128,
                 n_expert_used=8, n_ff=768, n_vocab=151936, n_ctx=262144)
QWEN3_235B = dict(n_layer=94, n_embd=4096, n_head=64, n_head_kv=4, head_dim=128, n_expert=128,
                  n_expert_used=8, n_ff=1536, n_vocab=151936, n_ctx=262144)


def more_bits(i: int, n: int) -> bool:
    """The layers a Q4_K_M file stores attn_v and ffn_down in Q6_K (llama.cpp's recipe)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _type(mix: str, name: str, layer: int, n_layer: int) -> str:
    if name.endswith("norm") or name == "ffn_gate_inp":
        return "F32"
    if mix == "q8_0":
        return "Q8_0"
    if mix == "f32":
        return "F32"
    if name == "output":
        return "Q6_K"
    if name in ("attn_v", "ffn_down_exps") and more_bits(layer, n_layer):
        return "Q6_K"
    return "Q4_K"


def qwen3moe(mix: str = "q4_k_m", *, tied: bool = False, **over) -> ModelShape:
    """A qwen3moe shape (default: Qwen3-30B-A3B dims) in `mix`: q4_k_m, q8_0 or f32."""
    c = dict(QWEN3_30B, **over)
    e, hd, n_l = c["n_embd"], c["head_dim"], c["n_layer"]
    q, kv, ff, ne = c["n_head"] * hd, c["n_head_kv"] * hd, c["n_ff"], c["n_expert"]
    offset = [0]

    def t(name: str, base: str, layer: int, ne_: tuple[int, ...]) -> TensorInfo:
        qt = quant_type(_type(mix, base, layer, n_l))
        n = qt.tensor_bytes(ne_)
        info = TensorInfo(name, qt.ggml_type, ne_, offset[0], n)
        offset[0] += n
        return info

    glob = [t("token_embd.weight", "token_embd", 0, (e, c["n_vocab"])),
            t("output_norm.weight", "output_norm", 0, (e,))]
    if not tied:
        glob.append(t("output.weight", "output", 0, (e, c["n_vocab"])))
    dense_ne = {"attn_norm": (e,), "attn_q": (e, q), "attn_k": (e, kv), "attn_v": (e, kv),
                "attn_q_norm": (hd,), "attn_k_norm": (hd,), "attn_output": (q, e),
                "ffn_norm": (e,), "ffn_gate_inp": (e, ne)}
    exp_ne = {"ffn_gate_exps": (e, ff, ne), "ffn_up_exps": (e, ff, ne),
              "ffn_down_exps": (ff, e, ne)}
    layers = []
    for i in range(n_l):
        dense = tuple(t(f"blk.{i}.{n}.weight", n, i, dense_ne[n]) for n in DENSE_NAMES)
        experts = tuple(t(f"blk.{i}.{n}.weight", n, i, exp_ne[n]) for n in EXPERT_NAMES)
        layers.append(LayerTensors(dense, experts))
    tensors = {x.name: x for x in glob}
    for layer in layers:
        tensors.update({x.name: x for x in layer.dense + layer.experts})
    return ModelShape(
        arch="qwen3moe", n_layer=n_l, n_embd=e, n_head=c["n_head"], n_head_kv=c["n_head_kv"],
        head_dim=hd, n_expert=ne, n_expert_used=c["n_expert_used"], n_ff_expert=ff,
        n_vocab=c["n_vocab"], n_ctx_train=c["n_ctx"], rope_freq_base=1e6, rms_norm_eps=1e-6,
        global_tensors=tuple(glob), layers=tuple(layers), file_bytes=offset[0], tensors=tensors)


def tiny(**over) -> ModelShape:
    """A small shape for arena tests (fits a fake device of a few MiB)."""
    c = dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_expert=8,
             n_expert_used=2, n_ff=32, n_vocab=64, n_ctx=4096)
    c.update(over)
    return qwen3moe("f32", **c)
