"""Test models and loaders for the CUDA engine: small synthetic qwen3moe files whose dimensions
the GPU kernels take (the decode attention reads head_dim / 32 values per lane, an even count
dividing 32: head_dim 64) and are still odd (width 768 = three 256-blocks, q_dim 384 not a
multiple of 256, 6 query heads over 2 KV heads, 16 experts top-4, expert width 256, a 640-token
vocabulary), and a loader with explicit plan knobs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from strata.synth import PRESETS, write_model

CONFIG = dataclasses.replace(
    PRESETS["tiny"], name="gpu-engine-test", n_layer=2, n_embd=768, n_head=6, n_head_kv=2,
    head_dim=64, n_expert=16, n_expert_used=4, n_ff_expert=256, n_vocab=640, n_ctx_train=1024)

# Four llama.cpp mixes and the two whose expert gate and up differ in format (the engine's
# mixed-layout kernels: strata.engine.cuda.mixed).
MIXES = ("Q8_0", "Q4_K_M", "Q4_0", "IQ4_XS", "IQ_MIX", "LEGACY_MIX")
PROMPT = [17, 402, 5, 311, 77, 260, 9, 600, 33]


def model_path(folder: Path, mix: str, *, config=CONFIG, seed: int = 11) -> Path:
    path = Path(folder) / f"{config.name}-{mix}-{seed}.gguf"
    if not path.is_file():
        write_model(path, config, mix=mix, seed=seed, skew=3.0, progress=False)
    return path


def load(path, *, graph: bool = True, backend=None, adaptive_cache: bool = False,
         prompt_steps: int | None = None, **knobs):
    """A `CudaModel` of `path` and one `CudaEngine` on it; `knobs` are `PlanOptions` fields
    (default: a 512-token context, a 1 MiB ring, loans allowed down to the last slot);
    `prompt_steps`: the engine option (None: the plan's estimate, 0 in the test suite)."""
    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.cuda.model import CudaModel
    from strata.engine.cuda.options import CudaOptions
    from strata.gguf import open_model
    from strata.plan.options import PlanOptions

    base = dict(max_context=512, ring_mib=1, lend_floor_slots=0)
    base.update(knobs)
    opts = CudaOptions(plan=PlanOptions(**base), graph=graph, progress=False,
                       adaptive_cache=adaptive_cache, prompt_steps=prompt_steps)
    m = CudaModel(open_model(path), opts, backend=backend)
    return m, CudaEngine(m, use_graph=graph)

# Qwen3-235B-A22B's expert widths (n_embd 4096, expert width 1536, top-8): one token's 8 x 1536
# f32 h is 48 KiB, past one block's shared memory, so the decode down projection runs in groups
# of experts. Two layers, a small vocabulary and 16 experts keep the float64 reference quick.
WIDE = dataclasses.replace(
    CONFIG, name="gpu-wide-experts", n_layer=2, n_embd=4096, n_head=8, n_head_kv=2,
    head_dim=64, n_expert=16, n_expert_used=8, n_ff_expert=1536)
