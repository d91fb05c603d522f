"""PTX compile specs of the prefill-side kernels (matmul, routing, attention, KV write), registered
with `launch.register_ptx` under family "prefill" when this module is imported by the compile
check (`python -m strata.cuda_kernels.compile_check --family prefill`).

`register(full=True)` lists every variant the engine launches, for every weight format and the
attention shapes of the models we run: what the binary's kernel bundle carries
(`cuda_kernels.compile_bundle`, imported by `strata.aot.build` only).
"""

from __future__ import annotations

from numba import types as T

from . import attention, attention_prefill, attention_prefill_gqa, attention_stream, kvcache, route
from .launch import register_ptx
from .matmul import _fma, _tc
from .matmul_tiles import FMA_TILE, SMALL_TC_TILE, tc_tile
from .qformats import BY_NAME, FORMATS, is_planar

FAMILY = "prefill"
_I32, _I64, _F32 = T.int32[::1], T.int64, T.float32
_U8, _F16 = T.uint8[::1], T.float16[::1]
_SCHED = (_I32, _I32, _I64, _I32, _I32, _I32, _I64)  # group_off perm k_top tile_group m0 n rows


def _gemm_sig(x_half: bool, out_half: bool):
    x = T.uint32[:, ::1] if x_half else T.float32[:, ::1]
    out = T.uint32[:, ::1] if out_half else T.float32[:, ::1]
    return (x, _U8, T.int64[::1], T.int64[::1], _I64, _I64, _I64) + _SCHED + (out,)


def _tc_spec(t, *, x_half, grouped, gather, swiglu, out_half, tile=None):
    def build():
        k = _tc(t, tile or tc_tile(t), x_half, grouped, gather, swiglu, out_half)
        return k.py_func, _gemm_sig(x_half, out_half)
    return build


def _fma_spec(t, *, grouped, gather, swiglu):
    def build():
        return _fma(t, FMA_TILE, grouped, gather, swiglu).py_func, _gemm_sig(False, False)
    return build


def _fixed(kernel, sig):
    return lambda: (kernel.py_func, sig)


# decode attention's pass 1: q, K data/scale, V data/scale, seq_len, n_new, n_ctx, n_target,
# qk_scale, part_o, part_ml
_DECODE_ATTN_SIG = (T.float32[:, ::1], _U8, _F16, _U8, _F16, _I32, _I64, _I64, _I64, _F32,
                    T.float32[:, :, ::1], T.float32[:, :, ::1])


# Attention shapes the binary's bundle carries: head sizes and query heads per KV head of the
# models we run (Qwen3-MoE: 128 with groups 4, 8 and 16; the built-in tiny model: 3) and their
# neighbours. The compile check takes a representative few.
HEAD_DIMS = (64, 128)
GROUPS = (1, 2, 3, 4, 6, 8, 16)
CHECK_SHAPES = ((128, 8), (128, 4), (128, 3), (64, 8), (128, 16))  # 16: Qwen3-235B's group


def _attn_specs(fmt, shapes):
    q3 = T.float32[:, :, ::1]
    for hd, group in shapes:
        if attention_stream.supports(fmt, fmt, hd, group, attention.SPLIT_LEN):
            continue  # the tensor-core kernel serves these
        yield (f"decode_attn_{fmt}_hd{hd}_g{group}",
               _fixed(attention._split_kernel(fmt, fmt, hd, group, attention.SPLIT_LEN),
                      _DECODE_ATTN_SIG))
    for hd in sorted({hd for hd, _ in shapes}):
        yield (f"prefill_attn_{fmt}_hd{hd}",
               _fixed(attention_prefill._prefill_kernel(fmt, fmt, hd, attention_prefill.WARPS,
                                                        attention_prefill.BKV),
                      (q3, _U8, _F16, _U8, _F16, _I32, _I64, _I64, _F32, q3)))
        yield (f"kv_write_{fmt}_hd{hd}", _fixed(kvcache._write_kernel(fmt, hd),
                                                (q3, _I32, _I64, _U8, _F16)))


def _register_gqa(family, fmt, shapes):
    """The prefill attention variant sharing K/V tiles across a KV head's query heads
    (`attention_prefill.prefill_attention(..., variant="gqa")`): one kernel per block shape, with
    the launcher's default launch bounds."""
    q3, gqa = T.float32[:, :, ::1], attention_prefill_gqa
    src = T.uint32[:, ::1] if fmt == "f16" else _U8  # f16: cache rows as u32 (cp.async)
    for hd, hb, tw in sorted({(hd, *gqa.block_shape(g, gqa.WARPS)) for hd, g in shapes}):
        mb = gqa.default_min_blocks(hb * tw)
        for half in (True, False):  # the engine writes f16 (its output projection's input)
            out = T.uint32[:, :, ::1] if half else q3
            register_ptx(family, f"prefill_attn_gqa_{fmt}_hd{hd}_h{hb}x{tw}"
                         + ("_f16out" if half else ""),
                         _fixed(gqa.gqa_kernel(fmt, fmt, hd, hb, tw, gqa.fit_bkv(hd), mb, half),
                                (q3, src, _F16, src, _F16, _I32, _I64, _I64, _F32, out)),
                         options=gqa.jit_options(hb, tw, mb))


def register(family: str = FAMILY, *, full: bool = False) -> None:
    """What the prompt path launches: the dense projections (f16 or f32 activations, f32 out),
    the MoE's gate/up (gathered rows, SwiGLU, f16 out) and down (f32 out), routing, attention and
    the KV write. `full`: every weight format and attention shape (the binary's bundle:
    tests/unit/test_aot_coverage.py checks the engine against it); else the compile check's
    set: gate/up for every format (its weight loader is the per-format part), the rest for the
    formats and shapes of the 30B models and the tiny one."""
    # a tile's launch bounds are part of what the frozen dispatcher asks the bundle for
    def tc(t):
        return tc_tile(t).jit_options

    some = [BY_NAME[n] for n in ("Q4_K", "Q6_K", "Q6_K_P8", "Q8_0", "Q5_K")]
    experts = [f for f in FORMATS.values() if not is_planar(f.ggml_type)]  # GGUF layouts
    for f in experts:
        register_ptx(family, f"moe_gate_up_tc_{f.name}",
                     _tc_spec(f.ggml_type, x_half=True, grouped=True, gather=True, swiglu=True,
                              out_half=True), options=tc(f.ggml_type))
    for f in (FORMATS.values() if full else some):
        t = f.ggml_type
        if not is_planar(t):
            register_ptx(family, f"moe_down_tc_{f.name}",
                         _tc_spec(t, x_half=True, grouped=True, gather=False, swiglu=False,
                                  out_half=False), options=tc(t))
        for x_half in (True, False):
            register_ptx(family, f"dense_tc_{'f16' if x_half else 'f32'}in_{f.name}",
                         _tc_spec(t, x_half=x_half, grouped=False, gather=False, swiglu=False,
                                  out_half=False), options=tc(t))
    # the short-prompt tile (CudaOptions.prefill_small_tiles): gate/up (fused, and the down
    # kernel the unfused mixes run twice) and down; the check compiles Q4_K's
    small = SMALL_TC_TILE
    for f in (experts if full else [BY_NAME["Q4_K"]]):
        t = f.ggml_type
        register_ptx(family, f"moe_gate_up_tc_small_{f.name}",
                     _tc_spec(t, x_half=True, grouped=True, gather=True, swiglu=True,
                              out_half=True, tile=small), options=small.jit_options)
        register_ptx(family, f"moe_down_tc_small_{f.name}",
                     _tc_spec(t, x_half=True, grouped=True, gather=False, swiglu=False,
                              out_half=False, tile=small), options=small.jit_options)
    for name in ("Q4_K", "Q8_0"):  # the FMA fallback (no tensor cores)
        t = BY_NAME[name].ggml_type
        register_ptx(family, f"moe_gate_up_fma_{name}",
                     _fma_spec(t, grouped=True, gather=True, swiglu=True))
        register_ptx(family, f"moe_down_fma_{name}",
                     _fma_spec(t, grouped=True, gather=False, swiglu=False))
        register_ptx(family, f"dense_fma_{name}",
                     _fma_spec(t, grouped=False, gather=False, swiglu=False))
    f2 = T.float32[:, ::1]
    register_ptx(family, "route_zero", _fixed(route._zero_counts, (_I32,)))
    register_ptx(family, "route_count", _fixed(route._count, (_I32, _I64, _I32)))
    register_ptx(family, "route_scan", _fixed(route._scan, (_I32, _I64, _I64) + (_I32,) * 5))
    register_ptx(family, "route_scatter", _fixed(route._scatter, (_I32, _I64, _I32, _I32, _I32)))
    register_ptx(family, "route_combine", _fixed(route._combine, (f2, _I32, f2, _I64, f2)))
    register_ptx(family, "decode_attn_combine",  # part_o part_ml seq n_new n_ctx target max min out
                 _fixed(attention._combine, (T.float32[:, :, ::1], T.float32[:, :, ::1], _I32,
                                             _I64, _I64, _I64, _I64, _I64, f2)))
    register_ptx(family, "kv_advance", _fixed(kvcache._advance, (_I32, _I64)))
    shapes = [(hd, g) for hd in HEAD_DIMS for g in GROUPS] if full else list(CHECK_SHAPES)
    for hd, group in shapes:  # the tensor-core kernel (the default where it applies)
        for fmt in attention_stream.FORMATS:
            if not attention_stream.supports(fmt, fmt, hd, group, attention.SPLIT_LEN):
                continue
            register_ptx(family, f"decode_attn_{fmt}_stream_hd{hd}_g{group}",
                         _fixed(attention_stream.stream_kernel(
                                    fmt, hd, group, attention.longest_split(fmt, fmt, hd, group)),
                                _DECODE_ATTN_SIG),
                         options=attention_stream.jit_options(attention_stream.MIN_BLOCKS[fmt]))
    for fmt in kvcache.KV_FORMATS:
        # the generic kernel where the tensor-core one does not apply (q4_0 KV)
        fmt_shapes = shapes if full or fmt == "f16" else [(128, 8), (128, 16)]
        for name, build in _attn_specs(fmt, fmt_shapes):
            register_ptx(family, name, build)
        _register_gqa(family, fmt, fmt_shapes)


register()
