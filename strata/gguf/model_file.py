"""`ModelFile`: a GGUF file opened for use — header parsed, tensor table checked, data mapped.

Opening reads only the header: the tensor data is memory-mapped and never touched, so planning
a 100 GB file takes a fraction of a second.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from strata.gguf.arch import REGISTRY
from strata.gguf.errors import (
    ModelFileError, TruncatedError, UnknownArchitectureError, UnsupportedQuantError,
)
from strata.gguf.header import Header
from strata.gguf.metadata import Metadata
from strata.gguf.shape import ModelShape
from strata.gguf.tensors import TensorInfo
from strata.quant.types import TYPES

# `strata synth --header-only` marks its files so (strata.synth.metadata.KEY_HEADER_ONLY, kept
# apart: reading a model never imports the synthesizer): a full-size file whose data region is a
# hole (all zeros). `strata plan` prices them; running one would compute on zeros: junk.
HEADER_ONLY_KEY = "strata.synth.header_only"


def _tensor_table(header: Header) -> dict[str, TensorInfo]:
    path, file_bytes = header.path, header.file_bytes
    table: dict[str, TensorInfo] = {}
    for rt in header.tensors:
        name, ne = rt.name, rt.ne
        if name in table:
            raise ModelFileError(path, f"tensor {name!r} appears twice in the tensor table")
        q = TYPES.get(rt.ggml_type)
        if q is None:
            raise UnsupportedQuantError(path, f"tensor {name!r} has unknown GGML type "
                                              f"{rt.ggml_type}")
        if any(d <= 0 for d in ne):
            raise ModelFileError(path, f"tensor {name!r} has a non-positive dimension {list(ne)}")
        if ne[0] % q.block_size:
            raise ModelFileError(path, f"tensor {name!r}: row length {ne[0]} is not a multiple of "
                                       f"{q.name}'s block of {q.block_size}")
        n_bytes = q.tensor_bytes(ne)
        offset = header.data_start + rt.rel_offset
        if offset + n_bytes > file_bytes:
            raise TruncatedError(path, f"tensor {name!r} data ends at byte {offset + n_bytes:,} "
                                       f"but the file has {file_bytes:,} bytes (truncated?)")
        table[name] = TensorInfo(name, rt.ggml_type, ne, offset, n_bytes)
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
            if p.is_dir():
                raise ModelFileError(self.path, "is a directory, not a GGUF file")
            if p.exists():
                raise ModelFileError(self.path, "not a regular file (a GGUF file is needed)")
            raise ModelFileError(self.path, "no such file")
        header = Header(self.path)
        self.file_bytes = header.file_bytes
        self._data = header.data()  # [file_bytes] uint8, read-only mapping
        self._map = header.map
        self.metadata = Metadata(header)
        self.tensors = _tensor_table(header)
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

    @property
    def header_only(self) -> bool:
        """Whether the file has a header and no weights (`strata synth --header-only`)."""
        return bool(self.metadata.get(HEADER_ONLY_KEY, False))

    def check_weights(self) -> None:
        """Refuse a header-only file where it would run: its weights are all zero, so what it
        generates is junk. Called by what runs a model (the CPU engine's loader, the commands),
        not by `raw`: planning reads only the header, and the CUDA fit benchmarks
        (`strata.bench.engine_cuda_suite`'s OOM matrix) run header-only files on purpose."""
        if self.header_only:
            raise ModelFileError(self.path, "header-only: it has no weights; it is for "
                                            "`strata plan`")

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the mapping: [n_bytes] uint8."""
        t = self.tensors.get(name)
        if t is None:
            raise ModelFileError(self.path, f"no tensor named {name!r}")
        return self._data[t.offset:t.offset + t.n_bytes]

    def prefetch(self, name: str, lo: int = 0, hi: int | None = None) -> None:
        """Ask the OS to read bytes [lo, hi) of tensor `name` into the page cache now
        (`madvise(MADV_WILLNEED)`: its readahead in large requests, while the caller copies what
        came before). A hint: a platform without it, or a refusal, changes nothing but speed."""
        advice = getattr(mmap, "MADV_WILLNEED", None)
        if advice is None:
            return
        t = self.tensors[name]
        hi = t.n_bytes if hi is None else hi
        if not 0 <= lo <= hi <= t.n_bytes:
            raise ValueError(f"bytes {lo}..{hi} are not within {name!r} ({t.n_bytes} bytes)")
        start = (t.offset + lo) // mmap.PAGESIZE * mmap.PAGESIZE  # madvise takes whole pages
        if t.offset + hi > start:
            try:
                self._map.madvise(advice, start, t.offset + hi - start)
            except (OSError, ValueError):
                pass

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
