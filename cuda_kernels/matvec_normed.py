"""RMSNorm fused into the one-token lane matvec: y_i = W_i (rmsnorm(x) * norm_w) for one to three
matrices (a layer's q, k and v projections) in a single launch, of one lane format or of a pair
with a mixed kernel (`matvec_mixed`: a Q4_K_M layer's q, k Q4_K and v Q6_K).

A decode step's attention side used to launch an RMSNorm (x -> xn) and then the q and k/v
matvecs; at one token every launch is a few microseconds of latency. Here every block of the
lane kernel (`matvec._lanes_single`, `normed`) reduces sum(x^2) itself, in a fixed order so that
all blocks get the same bits, and stages x * scale * norm_w (with the format's padding and
16-value sums) where the plain kernel stages x. The reduction runs while the block's first weight
loads are in flight, so it costs little beyond the saved launch; block 0 can write the normed
vector out for a reader that needs it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .lanes import LaneFormat, lane_format
from .launch import check_array, check_rows
from .matvec import launch_lane_matvec, lanes_fit
from .matvec_mixed import launch_mixed_normed, mixed_pair
from .qformats import get_format

MAX_MATRICES = 3


def normed_lane_format(ggml_type, n_cols: int) -> LaneFormat | None:
    """The lane format `matvec_normed` runs `ggml_type` rows of n_cols columns with, or None
    where it cannot (no lane decoding, n_cols not whole super-blocks, or too long to stage)."""
    lf = lane_format(get_format(ggml_type).ggml_type)
    if lf is None or n_cols <= 0 or n_cols % lf.sb_values or not lanes_fit(lf, n_cols):
        return None
    return lf


def normed_groups(mats: Sequence[tuple], n_cols: int) -> list[list[tuple]] | None:
    """mats = ((w, ggml_type, y), ...) as `matvec_normed` calls: all in one where they are of one
    format or of two with a mixed kernel (`matvec_mixed.MIXED_PAIRS`), else one per format,
    first-seen order; None where any of them has no `normed_lane_format` for n_cols columns."""
    groups: dict[int, list[tuple]] = {}
    for m in mats:
        lf = normed_lane_format(m[1], n_cols)
        if lf is None:
            return None
        groups.setdefault(lf.ggml_type, []).append(m)
    if len(groups) == 2 and len(mats) <= MAX_MATRICES and mixed_pair(*groups) is not None:
        return [list(mats)]
    return list(groups.values())


def _lane_formats_of(mats: Sequence[tuple], n_cols: int) -> list[LaneFormat]:
    """The lane format of each of mats (1..3, of one format or two), checked for n_cols."""
    if not 1 <= len(mats) <= MAX_MATRICES:
        raise ValueError(f"mats: {len(mats)} matrices, matvec_normed takes 1..{MAX_MATRICES}")
    fmts = [get_format(m[1]) for m in mats]
    names = list(dict.fromkeys(f.name for f in fmts))
    if len(names) > 2:
        raise ValueError(f"mats: formats {names}, one launch takes one format or two")
    out = []
    for f in fmts:
        lf = lane_format(f.ggml_type)
        if lf is None:
            raise ValueError(f"{f.name} has no lane decoding (use rms_norm and matvec)")
        if n_cols <= 0 or n_cols % lf.sb_values:
            raise ValueError(f"x: {n_cols} columns, {lf.name} rows take a multiple of "
                             f"{lf.sb_values}")
        if not lanes_fit(lf, n_cols):
            raise ValueError(f"x: {n_cols} columns of {lf.name} do not fit one block's shared "
                             f"memory (use rms_norm and matvec)")
        out.append(lf)
    kinds = list(dict.fromkeys(lf.ggml_type for lf in out))
    if len(kinds) == 2 and mixed_pair(*kinds) is None:
        raise ValueError(f"mats: mixed formats {names} have no mixed lane kernel (call once per "
                         f"format: normed_groups)")
    return out


def matvec_normed(x, norm_w, eps: float, mats: Sequence[tuple], *, normed_out=None,
                  stream=0) -> None:
    """y_i = W_i (rmsnorm(x) * norm_w) for every (w_i, ggml_type, y_i) of `mats` (1..3 matrices
    with x's n_cols columns, of one lane format, e.g. Q4_K, or of two with a mixed kernel, e.g.
    Q4_K and Q6_K: `normed_groups` says which), in one launch: x [n_cols] float32 the raw
    residual, norm_w [n_cols] float32, y_i [n_rows_i] float32 (n_rows_i >= 1), w_i uint8 rows as
    `matvec` takes them. rmsnorm(x) = x / sqrt(mean(x^2) + eps), float32, like
    `norm_rope.rms_norm`. `normed_out` ([n_cols] float32, optional) receives the normed vector
    the matrices were multiplied with. Each output has the bits a launch of its format alone
    gives."""
    check_array("x", x, np.float32, (None,))
    n_cols = x.shape[0]
    check_array("norm_w", norm_w, np.float32, (n_cols,))
    if normed_out is not None:
        check_array("normed_out", normed_out, np.float32, (n_cols,))
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    lfs = _lane_formats_of(mats, n_cols)
    parts: dict[int, list[tuple]] = {}
    for i, ((w, _, y), lf) in enumerate(zip(mats, lfs)):
        row_bytes = n_cols // lf.sb_values * lf.sb_bytes
        check_array(f"mats[{i}] y", y, np.float32, (None,))
        n_rows = y.shape[0]
        if n_rows == 0:
            raise ValueError(f"mats[{i}] y: no rows")
        check_rows(w, lf.name, n_rows, n_cols, row_bytes, f"mats[{i}] w")
        parts.setdefault(lf.ggml_type, []).append((w, y, n_rows))
    xn = x[:0] if normed_out is None else normed_out
    norm = (norm_w, eps, xn)
    if len(parts) == 1:
        lf = lfs[0]
        launch_lane_matvec(lf, x, parts[lf.ggml_type], n_cols,
                           n_cols // lf.sb_values * lf.sb_bytes, stream, norm=norm)
        return
    by_type = {lf.ggml_type: lf for lf in lfs}
    (ta, mats_a), (tb, mats_b) = parts.items()
    launch_mixed_normed(by_type[ta], by_type[tb], x, mats_a, mats_b, n_cols, stream, norm=norm)
