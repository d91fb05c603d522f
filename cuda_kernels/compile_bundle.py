"""Every kernel specialization the engines can launch, for the binary's kernel bundle
(`strata.aot.build` imports this module; the CI compile check does not, since the kernel modules
register a representative subset for it): the prompt path's for every weight format and
attention shape (`compile_prefill.register(full=True)`), and batched decode's
(`strata serve --batch N`, N <= 8).

The batch kernels are specialized by how many tokens share a block (1..8, set by the row width and
the batch size), so the bundle carries every count for every format: dense matvec and the MoE's
gate/up for each lane format, the tensor-core dense matvec and MoE (`batch_tc`, `batch_moe_tc`),
the generic batched matvec for the quantized formats without lanes (legacy and IQ quants; F32/F16
routers run `matvec_f32`, registered by that module for every token count), the MoE's generic
kernels for every format, and attention for head sizes 64/128 with 1..8 query heads per KV head. tests/unit/test_aot_coverage.py checks the
engine's launches against the registry.
"""

from __future__ import annotations

from numba import types

from strata.plan.layout import SPLIT_K_TOKENS

from . import (batch_attention, batch_moe, batch_moe_lanes, batch_moe_tc, batch_tc, compile_prefill,
               lanes_batch, matvec_generic, moe_fused)
from .lanes import LANE_FORMATS
from .launch import register_ptx
from .matvec_f32 import float_format
from .qformats import BY_NAME, FORMATS, is_planar

FAMILY = "bundle"


def register() -> None:
    compile_prefill.register(FAMILY, full=True)
    moe_fused.register(FAMILY, rest=True)
    # planar layouts (dense weights only, `strata.quant.planar`): no expert kernels
    for lf in LANE_FORMATS.values():
        for tg in range(1, lanes_batch.MAX_TOKENS + 1):
            lanes_batch.register_dense(FAMILY, lf, tg)
            if not is_planar(lf.ggml_type):
                batch_moe_lanes.register_gate_up(FAMILY, lf, tg)
        if not is_planar(lf.ggml_type):
            batch_moe_lanes.register_down(FAMILY, lf)
    for name in batch_tc.SB_FUNCS:
        batch_tc.register_tc(FAMILY, name)
        if not is_planar(BY_NAME[name].ggml_type):
            batch_moe_tc.register_tc_moe(FAMILY, name)
    for f in FORMATS.values():
        # F32/F16 rows with float32 x run `matvec_f32` (registered by its module), never these
        for n_tok in range(2, lanes_batch.MAX_TOKENS + 1) if not float_format(f.ggml_type) else ():
            register_ptx(FAMILY, f"matvec{n_tok}_{f.name}_f32",
                         matvec_generic._ptx(f, n_tok, types.float32))
        if is_planar(f.ggml_type):
            continue
        tab = batch_moe._tab_type(f)
        register_ptx(FAMILY, f"batch_gate_up_{f.name}",
                     lambda f=f, t=tab: (batch_moe._gate_up_factory(f).py_func,
                                         batch_moe._GU_SIG + (t,)))
        register_ptx(FAMILY, f"batch_down_{f.name}",
                     lambda f=f, t=tab: (batch_moe._down_factory(f).py_func,
                                         batch_moe._DN_SIG + (t,)))
    f2, f4 = types.float32[:, ::1], types.float32[:, :, :, ::1]
    for hd in batch_attention.HEAD_DIMS:
        for group in range(1, batch_attention.MAX_GROUP + 1):
            register_ptx(FAMILY, f"attention_rows_hd{hd}_g{group}",
                         lambda h=hd, g=group: (
                             batch_attention._attn_kernel(h, g, SPLIT_K_TOKENS).py_func,
                             (f2, types.uint8[::1], types.uint8[::1], types.int32[::1],
                              types.int64, types.int64, types.float32, f4, f4)))


register()
