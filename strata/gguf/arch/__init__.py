"""The architecture registry: one module per architecture, one entry here.

An architecture turns a file's metadata and tensor table into a `ModelShape`, checking that every
tensor it needs is present with the shape the metadata implies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from strata.gguf.arch import qwen3moe
from strata.gguf.metadata import Metadata
from strata.gguf.shape import ModelShape
from strata.gguf.tensors import TensorInfo


@dataclass(frozen=True, slots=True)
class Architecture:
    name: str
    build_shape: Callable[[Metadata, dict[str, TensorInfo], int], ModelShape]


REGISTRY: dict[str, Architecture] = {
    qwen3moe.NAME: Architecture(qwen3moe.NAME, qwen3moe.build_shape),
}
