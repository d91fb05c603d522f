"""Engines: the forward pass of each architecture, written once over a backend's layers.

`Engine` is the interface every backend's engine implements; `load_engine` / `engine_factory`
pick a backend (`strata.engine.backends`); `Sampler` and `generate` drive any engine.
Importing this package imports no backend: each is loaded when chosen.
"""

from strata.engine.backends import BackendError, engine_factory, load_engine, select_backend
from strata.engine.engine import ContextFullError, Engine, EngineInputError
from strata.engine.generation import Generation, generate
from strata.engine.sampler import Sampler, SamplingParams

__all__ = [
    "BackendError", "ContextFullError", "Engine", "EngineInputError", "Generation", "Sampler",
    "SamplingParams", "engine_factory", "generate", "load_engine", "select_backend",
]
