"""The GGUF model file: header, tensor table, architecture registry, `ModelShape`."""

from strata.gguf.errors import (
    MissingKeyError, ModelFileError, NotGGUFError, TensorError, TruncatedError,
    UnknownArchitectureError, UnsupportedQuantError,
)
from strata.gguf.model_file import ModelFile, open_model
from strata.gguf.shape import LayerTensors, ModelShape
from strata.gguf.tensors import TensorInfo

__all__ = [
    "LayerTensors", "MissingKeyError", "ModelFile", "ModelFileError", "ModelShape",
    "NotGGUFError", "TensorError", "TensorInfo", "TruncatedError", "UnknownArchitectureError",
    "UnsupportedQuantError", "open_model",
]
