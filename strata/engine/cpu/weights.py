"""`QMatrix`: a weight matrix as the CPU kernels read it — the GGUF file's own bytes, as rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.gguf import ModelFile
from strata.quant.blocks import block_decoder


@dataclass(frozen=True, slots=True)
class QMatrix:
    """`rows`: uint8[n_rows, row_bytes], a read-only view of the mapped file (stacked experts
    are n_expert * n_out rows); each row holds `n_in` values of GGML type `fmt`."""

    name: str
    rows: np.ndarray
    fmt: int
    block_size: int
    n_in: int
    n_out: int  # rows per matrix (per expert for a stacked tensor)
    n_expert: int = 1

    def __post_init__(self) -> None:
        if self.rows.dtype != np.uint8 or self.rows.ndim != 2:
            raise ValueError(f"{self.name}: rows must be uint8[n_rows, row_bytes]")
        if self.rows.shape[0] != self.n_out * self.n_expert:
            raise ValueError(f"{self.name}: {self.rows.shape[0]} rows for {self.n_expert} x "
                             f"{self.n_out}")

    @property
    def n_bytes(self) -> int:
        return self.rows.nbytes

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert's matrix (the whole matrix when it is not stacked)."""
        return self.rows.nbytes // self.n_expert


def qmatrix(model: ModelFile, name: str) -> QMatrix:
    """The tensor `name` of `model` as a `QMatrix` (2-D, or 3-D stacked experts)."""
    t = model.tensors[name]
    rows = np.asarray(model.raw_rows(name))  # a plain ndarray view: one kernel type for all
    rows.flags.writeable = False
    n_expert = t.ne[2] if len(t.ne) == 3 else 1
    return QMatrix(name, rows, t.ggml_type, block_decoder(t.ggml_type).block_size,
                   n_in=t.ne[0], n_out=t.ne[1], n_expert=n_expert)
