"""The table of GGML tensor types: block geometry, and which ones Strata supports.

A GGML tensor is a sequence of rows; a row of `n` values is `n // block_size` blocks of
`block_bytes` each. Every byte count in the engine (the planner's prices, the expert-slot sizes,
the readers' offsets) comes from this one table.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType


@dataclass(frozen=True, slots=True)
class QuantType:
    """One GGML type: `block_size` values are stored in `block_bytes` bytes."""

    ggml_type: int
    name: str
    block_size: int
    block_bytes: int
    supported: bool  # the host dequantizer, the CPU engine and the kernels handle it

    def row_bytes(self, n_values: int) -> int:
        """Bytes of one row of `n_values` values; the row must be a whole number of blocks."""
        if n_values % self.block_size:
            raise ValueError(
                f"{self.name}: a row of {n_values} values is not a whole number of "
                f"{self.block_size}-value blocks"
            )
        return n_values // self.block_size * self.block_bytes

    def tensor_bytes(self, ne: tuple[int, ...]) -> int:
        """Bytes of a tensor whose GGML dimensions (innermost first) are `ne`."""
        n_rows = 1
        for d in ne[1:]:
            n_rows *= d
        return self.row_bytes(ne[0]) * n_rows


# The formats Strata reads end to end (foundation issue's list). Anything else in a GGUF is refused
# with the tensor's name rather than half-supported.
SUPPORTED_NAMES = (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "MXFP4",
)


def _build_table() -> dict[int, QuantType]:
    table: dict[int, QuantType] = {}
    for t in GGMLQuantizationType:
        if t not in GGML_QUANT_SIZES:
            continue
        block_size, block_bytes = GGML_QUANT_SIZES[t]
        table[int(t)] = QuantType(int(t), t.name, block_size, block_bytes, t.name in SUPPORTED_NAMES)
    return table


TYPES: dict[int, QuantType] = _build_table()
BY_NAME: dict[str, QuantType] = {q.name: q for q in TYPES.values()}


def quant_type(ggml_type: int | str) -> QuantType:
    """Look a type up by GGML number or name; a clear error for an unknown one."""
    if isinstance(ggml_type, str):
        q = BY_NAME.get(ggml_type.upper())
    else:
        q = TYPES.get(int(ggml_type))
    if q is None:
        raise ValueError(f"unknown GGML tensor type {ggml_type!r}")
    return q


def supported_types() -> list[QuantType]:
    return [q for q in TYPES.values() if q.supported]
