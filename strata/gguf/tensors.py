"""The tensor table of a GGUF file: names, GGML types, dimensions and absolute byte ranges."""

from __future__ import annotations

from dataclasses import dataclass

from strata.quant.planar import dense_vram_bytes
from strata.quant.types import QuantType, quant_type


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of the file. `ne` is GGML order (innermost first): a matrix with rows of
    `ne[0]` values and `ne[1]` rows; stacked experts add `ne[2]` = n_expert."""

    name: str
    ggml_type: int
    ne: tuple[int, ...]
    offset: int  # absolute byte offset of the data in the file
    n_bytes: int

    @property
    def qtype(self) -> QuantType:
        return quant_type(self.ggml_type)

    @property
    def np_shape(self) -> tuple[int, ...]:
        """Shape in numpy order (outermost first), in values."""
        return tuple(reversed(self.ne))

    @property
    def row_bytes(self) -> int:
        return self.qtype.row_bytes(self.ne[0])

    @property
    def vram_bytes(self) -> int:
        """Bytes of this tensor as the CUDA engine stores a dense one: n_bytes, or its planar
        layout's (`strata.quant.planar`: whole groups of super-blocks)."""
        return dense_vram_bytes(self.name, self.ggml_type, self.n_bytes)

    @property
    def n_rows(self) -> int:
        n = 1
        for d in self.ne[1:]:
            n *= d
        return n

    def slice_bytes(self, n_slices: int) -> int:
        """Bytes of one of `n_slices` equal outermost slices (one expert of a stacked tensor)."""
        return self.n_bytes // n_slices
