"""The backend registry: which engine runs a model (`--backend cpu|cuda|auto`).

Each backend is a module, imported only when chosen, that provides

    unavailable_reason() -> str | None     # None when it can run on this machine
    engine_factory(model: ModelFile, *, max_context, cb=None) -> Callable[[], Engine]

(the factory loads the weights once; every call makes an engine with its own KV cache, as the
server's slots need). A backend whose module is absent from this build is reported as such.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Callable

from strata.engine.engine import Callback, Engine
from strata.errors import StrataError
from strata.gguf import ModelFile


class BackendError(StrataError):
    """The requested backend cannot run here; the message says why and what can."""


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    module: str
    description: str


# `auto` takes the first one that is available, so the fastest comes first.
BACKENDS: tuple[Backend, ...] = (
    Backend("cuda", "strata.engine.cuda", "the CUDA engine (GPU)"),
    Backend("cpu", "strata.engine.cpu", "the CPU engine (numba)"),
)
CHOICES = ("auto",) + tuple(b.name for b in BACKENDS)


def _module(backend: Backend) -> ModuleType | None:
    try:
        return importlib.import_module(backend.module)
    except ModuleNotFoundError as e:
        if e.name != backend.module:  # the module exists but something it needs does not
            raise
        return None


def _reason(backend: Backend) -> tuple[ModuleType | None, str | None]:
    mod = _module(backend)
    if mod is None:
        return None, f"{backend.description} is not available in this build of strata"
    return mod, mod.unavailable_reason()


def select_backend(name: str) -> tuple[str, ModuleType]:
    """The backend to use for `name` ("auto" or a backend's name): (its name, its module).
    Raises BackendError when the named one cannot run here."""
    if name == "auto":
        reasons = []
        for b in BACKENDS:
            mod, why = _reason(b)
            if why is None:
                return b.name, mod
            reasons.append(f"{b.name}: {why}")
        raise BackendError("no backend can run on this machine (" + "; ".join(reasons) + ")")
    found = next((b for b in BACKENDS if b.name == name), None)
    if found is None:
        raise BackendError(f"unknown backend {name!r} (choose from {', '.join(CHOICES)})")
    mod, why = _reason(found)
    if why is not None:
        others = [b.name for b in BACKENDS if b is not found and _reason(b)[1] is None]
        hint = f"; available here: {', '.join(others)}" if others else ""
        raise BackendError(f"--backend {name}: {why}{hint}")
    return found.name, mod


def engine_factory(model: ModelFile, backend: str = "auto", *, max_context: int | None = None,
                   cb: Callback | None = None) -> tuple[str, Callable[[], Engine]]:
    """(chosen backend name, a function making engines for `model` on it)."""
    name, mod = select_backend(backend)
    return name, mod.engine_factory(model, max_context=max_context, cb=cb)


def load_engine(model: ModelFile, backend: str = "auto", *, max_context: int | None = None,
                cb: Callback | None = None) -> Engine:
    """One engine for `model` on `backend` (see `select_backend`)."""
    return engine_factory(model, backend, max_context=max_context, cb=cb)[1]()
