"""Small synthetic qwen3moe files for the engine tests, written once per test session.

The shape has no power-of-two dimension the mixes allow: width 768 (three 256-blocks, so the
K-quants stay K-quants), 6 query heads over 2 KV heads (groups of 3) of head_dim 80, 10 experts
with top-3, expert width 256, vocabulary 640."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from strata.synth import PRESETS, write_model

MIXES = ("Q8_0", "Q4_K_M", "IQ_MIX", "LEGACY_MIX")

CONFIG = dataclasses.replace(
    PRESETS["tiny"], name="engine-test", n_layer=2, n_embd=768, n_head=6, n_head_kv=2,
    head_dim=80, n_expert=10, n_expert_used=3, n_ff_expert=256, n_vocab=640, n_ctx_train=512)

PROMPT = [17, 402, 5, 311, 77, 260, 9]


def model_path(folder: Path, mix: str, *, config=CONFIG, seed: int = 7) -> Path:
    """The test model of `mix` in `folder`, written on first use."""
    path = Path(folder) / f"{config.name}-{mix}-{seed}.gguf"
    if not path.is_file():
        write_model(path, config, mix=mix, seed=seed, progress=False)
    return path
