"""The CUDA backend: the plan-driven single-GPU engine.

Loading (`CudaModel`): plan (with `--gpu-mem` as a budget cap) -> the arena, one allocation ->
dense weights copied in through pinned staging -> every expert in a registered, mapped host
store -> the expert cache filled in rank order (routing profile, else the file's skew metadata,
else uniform). Decode (`DecodeStep`): one step of kernels reading all changing state from device
memory, captured as a CUDA graph per mode and replayed; misses read mapped host memory inside
the MoE kernel. Prefill (`PromptRun`): chunks; grouped expert GEMMs; resident experts in place,
the rest streamed through the ring; borrowed prompt paths lend and refill the cache's tail.

Backend interface (see `strata.engine.backends`): `unavailable_reason()`, `engine_factory()`.
"""

from __future__ import annotations

import sys
from typing import Callable

from strata.engine.cuda.options import CudaEngineError, CudaOptions
from strata.engine.engine import Callback, Engine
from strata.gguf import ModelFile

__all__ = ["CudaEngineError", "CudaOptions", "engine_factory", "load", "unavailable_reason"]


def unavailable_reason() -> str | None:
    """None when a CUDA GPU can run the engine here, else why not."""
    from numba import config

    if config.ENABLE_CUDASIM:
        return "numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): no real GPU to run on"
    try:
        from numba import cuda
        if not cuda.is_available():
            return "no CUDA GPU is visible to numba"
    except Exception as e:  # a broken driver or toolkit install
        return f"numba's CUDA target cannot start ({e})"
    return None


def _log(text: str) -> None:
    print(text, file=sys.stderr)


def load(model: ModelFile, options: CudaOptions | None = None, *, log=_log):
    """A `CudaModel` (the loaded weights, store, cache) for `model`."""
    from strata.engine.cuda.model import CudaModel

    return CudaModel(model, options, log=log)


def engine_factory(model: ModelFile, *, max_context: int | None = None,
                   cb: Callback | None = None,
                   options: CudaOptions | None = None) -> Callable[[], Engine]:
    """Load `model` once by its plan; the returned function makes its one engine (the plan is
    for one sequence: a second call is refused)."""
    if cb is not None:
        raise CudaEngineError("the CUDA engine does not expose per-layer intermediates; use "
                              "--backend cpu to inspect them")
    if options is None:
        from strata.plan.options import PlanOptions
        options = CudaOptions(plan=PlanOptions(max_context=max_context))
    from strata.engine.cuda.engine import CudaEngine

    loaded = load(model, options)
    made: list[Engine] = []

    def make() -> Engine:
        if made:
            raise CudaEngineError("the CUDA engine's plan holds one sequence (batch 1); it "
                                  "cannot make a second engine")
        made.append(CudaEngine(loaded, use_graph=options.graph, miss_path=options.miss_path))
        return made[0]

    return make
