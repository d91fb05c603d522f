"""`CudaOptions`: how the CUDA engine loads (the plan's knobs, a budget cap, graphs on/off)."""

from __future__ import annotations

from dataclasses import dataclass, field

from strata.errors import StrataError
from strata.plan.options import PlanOptions

# decode misses: the GPU reads mapped host memory | the CPU pool | both, split by a share
MISS_PATHS = ("mapped", "cpu", "hybrid")
# measured on the H200 (Q8_0 30B-A3B shape): mapped reads 21.7 / 40.7 / 54.3 tok/s against the
# CPU pool's 7.4 / 10.3 / 6.8 at hit rates 0 / 51 / 66% (bench/results/2026-11-30_engine_cuda_*);
# 4 of its layers: mapped 257.5 / 565.5, hybrid 153.7 / 204.0, CPU pool 89.9 / 169.6 tok/s at 0 /
# 64% hits (2026-11-30_engine_cuda_miss_hybrid.json): the pool's per-layer host round trip costs
# more than the CPU's bandwidth adds
MISS_PATH_DEFAULT = "mapped"
# the prompt path's attention kernels (cuda_kernels.attention_prefill's variants)
PREFILL_ATTENTION = ("gqa", "base")


class CudaEngineError(StrataError):
    """The CUDA engine cannot run this model or configuration (the message says why)."""


@dataclass(frozen=True, slots=True)
class CudaOptions:
    """`plan`: the VRAM knobs; `gpu_mem`: a budget cap in bytes (an H200 standing in for a
    smaller card); `graph`: decode steps as CUDA-graph replays (False: the same kernels launched
    one by one); `profile_path`: routing counts (.npy) to rank the expert cache by; `miss_path`:
    where decode computes the experts missed in VRAM — "mapped" (the MoE kernel reads them from
    mapped host memory), "cpu" (the CPU engine's expert pool, beside the GPU's hits) or "hybrid"
    (both at once: the pool computes `miss_share` of each layer's misses, the GPU reads the
    rest; `miss_share` None: chosen from the two paths' measured rates); `adaptive_cache`:
    after each prompt, swap cache slots towards the experts its routing used most
    (`strata.experts.adaptive`); `prefill_sync_every_layer`: the prompt path reads every
    layer's expert counts back before its MoE, also where every expert is already in VRAM (the
    path before `strata.engine.cuda.prefill.counts_can_wait`, kept for A/B runs);
    `prefill_attention`: the prompt path's causal attention kernel, "gqa" (each K/V tile shared
    by a KV head's query heads: 2.1-2.4x the other at 4K-16K f16 on the H200) or "base" (a
    block per query head; kept for A/B runs); `prefill_small_tiles`: a chunk whose experts get
    a few rows each runs its grouped GEMMs on 16-row tiles (`tile_shapes.SMALL_TC_TILE`;
    off until timed on a GPU); `prompt_steps`: prompts of up to this many tokens run as decode
    steps, one token each, instead of the prompt path (0: never; None: the plan's estimate of
    where steps win, `strata.engine.cuda.prompt_steps`)."""

    plan: PlanOptions = field(default_factory=PlanOptions)
    gpu_mem: int | None = None
    device: int = 0
    graph: bool = True
    profile_path: str | None = None
    progress: bool = True
    tensor_cores: bool = True
    miss_path: str = MISS_PATH_DEFAULT
    miss_share: float | None = None
    adaptive_cache: bool = False
    prefill_sync_every_layer: bool = False
    prefill_attention: str = "gqa"
    prefill_small_tiles: bool = False
    prompt_steps: int | None = None

    def __post_init__(self) -> None:
        if self.gpu_mem is not None and self.gpu_mem <= 0:
            raise CudaEngineError(f"--gpu-mem must be positive, got {self.gpu_mem} bytes")
        if self.device < 0:
            raise CudaEngineError(f"--device must be >= 0, got {self.device}")
        if self.miss_path not in MISS_PATHS:
            raise CudaEngineError(f"--miss-path {self.miss_path!r}: expected one of "
                                  f"{', '.join(MISS_PATHS)}")
        if self.prefill_attention not in PREFILL_ATTENTION:
            raise CudaEngineError(f"prefill_attention {self.prefill_attention!r}: expected one "
                                  f"of {', '.join(PREFILL_ATTENTION)}")
        if self.miss_share is not None and not 0.0 <= self.miss_share <= 1.0:
            raise CudaEngineError(f"--miss-share {self.miss_share}: expected the CPU's fraction "
                                  f"of the misses, 0 to 1")
        if self.miss_share is not None and self.miss_path != "hybrid":
            raise CudaEngineError(f"--miss-share applies to --miss-path hybrid, not "
                                  f"{self.miss_path!r}")
        if self.prompt_steps is not None and self.prompt_steps < 0:
            raise CudaEngineError(f"--prompt-steps {self.prompt_steps}: expected a token count "
                                  f">= 0 (0: prompts never run as decode steps)")
        if self.plan.batch != 1:
            raise CudaEngineError(f"--batch {self.plan.batch}: the CUDA engine decodes one "
                                  f"sequence (batch 1)")
