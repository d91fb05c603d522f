"""Constant lookup tables of the GGML formats, as numpy arrays the njit decoders read.

The tables are facts of the formats; they are taken at import time from the gguf package (a
runtime dependency) so that there is one source for them. numba freezes module-level arrays into
the compiled code as constants, so the decoders pay no lookup cost for them.
"""

from __future__ import annotations

import numpy as np
from gguf import quants as _gq


def _grid(cls) -> np.ndarray:
    cls.init_grid()  # gguf-py expands its packed hex grid on demand
    n_entries, n_values = cls.grid_shape
    return np.ascontiguousarray(cls.grid.reshape(n_entries, n_values), dtype=np.float32)


# Grid magnitudes, one row per grid index: the values are non-negative, signs come separately.
IQ2XXS_GRID = _grid(_gq.IQ2_XXS)  # [256, 8] f32
IQ2XS_GRID = _grid(_gq.IQ2_XS)    # [512, 8] f32
IQ2S_GRID = _grid(_gq.IQ2_S)      # [1024, 8] f32
IQ3XXS_GRID = _grid(_gq.IQ3_XXS)  # [256, 4] f32
IQ3S_GRID = _grid(_gq.IQ3_S)      # [512, 4] f32

# 7 stored sign bits -> 8 sign bits (the 8th makes the count of minus signs even).
KSIGNS = np.frombuffer(_gq.IQ2_XXS.ksigns, dtype=np.uint8).copy()  # [128] u8

# The non-linear 4-bit codebook of IQ4_NL / IQ4_XS.
IQ4NL_VALUES = np.array(_gq.IQ4_NL.kvalues, dtype=np.float32)  # [16] f32

# E2M1 (FP4) values, doubled so they are integers; MXFP4's shared scale is halved to match.
E2M1_VALUES = np.array(_gq.MXFP4.kvalues, dtype=np.float32)  # [16] f32

# 2**e for the fp16 exponent trick: an fp16 value is its 15 low bits shifted into an fp32 exponent
# field (which lands 112 too low) times 2**112; this is exact for normals and subnormals alike.
F16_REBIAS = np.float32(2.0 ** 112)
