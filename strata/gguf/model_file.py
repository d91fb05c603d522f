"""`ModelFile`: a GGUF file opened for use — header parsed, tensor table checked, data mapped.

Opening reads only the header: the tensor data is memory-mapped and never touched, so planning
a 100 GB file takes a fraction of a second.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType

from strata.gguf.arch import REGISTRY
from strata.gguf.errors import (
    ModelFileError, NotGGUFError, TruncatedError, UnknownArchitectureError, UnsupportedQuantError,
)
from strata.gguf.metadata import Metadata
from strata.gguf.shape import ModelShape
from strata.gguf.tensors import TensorInfo
from strata.quant.types import TYPES

GGUF_MAGIC = b"GGUF"


class _HeaderReader(GGUFReader):
    """gguf-py's reader, stopped before it builds numpy views of the tensor data: we only need
    each tensor's type, dimensions and offset, and check its byte range against the file."""

    def _build_tensors(self, start_offs, fields):  # noqa: D401 - gguf-py's hook
        self.tensor_fields = fields
        self.tensor_data_start = int(start_offs)
        self.tensors = []


def _tensor_table(path: str, reader: _HeaderReader, file_bytes: int) -> dict[str, TensorInfo]:
    table: dict[str, TensorInfo] = {}
    for f in reader.tensor_fields:
        _name_len, name_data, _n_dims, dims, raw_type, rel_offset = f.parts
        name = bytes(name_data).decode("utf-8", errors="replace")
        if name in table:
            raise ModelFileError(path, f"tensor {name!r} appears twice in the tensor table")
        ggml_type = int(raw_type[0])
        q = TYPES.get(ggml_type)
        if q is None:
            raise UnsupportedQuantError(path, f"tensor {name!r} has unknown GGML type {ggml_type}")
        ne = tuple(int(d) for d in dims)
        if any(d <= 0 for d in ne):
            raise ModelFileError(path, f"tensor {name!r} has a non-positive dimension {list(ne)}")
        if ne[0] % q.block_size:
            raise ModelFileError(path, f"tensor {name!r}: row length {ne[0]} is not a multiple of "
                                       f"{q.name}'s block of {q.block_size}")
        n_bytes = q.tensor_bytes(ne)
        offset = reader.tensor_data_start + int(rel_offset[0])
        if offset + n_bytes > file_bytes:
            raise TruncatedError(path, f"tensor {name!r} data ends at byte {offset + n_bytes:,} "
                                       f"but the file has {file_bytes:,} bytes (truncated?)")
        table[name] = TensorInfo(name, ggml_type, ne, offset, n_bytes)
    return table


def _check_supported(path: str, table: dict[str, TensorInfo]) -> None:
    for t in table.values():
        q = TYPES[t.ggml_type]
        if not q.supported:
            raise UnsupportedQuantError(
                path, f"tensor {t.name!r} is {q.name}, which Strata does not support "
                      f"(supported: see `strata.quant.types.SUPPORTED_NAMES`)")


class ModelFile:
    """A GGUF model: `shape` (what the planner prices), `metadata`, and raw tensor bytes."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = str(path)
        p = Path(self.path)
        if not p.is_file():
            raise ModelFileError(self.path, "no such file")
        self.file_bytes = p.stat().st_size
        with open(p, "rb") as fh:
            magic = fh.read(4)
        if magic != GGUF_MAGIC:
            raise NotGGUFError(self.path, f"not a GGUF file (starts with {magic!r}, "
                                          f"expected {GGUF_MAGIC!r})")
        try:
            reader = _HeaderReader(self.path, "r")
        except (IndexError, ValueError, KeyError, OverflowError, UnicodeDecodeError) as e:
            # gguf-py reads past the mapped bytes of a cut header as short arrays, then fails on
            # whatever comes next; any such failure means the header itself is incomplete.
            raise TruncatedError(self.path, f"the GGUF header is truncated or corrupt ({e})") from e
        self._data: np.memmap = reader.data  # [file_bytes] uint8, read-only mapping
        self.metadata = Metadata(self.path, reader.fields)
        self.tensors = _tensor_table(self.path, reader, self.file_bytes)
        arch_name = self.metadata.str("general.architecture")
        arch = REGISTRY.get(arch_name)
        if arch is None:
            raise UnknownArchitectureError(
                self.path, f"architecture {arch_name!r} is not supported "
                           f"(supported: {', '.join(sorted(REGISTRY))})")
        _check_supported(self.path, self.tensors)
        self.shape: ModelShape = arch.build_shape(self.metadata, self.tensors, self.file_bytes)

    @property
    def arch(self) -> str:
        return self.shape.arch

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the mapping: [n_bytes] uint8."""
        t = self.tensors.get(name)
        if t is None:
            raise ModelFileError(self.path, f"no tensor named {name!r}")
        return self._data[t.offset:t.offset + t.n_bytes]

    def raw_rows(self, name: str) -> np.ndarray:
        """The tensor's bytes as rows: [n_rows, row_bytes] uint8 (stacked experts flattened)."""
        t = self.tensors[name]
        return self.raw(name).reshape(t.n_rows, t.row_bytes)

    def expert_raw(self, name: str, expert: int) -> np.ndarray:
        """One expert's slice of a stacked expert tensor: [rows, row_bytes] uint8."""
        t = self.tensors[name]
        n_expert = t.ne[-1]
        if not 0 <= expert < n_expert:
            raise IndexError(f"expert {expert} out of range 0..{n_expert - 1} in {name!r}")
        per = t.n_bytes // n_expert
        rows = t.n_rows // n_expert
        return self._data[t.offset + expert * per:t.offset + (expert + 1) * per].reshape(
            rows, t.row_bytes)

    def type_name(self, name: str) -> str:
        return GGMLQuantizationType(self.tensors[name].ggml_type).name


def open_model(path: str | os.PathLike[str]) -> ModelFile:
    """Open and check a GGUF model file; raises a `ModelFileError` subclass naming the problem."""
    return ModelFile(path)
