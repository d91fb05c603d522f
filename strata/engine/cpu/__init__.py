"""The CPU backend: numba kernels over the quantized blocks of the mapped GGUF file.

Backend interface (see `strata.engine.backends`): `unavailable_reason()`, `engine_factory()`.
The CPU pool for the GPU engine's missed experts is `CpuExperts`.
"""

from __future__ import annotations

import os
from typing import Callable

# Idle OpenMP threads sleep instead of spinning between kernels: on a machine whose cores are
# shared (other processes, other engines) spinning workers steal the time the others need and a
# parallel region costs milliseconds instead of microseconds. Read once, when numba first starts
# its thread pool; a value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from strata.engine.cpu.engine import CpuEngine
from strata.engine.cpu.experts import CpuExperts
from strata.engine.cpu.layers import CpuModel
from strata.engine.engine import Callback
from strata.gguf import ModelFile

__all__ = ["CpuEngine", "CpuExperts", "CpuModel", "engine_factory", "unavailable_reason"]


def unavailable_reason() -> str | None:
    """The CPU backend runs wherever strata installs."""
    return None


def engine_factory(model: ModelFile, *, max_context: int | None = None,
                   cb: Callback | None = None) -> Callable[[], CpuEngine]:
    """Map the weights once; each call returns a new engine (own KV cache) sharing them."""
    cpu_model = CpuModel(model)

    def make() -> CpuEngine:
        return CpuEngine(cpu_model, max_context=max_context, cb=cb)

    return make
