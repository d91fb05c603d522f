"""The tensor table of a synthetic model: names, shapes, types, and how each one's values are
made (their spread, and which rows stay zero to keep the routing dimensions clean)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from strata.quant.types import quant_type
from strata.synth.config import SynthConfig
from strata.synth.mixes import tensor_type

# Spreads. The hidden state has RMS about 1 (embedding noise of std 1); q/k/v and the expert
# gate/up projections map it to values of std ~1; each attention and each MoE output adds a
# residual update of std ~LAYER_GAIN, large enough that a wrong attention or expert shows in the
# logits, small enough that 94 layers stay far from overflow; the head gives logits of std ~2.
LAYER_GAIN = 0.3
SILU_GLU_RMS = 0.6  # RMS of silu(a) * b for a, b ~ N(0, 1)
LOGIT_STD = 2.0
FILLER_LOGIT = -16.0  # about where the head puts unused filler tokens: never sampled
NORM_GAIN_RANGE = (0.8, 1.2)  # norm weights: uniform in this range

# kinds of value generation
EMBED, ROUTER, NORM, RANDOM, HEAD = "embed", "router", "norm", "random", "head"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor to write. `shape` is numpy order (outermost first); `zero_routing_rows`
    means rows whose output dimension is a routing dim are written as zeros."""

    name: str
    role: str
    layer: int  # -1 for global tensors
    type_name: str
    shape: tuple[int, ...]
    kind: str
    std: float = 0.0
    zero_routing_rows: bool = False

    @property
    def ne(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))

    @property
    def row_len(self) -> int:
        return self.shape[-1]

    @property
    def n_rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def row_bytes(self) -> int:
        return quant_type(self.type_name).row_bytes(self.row_len)

    @property
    def n_bytes(self) -> int:
        return self.row_bytes * self.n_rows


def final_rms(cfg: SynthConfig, n_routing_dims: int, amplitude: float) -> float:
    """Rough RMS of the last hidden state: the embedding's (noise 1, plus the routing direction
    over its dims) and two updates of ~LAYER_GAIN per layer, all independent."""
    var = 1.0 + amplitude ** 2 * n_routing_dims / cfg.n_embd + 2 * cfg.n_layer * LAYER_GAIN ** 2
    return math.sqrt(var)


def _block_specs(cfg: SynthConfig, mix: str, i: int) -> list[TensorSpec]:
    d, q, kv, ff, ne = cfg.n_embd, cfg.q_dim, cfg.kv_dim, cfg.n_ff_expert, cfg.n_expert
    one = 1.0 / math.sqrt(d)
    p = f"blk.{i}."

    def mat(role: str, shape: tuple[int, ...], std: float, zero: bool = False) -> TensorSpec:
        return TensorSpec(p + role + ".weight", role, i, tensor_type(mix, role, i, cfg), shape,
                          RANDOM, std, zero)

    def norm(role: str, n: int) -> TensorSpec:
        return TensorSpec(p + role + ".weight", role, i, "F32", (n,), NORM)

    return [
        norm("attn_norm", d),
        mat("attn_q", (q, d), one),
        mat("attn_k", (kv, d), one),
        mat("attn_v", (kv, d), one),
        norm("attn_q_norm", cfg.head_dim),
        norm("attn_k_norm", cfg.head_dim),
        mat("attn_output", (d, q), LAYER_GAIN / math.sqrt(q), zero=True),
        norm("ffn_norm", d),
        TensorSpec(p + "ffn_gate_inp.weight", "ffn_gate_inp", i, "F32", (ne, d), ROUTER),
        mat("ffn_gate_exps", (ne, ff, d), one),
        mat("ffn_up_exps", (ne, ff, d), one),
        mat("ffn_down_exps", (ne, d, ff), LAYER_GAIN / (SILU_GLU_RMS * math.sqrt(ff)),
            zero=True),
    ]


def tensor_specs(cfg: SynthConfig, mix: str) -> list[TensorSpec]:
    """Every tensor of the model, in file order."""
    specs = [TensorSpec("token_embd.weight", "token_embd", -1,
                        tensor_type(mix, "token_embd", -1, cfg), (cfg.n_vocab, cfg.n_embd),
                        EMBED)]
    for i in range(cfg.n_layer):
        specs += _block_specs(cfg, mix, i)
    specs.append(TensorSpec("output_norm.weight", "output_norm", -1, "F32", (cfg.n_embd,), NORM))
    specs.append(TensorSpec("output.weight", "output", -1, tensor_type(mix, "output", -1, cfg),
                            (cfg.n_vocab, cfg.n_embd), HEAD, LOGIT_STD / math.sqrt(cfg.n_embd)))
    return specs
