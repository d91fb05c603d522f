"""Lookup tables of the GGML formats, built once at import from gguf-py's own tables (a runtime
dependency: its grids are data, read here, never re-typed).

Device code reads them with `cuda.const.array_like(...)`, so each kernel specialization embeds only
the tables its format uses (the largest, IQ2_S's grid, is 8 KiB of the 64 KiB constant bank).
Grid rows are packed little-endian: a 4-value IQ3 row is one u32, an 8-value IQ2 row two u32.
"""

from __future__ import annotations

import numpy as np
from gguf import quants


def _packed_grid(cls) -> np.ndarray:
    cls.init_grid()
    n_rows, n_cols = cls.grid_shape
    vals = np.asarray(cls.grid, dtype=np.float32).reshape(n_rows, n_cols)
    as_bytes = vals.astype(np.uint8)  # grid values are small positive integers
    if not np.array_equal(as_bytes.astype(np.float32), vals):
        raise ValueError(f"{cls.__name__}: grid values are not bytes")
    return np.ascontiguousarray(as_bytes).view(np.uint32).reshape(n_rows, n_cols // 4).copy()


GRID_IQ2_XXS = _packed_grid(quants.IQ2_XXS)  # [256, 2] u32: 8 magnitudes per row
GRID_IQ2_XS = _packed_grid(quants.IQ2_XS)    # [512, 2] u32
GRID_IQ2_S = _packed_grid(quants.IQ2_S)      # [1024, 2] u32
GRID_IQ3_XXS = _packed_grid(quants.IQ3_XXS)[:, 0].copy()  # [256] u32: 4 magnitudes per row
GRID_IQ3_S = _packed_grid(quants.IQ3_S)[:, 0].copy()      # [512] u32

# [128] u8: 7 stored sign bits -> 8 sign bits (the 8th makes the count of negatives even)
KSIGNS = np.frombuffer(quants.IQ2_XXS.ksigns, dtype=np.uint8).copy()

KVALUES_IQ4NL = np.array(quants.IQ4_NL.kvalues, dtype=np.float32)  # [16] non-linear 4-bit levels
KVALUES_MXFP4 = np.array(quants.MXFP4.kvalues, dtype=np.float32)   # [16] e2m1 levels, doubled


def _with_signs(grid: np.ndarray) -> np.ndarray:
    return np.concatenate([grid.reshape(-1), KSIGNS.astype(np.uint32)]).astype(np.uint32)


# One flat table per format, what its `*32t` decoders index (kernels stage it in shared memory):
#   grid rows at 0 (IQ2 rows as 2 consecutive u32), then KSIGNS at KS_OFF_<fmt> where used.
# [24] f32: the 16 levels, then the same levels as int8 bytes four to a word, twice (their bits
# in slots 16..19 and 20..23), which the 8-bit rounds matvecs' decoder (`lanes_x8`) loads, odd
# lanes from the second copy. Given as immediates, ptxas rematerialised the four words before each byte permute
# that reads them (64 moves a step of IQ4_XS's rounds loop); loaded from one address for the
# whole warp, it kept them in uniform registers and copied them out the same way; loaded from
# lane-varying addresses, they stay in four registers.
_IQ4NL_WORDS = KVALUES_IQ4NL.astype(np.int8).view(np.uint32).view(np.float32)
TABLE_IQ4NL = np.concatenate([KVALUES_IQ4NL, _IQ4NL_WORDS, _IQ4NL_WORDS])
IQ4NL_WORDS_OFF = 4 * KVALUES_IQ4NL.size             # byte offset of the int8 level words
TABLE_MXFP4 = KVALUES_MXFP4                        # [16] f32
TABLE_IQ3_S = GRID_IQ3_S                           # [512] u32
TABLE_IQ3_XXS = _with_signs(GRID_IQ3_XXS)          # [256 + 128] u32
TABLE_IQ2_XXS = _with_signs(GRID_IQ2_XXS)          # [512 + 128] u32
TABLE_IQ2_XS = _with_signs(GRID_IQ2_XS)            # [1024 + 128] u32
TABLE_IQ2_S = GRID_IQ2_S.reshape(-1).copy()        # [2048] u32
KS_OFF_IQ3_XXS = GRID_IQ3_XXS.size
KS_OFF_IQ2_XXS = GRID_IQ2_XXS.size
KS_OFF_IQ2_XS = GRID_IQ2_XS.size
NO_TABLE = np.zeros(1, dtype=np.uint32)            # stands in where a format has none
