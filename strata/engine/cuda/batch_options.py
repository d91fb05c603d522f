"""`BatchOptions`: the batched CUDA engine's options (`strata serve --batch N`), a plan for N
sequences of one context each, every other knob checked as for one sequence."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from strata.cuda_kernels.matvec import MAX_TOKENS
from strata.engine.cuda.options import CudaEngineError, CudaOptions
from strata.gguf import ModelFile
from strata.plan.options import CHUNK_GRID, DEFAULT_MAX_CONTEXT, PlanOptions

MAX_BATCH = MAX_TOKENS  # the small-batch matvec kernels take up to 8 tokens


@dataclass(frozen=True, slots=True)
class BatchOptions(CudaOptions):
    """`CudaOptions` whose plan decodes `plan.batch` sequences (1..8) together; every other knob
    is checked as `CudaOptions` checks it."""

    def __post_init__(self) -> None:
        if not 1 <= self.plan.batch <= MAX_BATCH:
            raise CudaEngineError(f"--batch {self.plan.batch}: the CUDA engine decodes 1 to "
                                  f"{MAX_BATCH} sequences together")
        single = {f.name: getattr(self, f.name) for f in dataclasses.fields(CudaOptions)}
        CudaOptions(**{**single, "plan": dataclasses.replace(self.plan, batch=1)})


def default_context(model: ModelFile) -> int:
    """Per-sequence context when none is asked for: the plan's default for one sequence."""
    train = model.shape.n_ctx_train if model.shape.n_ctx_train > 0 else DEFAULT_MAX_CONTEXT
    return max(CHUNK_GRID, min(train, DEFAULT_MAX_CONTEXT))


def batch_options(model: ModelFile, n_slots: int, plan: PlanOptions | None = None,
                  **cuda_knobs: Any) -> BatchOptions:
    """Options for `n_slots` sequences of `plan.max_context` tokens each: the plan's batch is
    `n_slots`, so its KV holds one region of the context per sequence."""
    plan = plan or PlanOptions()
    ctx = plan.max_context or default_context(model)
    return BatchOptions(plan=dataclasses.replace(plan, batch=n_slots, max_context=ctx),
                        **cuda_knobs)
