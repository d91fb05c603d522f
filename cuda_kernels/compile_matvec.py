"""PTX compile specs of the one-token lane matvec kernels (`matvec`), registered with
`launch.register_ptx` under family "matvec" when this module is imported by the compile check
(`python -m strata.cuda_kernels.compile_check --family matvec`) or the kernel bundle's build: every
variant `matvec.launch_lane_matvec` launches (plain, normed, rounds, wide rounds, x between, the
grid in copies; float32 x, and float16 for Q4_K).
"""

from __future__ import annotations

from numba import from_dtype, types

from .lanes import LANE_FORMATS, lane_format
from .lanes_x8 import GRID_COPIES, X8_FORMATS
from .launch import register_ptx
from .matvec import WIDE_ROUNDS, _lanes_single, has_rounds, matvec_jit_options, rounds_ahead
from .qformats import BY_NAME


def _ptx_lanes(lf, x_type, normed=False, rounds=False, min_blocks=0, copies=1, between=False):
    def build():
        tab = types.Array(from_dtype(lf.table.dtype), 1, "C")
        u8, i64, f32 = types.uint8[::1], types.int64, types.float32[::1]
        return _lanes_single(lf, normed, rounds, min_blocks, copies, between).py_func, (
            (u8, u8, u8) + (i64,) * 9 + (x_type[::1], f32, types.float32, f32, f32, f32, f32,
                                         types.boolean, tab))
    return build


for _lf in list(LANE_FORMATS.values()) + list(X8_FORMATS.values()):
    _x8 = "x8_" if _lf.x8 else ""
    for _r, _tag in ((False, ""), (True, "_rounds"))[:2 if has_rounds(_lf) else 1]:
        _opts = matvec_jit_options(_lf, 0, rounds_ahead(_lf, _r))
        register_ptx("matvec", f"matvec_lanes{_tag}_{_x8}{_lf.name}_f32",
                     _ptx_lanes(_lf, types.float32, rounds=_r), options=_opts)
        register_ptx("matvec", f"matvec_lanes{_tag}_normed_{_x8}{_lf.name}",
                     _ptx_lanes(_lf, types.float32, True, _r), options=_opts)
    if _lf.x8:
        register_ptx("matvec", f"matvec_lanes_between_x8_{_lf.name}_f32",
                     _ptx_lanes(_lf, types.float32, between=True),
                     options=matvec_jit_options(_lf, between=True))
    if _lf.x8 and _lf.ggml_type in GRID_COPIES:
        _c = GRID_COPIES[_lf.ggml_type]
        _opts = matvec_jit_options(_lf, 0, rounds_ahead(_lf))
        register_ptx("matvec", f"matvec_lanes_rounds_copies_x8_{_lf.name}_f32",
                     _ptx_lanes(_lf, types.float32, rounds=True, copies=_c), options=_opts)
        register_ptx("matvec", f"matvec_lanes_rounds_copies_normed_x8_{_lf.name}",
                     _ptx_lanes(_lf, types.float32, True, True, copies=_c), options=_opts)
    if (_lf.name, _lf.x8) in WIDE_ROUNDS:
        _n = WIDE_ROUNDS[_lf.name, _lf.x8]
        _opts = matvec_jit_options(_lf, _n)
        register_ptx("matvec", f"matvec_lanes_rounds_wide_{_x8}{_lf.name}_f32",
                     _ptx_lanes(_lf, types.float32, rounds=True, min_blocks=_n), options=_opts)
        register_ptx("matvec", f"matvec_lanes_rounds_wide_normed_{_x8}{_lf.name}",
                     _ptx_lanes(_lf, types.float32, True, True, _n), options=_opts)
for _lf in (lane_format(BY_NAME["Q4_K"].ggml_type), X8_FORMATS[BY_NAME["Q4_K"].ggml_type]):
    for _r, _tag in ((False, ""), (True, "_rounds")):
        register_ptx("matvec", f"matvec_lanes{_tag}_{'x8_' if _lf.x8 else ''}Q4_K_f16",
                     _ptx_lanes(_lf, types.float16, rounds=_r),
                     options=matvec_jit_options(_lf, 0, rounds_ahead(_lf, _r)))
    if _lf.x8:
        register_ptx("matvec", "matvec_lanes_between_x8_Q4_K_f16",
                     _ptx_lanes(_lf, types.float16, between=True),
                     options=matvec_jit_options(_lf, between=True))
    if ("Q4_K", _lf.x8) in WIDE_ROUNDS:
        _n = WIDE_ROUNDS["Q4_K", _lf.x8]
        register_ptx("matvec", f"matvec_lanes_rounds_wide_{'x8_' if _lf.x8 else ''}Q4_K_f16",
                     _ptx_lanes(_lf, types.float16, rounds=True, min_blocks=_n),
                     options=matvec_jit_options(_lf, _n))
