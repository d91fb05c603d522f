"""Errors raised while reading a GGUF file. Each names the file and what was expected."""

from __future__ import annotations

from strata.errors import StrataError


class ModelFileError(StrataError, ValueError):
    """A GGUF file Strata cannot use; the message names the file and the problem."""

    def __init__(self, path: str, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


class NotGGUFError(ModelFileError):
    """The file does not start with the GGUF magic."""


class TruncatedError(ModelFileError):
    """The header, or some tensor's data, runs past the end of the file."""


class UnknownArchitectureError(ModelFileError):
    """`general.architecture` names an architecture with no entry in the registry."""


class MissingKeyError(ModelFileError):
    """A metadata key the architecture needs is absent (or has the wrong type)."""


class TensorError(ModelFileError):
    """A tensor is missing, or its shape disagrees with the metadata."""


class UnsupportedQuantError(ModelFileError):
    """A tensor is stored in a GGML type Strata does not read."""
