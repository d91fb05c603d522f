"""`SynthConfig`: every dimension of a synthetic qwen3moe model, and the named presets.

The presets copy the public shapes of real models (so byte counts, the planner's prices and the
kernels' shapes are real); `tiny` is small enough for CI and picks dimensions that catch
power-of-two assumptions where the block sizes allow it.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

from strata.synth.errors import SynthError

# Every row length must be a whole number of 32-value blocks: the smallest block of any mix
# (Q8_0, Q4_0, Q5_0, IQ4_NL), so that every mix can be written with llama.cpp's fallbacks.
ROW_MULTIPLE = 32
MIN_VOCAB = 512  # 256 byte tokens + learned merges + specials need room


@dataclass(frozen=True, slots=True)
class SynthConfig:
    """The shape of a synthetic qwen3moe model (names as in `strata.gguf.ModelShape`)."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    n_ff_expert: int
    n_vocab: int
    n_ctx_train: int
    rope_freq_base: float
    rms_norm_eps: float

    def __post_init__(self) -> None:
        for f in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_expert",
                  "n_expert_used", "n_ff_expert", "n_vocab", "n_ctx_train"):
            v = getattr(self, f)
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 1:
                raise SynthError(f"{self.name}: {f} must be a positive integer, got {v!r}")
        if self.n_head % self.n_head_kv:
            raise SynthError(f"{self.name}: n_head_kv ({self.n_head_kv}) must divide "
                             f"n_head ({self.n_head})")
        if self.n_expert_used > self.n_expert:
            raise SynthError(f"{self.name}: n_expert_used ({self.n_expert_used}) exceeds "
                             f"n_expert ({self.n_expert})")
        if self.head_dim % 2:
            raise SynthError(f"{self.name}: head_dim ({self.head_dim}) must be even for RoPE")
        for f, v in (("n_embd", self.n_embd), ("n_head * head_dim", self.q_dim),
                     ("n_ff_expert", self.n_ff_expert)):
            if v % ROW_MULTIPLE:
                raise SynthError(f"{self.name}: {f} = {v} must be a multiple of {ROW_MULTIPLE} "
                                 f"(the smallest quant block)")
        if self.n_embd < 4 * ROW_MULTIPLE:
            raise SynthError(f"{self.name}: n_embd ({self.n_embd}) must be at least "
                             f"{4 * ROW_MULTIPLE}")
        if self.n_vocab < MIN_VOCAB:
            raise SynthError(f"{self.name}: n_vocab ({self.n_vocab}) must be at least "
                             f"{MIN_VOCAB}")
        if not self.rope_freq_base > 0 or not self.rms_norm_eps > 0:
            raise SynthError(f"{self.name}: rope_freq_base and rms_norm_eps must be positive")

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv

    def with_layers(self, n_layer: int) -> SynthConfig:
        """The same model with `n_layer` blocks (depth only; every other dimension kept)."""
        return dataclasses.replace(self, n_layer=n_layer)


PRESETS: dict[str, SynthConfig] = {
    # a few MB: 6 q heads over 2 kv heads (groups of 3), q_dim 768 != n_embd, expert ff 192
    # (not a multiple of 256: K/IQ mixes exercise llama.cpp's fallback on ffn_down), top-3 of 8,
    # a vocabulary padded to 1152.
    "tiny": SynthConfig(
        name="tiny", n_layer=4, n_embd=256, n_head=6, n_head_kv=2, head_dim=128,
        n_expert=8, n_expert_used=3, n_ff_expert=192, n_vocab=1152, n_ctx_train=4096,
        rope_freq_base=1e6, rms_norm_eps=1e-6,
    ),
    "qwen3-30b-a3b": SynthConfig(
        name="qwen3-30b-a3b", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128,
        n_expert=128, n_expert_used=8, n_ff_expert=768, n_vocab=151936, n_ctx_train=40960,
        rope_freq_base=1e6, rms_norm_eps=1e-6,
    ),
    "qwen3-235b-a22b": SynthConfig(
        name="qwen3-235b-a22b", n_layer=94, n_embd=4096, n_head=64, n_head_kv=4, head_dim=128,
        n_expert=128, n_expert_used=8, n_ff_expert=1536, n_vocab=151936, n_ctx_train=40960,
        rope_freq_base=1e6, rms_norm_eps=1e-6,
    ),
}


def preset(name: str) -> SynthConfig:
    """Look a preset up by name; a clear error listing the known ones."""
    cfg = PRESETS.get(name)
    if cfg is None:
        raise SynthError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    return cfg
