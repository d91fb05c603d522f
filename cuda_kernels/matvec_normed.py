"""RMSNorm fused into the one-token lane matvec: y_i = W_i (rmsnorm(x) * norm_w) for one to three
matrices of one lane format (a layer's q, k and v projections) in a single launch.

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
from .launch import check_array
from .matvec import launch_lane_matvec, lanes_fit
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
    """mats = ((w, ggml_type, y), ...) grouped by format, first-seen order (one `matvec_normed`
    call each), or None where any of them has no `normed_lane_format` for n_cols columns."""
    groups: dict[int, list[tuple]] = {}
    for m in mats:
        lf = normed_lane_format(m[1], n_cols)
        if lf is None:
            return None
        groups.setdefault(lf.ggml_type, []).append(m)
    return list(groups.values())


def _lane_format_of(mats: Sequence[tuple], n_cols: int) -> LaneFormat:
    if not 1 <= len(mats) <= MAX_MATRICES:
        raise ValueError(f"mats: {len(mats)} matrices, matvec_normed takes 1..{MAX_MATRICES}")
    fmts = [get_format(m[1]) for m in mats]
    if len({f.ggml_type for f in fmts}) > 1:
        raise ValueError(f"mats: mixed formats {[f.name for f in fmts]}, one launch takes one "
                         f"format (call once per format)")
    lf = lane_format(fmts[0].ggml_type)
    if lf is None:
        raise ValueError(f"{fmts[0].name} has no lane decoding (use rms_norm and matvec)")
    if n_cols <= 0 or n_cols % lf.sb_values:
        raise ValueError(f"x: {n_cols} columns, {lf.name} rows take a multiple of "
                         f"{lf.sb_values}")
    if not lanes_fit(lf, n_cols):
        raise ValueError(f"x: {n_cols} columns of {lf.name} do not fit one block's shared "
                         f"memory (use rms_norm and matvec)")
    return lf


def matvec_normed(x, norm_w, eps: float, mats: Sequence[tuple], *, normed_out=None,
                  stream=0) -> None:
    """y_i = W_i (rmsnorm(x) * norm_w) for every (w_i, ggml_type, y_i) of `mats` (1..3 matrices
    of one lane format, e.g. Q4_K, with x's n_cols columns), in one launch: x [n_cols] float32
    the raw residual, norm_w [n_cols] float32, y_i [n_rows_i] float32 (n_rows_i >= 1), w_i uint8
    rows as `matvec` takes them. rmsnorm(x) = x / sqrt(mean(x^2) + eps), float32, like
    `norm_rope.rms_norm`. `normed_out` ([n_cols] float32, optional) receives the normed vector
    the matrices were multiplied with."""
    check_array("x", x, np.float32, (None,))
    n_cols = x.shape[0]
    check_array("norm_w", norm_w, np.float32, (n_cols,))
    if normed_out is not None:
        check_array("normed_out", normed_out, np.float32, (n_cols,))
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    lf = _lane_format_of(mats, n_cols)
    row_bytes = n_cols // lf.sb_values * lf.sb_bytes
    launch = []
    for i, (w, _, y) in enumerate(mats):
        check_array(f"mats[{i}] y", y, np.float32, (None,))
        n_rows = y.shape[0]
        if n_rows == 0:
            raise ValueError(f"mats[{i}] y: no rows")
        check_array(f"mats[{i}] w", w, np.uint8)
        if w.size < n_rows * row_bytes:
            raise ValueError(f"mats[{i}] w: {w.size} bytes, {lf.name} [{n_rows}, {n_cols}] "
                             f"needs {n_rows * row_bytes}")
        launch.append((w, y, n_rows))
    xn = x[:0] if normed_out is None else normed_out
    launch_lane_matvec(lf, x, launch, n_cols, row_bytes, stream, norm=(norm_w, eps, xn))
