"""Quantization mixes: which GGML type each tensor of a synthetic model gets.

The llama.cpp mixes (`Q8_0`, `Q4_0`, `Q4_K_M`, `IQ4_XS`, `IQ3_S`, `F16`) follow the rules
llama.cpp's quantizer applies to a qwen3moe model without an importance matrix, so a synthetic
file has the same types and bytes as a real quantization of that shape:

* norms (1-D) and the router (`ffn_gate_inp`) stay F32; `F16` makes every other tensor F16;
* `output`: Q8_0 if its rows do not divide the mix's block, else Q6_K unless the mix is Q8_0;
* `attn_v`: Q4_K_M gives Q6_K to layers where `use_more_bits` holds; IQ4_XS gives Q5_K and IQ3_S
  gives Q4_K when n_head / n_head_kv >= 4; with exactly 8 experts every mix stores it Q8_0;
* `attn_k`: Q8_0 with exactly 8 experts;
* `attn_output`: Q5_K with exactly 8 experts (Q4_K_M, IQ4_XS, IQ3_S);
* `ffn_down_exps`: Q4_K_M gives Q6_K where `use_more_bits` holds; IQ4_XS gives Q5_K to the first
  n_layer / 8 layers;
* then the fallback: a K or IQ type on rows that are not a whole number of 256-value blocks
  becomes Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS / IQ3_S / Q2_K / Q3_K -> IQ4_NL
  (and F16 if even that block does not divide the row).

Two mixes of our own cover the remaining formats the CPU engine reads:

* `IQ_MIX`: token_embd IQ4_XS, attn_q IQ3_S, attn_k / attn_v IQ4_NL, attn_output IQ4_XS,
  ffn_gate_exps IQ3_S, ffn_up_exps IQ4_XS, ffn_down_exps IQ4_NL, output IQ4_XS;
* `LEGACY_MIX`: token_embd Q5_0, attn_q Q4_0, attn_k Q5_0, attn_v Q8_0, attn_output F16,
  ffn_gate_exps Q4_0, ffn_up_exps Q5_0, ffn_down_exps Q8_0, output F16.

(Both apply the same fallback; the tiny preset keeps all three IQ types in its experts.)
"""

from __future__ import annotations

from strata.quant.types import quant_type
from strata.synth.config import SynthConfig
from strata.synth.errors import SynthError

# Tensor roles, in the order a block uses them.
ROLES_2D = ("attn_q", "attn_k", "attn_v", "attn_output",
            "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
F32_ROLES = ("attn_norm", "attn_q_norm", "attn_k_norm", "ffn_norm", "ffn_gate_inp",
             "output_norm")

# mix name -> llama.cpp's default type for that file type
LLAMA_MIXES: dict[str, str] = {
    "Q8_0": "Q8_0", "Q4_0": "Q4_0", "Q4_K_M": "Q4_K", "IQ4_XS": "IQ4_XS", "IQ3_S": "IQ3_S",
    "F16": "F16",
}
CUSTOM_MIXES: dict[str, dict[str, str]] = {
    "IQ_MIX": {
        "token_embd": "IQ4_XS", "attn_q": "IQ3_S", "attn_k": "IQ4_NL", "attn_v": "IQ4_NL",
        "attn_output": "IQ4_XS", "ffn_gate_exps": "IQ3_S", "ffn_up_exps": "IQ4_XS",
        "ffn_down_exps": "IQ4_NL", "output": "IQ4_XS",
    },
    "LEGACY_MIX": {
        "token_embd": "Q5_0", "attn_q": "Q4_0", "attn_k": "Q5_0", "attn_v": "Q8_0",
        "attn_output": "F16", "ffn_gate_exps": "Q4_0", "ffn_up_exps": "Q5_0",
        "ffn_down_exps": "Q8_0", "output": "F16",
    },
}
MIXES: tuple[str, ...] = (*LLAMA_MIXES, *CUSTOM_MIXES)

# llama.cpp's `general.file_type` (LLAMA_FTYPE_*) for its own mixes
FILE_TYPES: dict[str, int] = {"F16": 1, "Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15, "IQ3_S": 26,
                              "IQ4_XS": 30}

_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL",
             "IQ3_S": "IQ4_NL", "Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL"}


def check_mix(mix: str) -> str:
    """The mix name, or a `SynthError` listing the known ones."""
    if mix not in MIXES:
        raise SynthError(f"unknown quantization mix {mix!r} (known: {', '.join(MIXES)})")
    return mix


def use_more_bits(i_layer: int, n_layer: int) -> bool:
    """llama.cpp's choice of layers that get a bigger type in the K_M mixes."""
    eighth = n_layer // 8
    return i_layer < eighth or i_layer >= 7 * n_layer // 8 or (i_layer - eighth) % 3 == 2


def _block(type_name: str) -> int:
    return quant_type(type_name).block_size


def fallback(type_name: str, row_len: int) -> str:
    """The type llama.cpp stores when `type_name`'s block does not divide `row_len`."""
    if row_len % _block(type_name) == 0:
        return type_name
    alt = _FALLBACK.get(type_name)
    if alt is None:
        raise SynthError(f"rows of {row_len} values cannot be stored as {type_name}")
    return alt if row_len % _block(alt) == 0 else "F16"


def _llama_rule(mix: str, role: str, layer: int, cfg: SynthConfig) -> str:
    base = LLAMA_MIXES[mix]
    if role == "output":
        if cfg.n_embd % _block(base):
            return "Q8_0"
        return base if base == "Q8_0" else "Q6_K"
    eight = cfg.n_expert == 8
    if role == "attn_v":
        t = base
        if mix == "Q4_K_M" and use_more_bits(layer, cfg.n_layer):
            t = "Q6_K"
        elif mix == "IQ4_XS" and cfg.n_gqa >= 4:
            t = "Q5_K"
        elif mix == "IQ3_S" and cfg.n_gqa >= 4:
            t = "Q4_K"
        return "Q8_0" if eight else t
    if role == "attn_k":
        return "Q8_0" if eight else base
    if role == "attn_output":
        return "Q5_K" if eight and mix in ("Q4_K_M", "IQ4_XS", "IQ3_S") else base
    if role == "ffn_down_exps":
        if mix == "Q4_K_M" and use_more_bits(layer, cfg.n_layer):
            return "Q6_K"
        if mix == "IQ4_XS" and layer < cfg.n_layer // 8:
            return "Q5_K"
    return base


def row_length(role: str, cfg: SynthConfig) -> int:
    """Values per row (GGML ne[0]) of a tensor of `role`."""
    if role == "attn_output":
        return cfg.q_dim
    if role == "ffn_down_exps":
        return cfg.n_ff_expert
    if role in ("attn_q_norm", "attn_k_norm"):
        return cfg.head_dim
    return cfg.n_embd


def tensor_type(mix: str, role: str, layer: int, cfg: SynthConfig) -> str:
    """The GGML type name of the tensor `role` of block `layer` (-1 for global tensors)."""
    check_mix(mix)
    if role in F32_ROLES:
        return "F32"
    if mix == "F16":
        return "F16"
    if mix in CUSTOM_MIXES:
        t = CUSTOM_MIXES[mix][role]
    elif role == "token_embd":
        t = LLAMA_MIXES[mix]
    else:
        t = _llama_rule(mix, role, layer, cfg)
    return fallback(t, row_length(role, cfg))
