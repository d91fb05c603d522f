"""Probe (not part of the engine): timestamps inside decode kernels, to see which phase of a
latency-bound kernel takes the time.

A copy of the kernel's factory is compiled with thread 0 of every block writing %clock64 and
%globaltimer at marked points (the factory's source with stamp lines inserted; the kernels
themselves are unchanged): the f16 decode attention's pass 1, the MoE's gate/up and down (Q4_K),
the lane matvec with and without its fused RMSNorm (Q4_K) and the fused router. They run as a
CUDA graph of 48 layers (12 for the MoE), as in `decode_parts.py`. Per phase it prints the
median and the 90th percentile over blocks of the time since the block's first stamp; per launch,
the span from the first block's start to the last block's end, and the gap from one launch's
last block end to the next's first start.

Run from the repository root on a GPU machine: `python bench/probes/phase_stamps.py`
(`--only router,matvec` for some parts). Three variants, not in the default set: `route_twice`
(the router's last block routes twice; the two passes' times), `route_phases` (its routing with a
stamp after each phase) and `moe_early` (gate/up stages x before it resolves the experts).
"""
import inspect
import math
import sys
import textwrap

import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.core.extending import intrinsic

sys.path.insert(0, ".")
from decode_parts import moe_case  # noqa: E402  (this folder: the script's, first on the path)
from strata.bench.kernels import Ctx  # noqa: E402
from strata.bench.kernels_attention import _kv_sides  # noqa: E402
from strata.cuda_kernels import attention, attention_stream, moe  # noqa: E402
from strata.plan import attn_split  # noqa: E402


def _reg(name):
    @intrinsic
    def read(typingctx):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(64), []),
                               f"mov.u64 $0, %{name};", "=l", side_effect=True)
            return builder.call(asm, [])
        return types.int64(), codegen
    return read


clock64 = _reg("clock64")
globaltimer = _reg("globaltimer")


@cuda.jit(device=True, inline="always")
def _stamp(stamps, i):
    if cuda.threadIdx.x == 0:
        b = cuda.blockIdx.x + cuda.blockIdx.y * cuda.gridDim.x
        stamps[b, i, 0] = clock64()
        stamps[b, i, 1] = globaltimer()


def stamped(factory, kernel_def: str, marks: list[tuple[str, str, int]], ret: str | None,
            replace: tuple[tuple[str, str], ...] = ()):
    """The factory's source with a `stamps` argument added to `kernel_def`'s kernel, stamp 0
    right after its def line, a stamp before or after the first line (in turn) holding each
    mark's text, at the mark's indentation, and (ret given) a last one before the line `ret`;
    exec'd in the factory module's namespace. marks: (text, "before" | "after", indent);
    replace: (old, new) text substitutions made first (a variant of the kernel; each must
    match)."""
    src = textwrap.dedent(inspect.getsource(factory))
    for old, new in replace:
        if old not in src:
            raise RuntimeError(f"replace: {old!r} not found")
        src = src.replace(old, new)
    out, i_stamp, in_kernel, in_def, pending = [], 1, False, False, list(marks)
    for ln in src.split("\n"):
        stripped = ln.strip()
        if stripped.startswith(kernel_def):
            in_def = True
        if in_def:
            out.append(ln)
            if ln.rstrip().endswith("):"):
                out[-1] = ln.replace("):", ", stamps):")
                out.append(" " * 8 + "_stamp(stamps, 0)")
                in_def, in_kernel = False, True
            continue
        if ret is not None and stripped == ret and in_kernel:
            out.append(" " * 8 + f"_stamp(stamps, {i_stamp})")
            i_stamp += 1
            in_kernel = False
        if in_kernel and pending and pending[0][0] in ln and pending[0][1] == "before":
            out.append(" " * pending[0][2] + f"_stamp(stamps, {i_stamp})")
            i_stamp += 1
            pending.pop(0)
        out.append(ln)
        if in_kernel and pending and pending[0][0] in ln and pending[0][1] == "after":
            out.append(" " * pending[0][2] + f"_stamp(stamps, {i_stamp})")
            i_stamp += 1
            pending.pop(0)
    if pending:
        raise RuntimeError(f"marks not found: {pending}")
    ns = dict(vars(sys.modules[factory.__module__]))
    ns["_stamp"] = _stamp
    exec(compile("\n".join(out), f"<stamped {factory.__name__}>", "exec"), ns)
    return ns[factory.__name__], i_stamp


def report(title, stamps, names):
    """stamps: [n_launch, n_block, n_stamp, 2] int64 (clock, ns); blocks never stamped are 0."""
    print(f"\n{title}")
    s = stamps[1:]  # the first launch of a replay can wait on the previous replay
    ok = (s[:, :, 0, 1] > 0) & (s[:, :, -1, 1] > 0)  # blocks that ran to the end (no early exit)
    rel_ns = s[:, :, :, 1] - s[:, :, :1, 1]
    rel_clk = s[:, :, :, 0] - s[:, :, :1, 0]
    ghz = np.median(rel_clk[ok][:, -1] / np.maximum(rel_ns[ok][:, -1], 1))
    print(f"  blocks stamped per launch: {int(ok[0].sum())}; SM clock ~{ghz:.2f} GHz")
    for i, name in enumerate(names):
        hit = ok & (s[:, :, i, 1] > 0)  # a stamp in a branch not taken stays 0
        if not hit.any():
            print(f"  {name:34s} not reached")
            continue
        v = rel_clk[hit][:, i] / ghz / 1e3
        print(f"  {name:34s} median {np.median(v):7.2f} us   p90 {np.percentile(v, 90):7.2f} us"
              f"   max {v.max():7.2f} us")
    starts = np.where(ok, s[:, :, 0, 1], np.iinfo(np.int64).max).min(1)
    ends = np.where(ok, s[:, :, -1, 1], 0).max(1)
    first_end = np.where(ok, s[:, :, -1, 1], np.iinfo(np.int64).max).min(1)
    last_start = np.where(ok, s[:, :, 0, 1], 0).max(1)
    for label, v in (("launch span (first start .. last end)", ends - starts),
                     ("block starts spread (first .. last)", last_start - starts),
                     ("first block's end after first start", first_end - starts)):
        print(f"  {label:40s} median {np.median(v) / 1e3:7.2f} us")
    # the block that ends last in each launch, its stamps from the launch's first start: is the
    # span one late block (a straggler, or a last block with work of its own) or every block?
    last = np.where(ok, s[:, :, -1, 1], 0).argmax(1)
    tail = s[np.arange(len(s)), last, :, 1] - starts[:, None]
    print("  the block ending last, from the launch's first start (median over launches): "
          + ", ".join(f"{np.median(tail[:, i]) / 1e3:.2f}" for i in range(len(names))) + " us")
    gaps = starts[1:] - ends[:-1]
    print(f"  {'gap to the next launch' + chr(39) + 's first start':40s} median "
          f"{np.median(gaps) / 1e3:7.2f} us")


def attn(ctx):
    n_head, n_kv, hd, n_ctx, n_layer = 32, 4, 128, 4096, 48
    group, max_split = n_head // n_kv, attention.SPLIT_LEN
    factory, n_st = stamped(attention_stream.stream_kernel.__wrapped__, "def kernel(",
                            [("s_q = cuda.shared.array(N_Q", "after", 8),
                             ("# B fragments of Q^T", "before", 8),
                             ("for i in range(N_ACC):", "before", 8),
                             ("cp_async_wait()", "after", 8),
                             ("cuda.syncthreads()  # also: every warp", "after", 8),
                             ("# output (head h, dim d)", "before", 8)], "return kernel")
    kern = factory("f16", hd, group, max_split, attn_split.SPLIT_K_MIN)
    names = ["length known", "K/V copies issued", "Q^T staged (barrier)", "tiles done",
             "statistics merged (barrier)", "fragments stored (barrier)", "partials written"]
    assert n_st == len(names) + 1
    rng = np.random.default_rng(2)
    q = ctx.upload(rng.standard_normal((n_head, hd)).astype(np.float32))
    layers = [_kv_sides("f16", n_ctx, n_kv, hd, 4096, rng) for _ in range(n_layer)]
    scale = np.float32(1.0 / math.sqrt(hd))
    for length in (600, 4096):
        t = attn_split.split_target(n_kv)
        parts = attention.allocate_partials(n_head, hd, n_ctx, n_kv_head=n_kv,
                                            max_split=max_split, n_target=t)
        seq = ctx.upload(np.array([length - 1], np.int32))
        n_split = attention.n_splits(n_ctx, t, max_split, attn_split.SPLIT_K_MIN)
        st = cuda.to_device(np.zeros((n_layer, n_kv * n_split, n_st, 2), np.int64))

        def step(s):
            for i, (_, (k, v)) in enumerate(layers):
                kern[(n_kv, n_split), attention.THREADS, s](
                    q, k.data, k.scale, v.data, v.scale, seq, 1, n_ctx, t, scale, *parts,
                    st[i])
        us = ctx.time_graph(step, n_layer)
        report(f"attention pass 1 (stream), L {length}: {us:.2f} us a launch in the graph",
               st.copy_to_host(), ["start"] + names)


class _Stamped:
    def __init__(self, kern, st):
        self.kern, self.st, self.i = kern, st, 0

    def __getitem__(self, cfg):
        def launch(*args):
            self.kern[cfg](*args, self.st[self.i])
            self.i = (self.i + 1) % self.st.shape[0]
        return launch


# MoE variant (`--only moe_early`): the gate/up kernel stages x before it resolves the experts,
# so x's loads go out first and come back first (a load's data returns in issue order), and the
# weight loads, which need the resolved slots anyway, come after. The down kernel does so with h
# (measured: units done at 6.9 us against 7.1 with h staged after the first weight loads, the
# staging then ~3.5 us of its own, one memory latency per iteration); for gate/up it was no
# faster (9.35 us against 9.2-9.6)
_GU_STAGE = """        if has_tab:
            stage_table(tab, tab_s, n_tab)
        stage_padded(x, 0, n_sb * n_values, xs, pa_a, pa_pa, pa_b, pa_pb, sums, sums_off)
"""
MOE_EARLY_GU = (
    ("        t = cuda.threadIdx.x\n        if n_route > 0:",
     "        t = cuda.threadIdx.x\n" + _GU_STAGE + "        if n_route > 0:"),
    ("  # in flight while x is staged\n" + _GU_STAGE + "        cuda.syncthreads()\n", "\n"))


def moe_stamps(ctx, early: bool = False):
    n_layer, n_expert, k = 12, 128, 8
    from strata.cuda_kernels.lanes import LANE_FORMATS
    from gguf import GGMLQuantizationType as T
    from strata.cuda_kernels.lanes_x8 import lanes_for
    lf = LANE_FORMATS[int(T.Q4_K)]
    gu_lf = lanes_for(lf, moe.GATE_UP_X8)  # the decoding the launcher stages x for
    if early:
        gu_f, n_gu = stamped(moe._gate_up_lanes, "def moe_gate_up_lanes(",
                             [("counters, s_where, s_base)", "after", 8),
                              ("cuda.syncthreads()", "after", 8),
                              ("cur = load_pair(src, off_g", "after", 8)],
                             "return moe_gate_up_lanes", MOE_EARLY_GU)
        gu_names = ["start", "x staged, resolved", "after sync", "first loads issued", "end"]
    else:
        gu_f, n_gu = stamped(moe._gate_up_lanes, "def moe_gate_up_lanes(",
                             [("counters, s_where, s_base)", "after", 8),
                              ("cuda.syncthreads()", "after", 8),
                              ("cur = load_pair(src, off_g", "after", 8),
                              ("cuda.syncthreads()", "after", 8)],
                             "return moe_gate_up_lanes")
        gu_names = ["start", "resolved", "after sync", "first loads issued", "x staged (sync)",
                    "end"]
    dn_f, n_dn = stamped(moe._down_lanes, "def moe_down_lanes(",
                         [("down_off, s_w0, s_b0", "after", 8),
                          ("cur_b = load(src, off + off_b", "after", 12),
                          ("acc_a, acc_b = combine_split", "before", 8)],
                         "return moe_down_lanes")
    dn_names = ["start", "h staged, resolved (compact)", "first loads issued", "units done",
                "end"]
    gu_k, dn_k = gu_f(gu_lf), dn_f(lf)
    record = moe_case(ctx, "Q4_K", "Q4_K", n_layer, n_expert, k)
    st_gu = cuda.to_device(np.zeros((n_layer, 256, n_gu, 2), np.int64))
    st_dn = cuda.to_device(np.zeros((n_layer, 256, n_dn, 2), np.int64))
    w_gu, w_dn = _Stamped(gu_k, st_gu), _Stamped(dn_k, st_dn)
    real = moe._kernel
    moe._kernel = lambda kind, *a: w_gu if kind == "gate_up_lanes" else (
        w_dn if kind == "down_lanes" else real(kind, *a))
    try:
        us = ctx.time_graph(record, n_layer)
    finally:
        moe._kernel = real
    tag = ", vectors staged before the experts are resolved" if early else ""
    print(f"\nMoE Q4_K/Q4_K{tag}, both kernels: {us:.2f} us a layer in the graph")
    report("  gate/up (lanes)", st_gu.copy_to_host(), gu_names)
    report("  down (lanes)", st_dn.copy_to_host(), dn_names)


def matvec_stamps(ctx):
    """The lane matvec of the q projection with its RMSNorm (4096 x 2048 Q4_K) and the plain
    one of the output projection (2048 x 4096 Q4_K), 48 layers' weights each."""
    from gguf import GGMLQuantizationType as T

    from strata.bench.kernels import random_weights
    from strata.cuda_kernels import matvec, matvec_normed
    from strata.cuda_kernels.lanes import LANE_FORMATS
    lf = LANE_FORMATS[int(T.Q4_K)]
    n_layer = 48
    factory, n_st = stamped(matvec._lanes_single, "def matvec_lanes(",
                            [("s_first)  # in flight while x is staged", "after", 8),
                             ("scale = F1 / math.sqrt(", "after", 12),
                             ("cuda.syncthreads()", "after", 8),
                             ("acc_a, acc_b = combine_split(acc_a, acc_b, s_part, log)",
                              "before", 12),
                             ("return", "before", 12)], None)
    names = ["start", "first loads issued", "norm scale (normed only)", "x staged (sync)",
             "row pair dotted", "combined, written"]
    real = matvec._lanes_kernel
    for label, normed, n_rows, n_cols in (("q projection, RMSNorm fused", True, 4096, 2048),
                                          ("output projection", False, 2048, 4096)):
        kern = factory(lf, normed, False)
        w_host = random_weights(ctx, "Q4_K", n_rows, n_cols)
        ws = [ctx.upload(w_host) for _ in range(n_layer)]
        x = ctx.upload(ctx.rng.standard_normal(n_cols).astype(np.float32))
        nw = ctx.upload(ctx.rng.standard_normal(n_cols).astype(np.float32))
        y = ctx.cuda.device_array(n_rows, np.float32)
        st = cuda.to_device(np.zeros((n_layer, 1024, n_st, 2), np.int64))
        wrap = _Stamped(kern, st)
        matvec._lanes_kernel = lambda lf_, nm, rounds: wrap
        try:
            def record(s):
                for w in ws:
                    if normed:
                        matvec_normed.matvec_normed(x, nw, 1e-6, [(w, int(T.Q4_K), y)], stream=s)
                    else:
                        matvec.matvec(w, int(T.Q4_K), x, y, stream=s)
            us = ctx.time_graph(record, n_layer)
        finally:
            matvec._lanes_kernel = real
        report(f"lane matvec Q4_K, {label} ({n_rows} x {n_cols}): {us:.2f} us a launch",
               st.copy_to_host(), names)


ROUTE_CALL = (" " * 12 + "route_block(logits, 0, n_rows, k, norm_topk, ids, weights, s_val, "
              "s_key, s_cand,\n" + " " * 24 + "s_id, s_top, scratch)\n")
# the last block routes twice (the same code: a loop of a count read from memory, never
# unrolled), stamping after each: a second pass much faster than the first says the first
# waits on something cold (its instructions), not on its arithmetic
ROUTE_TWICE = """            for rep in range(done[1] + 2):  # done[1] is 0
                route_block(logits, 0, n_rows, k, norm_topk, ids, weights, s_val, s_key,
                            s_cand, s_id, s_top, scratch)
                if tid == 0:
                    stamps[cuda.blockIdx.x, N_ST + rep, 0] = clock64()
                    stamps[cuda.blockIdx.x, N_ST + rep, 1] = globaltimer()
"""


def route_phases_text() -> str:
    """The last block's routing with `router.rank_topk`'s own body inlined (its parameters bound to
    the kernel's names) and a stamp before and after each barrier, then `topk_weights` and a last
    stamp: which phase holds the time (`--only route_phases`)."""
    from strata.cuda_kernels import router
    src = textwrap.dedent(inspect.getsource(router.rank_topk))
    body = textwrap.dedent(src[src.index('"""', src.index('"""') + 3) + 3:].strip("\n"))
    body = body.split("\n")
    out, j = ["tok = 0", "n_expert = n_rows"], 0
    for ln in body:
        if ln.strip() == "cuda.syncthreads()":
            ind = ln[:len(ln) - len(ln.lstrip())]
            out += [f"{ind}_ph(stamps, {j})", ln, f"{ind}_ph(stamps, {j + 1})"]
            j += 2
        else:
            out.append(ln)
    out += ["topk_weights(n_expert, k, norm_topk, ids, weights, s_val, s_id, s_top, scratch)",
            f"_ph(stamps, {j})"]
    return "".join(" " * 12 + ln + "\n" for ln in out)


PHASE_NAMES = ["logits loaded, keys (thread 0)", "barrier", "ranked in group (thread 0)",
               "barrier", "candidates ranked (thread 0)", "barrier", "weights written"]


def router_stamps(ctx, twice: bool = False, phases: bool = False):
    """The fused router (RMSNorm, F32 128 x 2048 logits, softmax top-8), 48 layers; `twice`:
    its last block routes twice (ROUTE_TWICE)."""
    from strata.cuda_kernels import router_normed
    n_layer, n_expert, n_embd, k = 48, 128, 2048, 8
    factory, n_st = stamped(router_normed._factory, "def router_normed_kernel(",
                            [("w0, w1, w2, w3 = load_chunks4(w, off, min(c0", "after", 8),
                             ("scale = F1 / math.sqrt(block_sum", "after", 8),
                             ("acc = F0", "before", 8),
                             ("put_warp_sum(part", "before", 8),
                             ("last_flag[0] = cuda.atomic.add", "after", 12),
                             ("cuda.threadfence()  # then read", "after", 12)],
                            "return router_normed_kernel",
                            ((ROUTE_CALL, ROUTE_TWICE),) if twice else
                            ((ROUTE_CALL, route_phases_text()),) if phases else ())
    if twice:
        factory.__globals__.update(N_ST=n_st, clock64=clock64, globaltimer=globaltimer)
    if phases:
        from strata.cuda_kernels import router

        @cuda.jit(device=True, inline="always")
        def ph(stamps, j):
            if cuda.threadIdx.x == 0:
                stamps[cuda.blockIdx.x, n_st + j, 0] = clock64()
                stamps[cuda.blockIdx.x, n_st + j, 1] = globaltimer()
        factory.__globals__.update(_ph=ph, **{n: getattr(router, n) for n in (
            "NEG_INF", "GROUP", "PAD_KEY", "order_key", "key_expert", "topk_weights",
            "ld_i64x2")})
    kern = factory("F32")
    ws = [ctx.upload(ctx.rng.standard_normal((n_expert, n_embd)).astype(np.float32)
                     .view(np.uint8).reshape(-1)) for _ in range(n_layer)]
    x = ctx.upload(ctx.rng.standard_normal(n_embd).astype(np.float32))
    nw = ctx.upload(ctx.rng.standard_normal(n_embd).astype(np.float32))
    xn = ctx.cuda.device_array(n_embd, np.float32)
    logits = ctx.cuda.device_array(n_expert, np.float32)
    ids = ctx.cuda.device_array(k, np.int32)
    wts = ctx.cuda.device_array(k, np.float32)
    done = ctx.upload(np.zeros(2, np.int32))
    n_extra = 2 if twice else len(PHASE_NAMES) if phases else 0
    st = cuda.to_device(np.zeros((n_layer, n_expert, n_st + n_extra, 2), np.int64))
    wrap = _Stamped(kern, st)
    real = router_normed.kernel_for
    router_normed.kernel_for = lambda name: wrap
    try:
        def record(s):
            for w in ws:
                router_normed.router_normed(x, nw, w, ggml_type="F32", eps=1e-6, normed_out=xn,
                                            logits=logits, ids=ids, weights=wts, done=done,
                                            stream=s)
        us = ctx.time_graph(record, n_layer)
    finally:
        router_normed.kernel_for = real
    host = st.copy_to_host()
    if twice:
        s = host[1:]
        last = s[:, :, n_st - 2, 1].argmax(1)  # the block that passed the last block's fence
        t = s[np.arange(len(s)), last, :, 1]
        fence, one, two = t[:, n_st - 2], t[:, n_st], t[:, n_st + 1]
        first, second = np.median(one - fence) / 1e3, np.median(two - one) / 1e3
        print(f"\nrouter_normed, the last block routing twice: {us:.2f} us a launch; first "
              f"pass {first:.2f} us, second {second:.2f} us (medians over launches)")
        return
    if phases:
        s = host[1:]
        last = s[:, :, n_st - 2, 1].argmax(1)  # the block that passed the last block's fence
        t = s[np.arange(len(s)), last, :, 1].astype(np.float64)  # ns (globaltimer)
        print(f"\nrouter_normed, the last block's routing by phase: {us:.2f} us a launch "
              f"(us since its fence, medians over launches)")
        prev = t[:, n_st - 2]
        for j, name in enumerate(PHASE_NAMES):
            cur = t[:, n_st + j]
            print(f"  {name:28s} at {np.median(cur - t[:, n_st - 2]) / 1e3:6.2f} us  "
                  f"(+{np.median(cur - prev) / 1e3:5.2f})")
            prev = cur
        return
    report(f"router_normed F32 128 x 2048, top-8: {us:.2f} us a launch", host,
           ["start", "x summed, first loads issued", "norm scale", "block 0's xn written",
            "logit dotted", "counted (fence, atomic)", "last block: its fence passed",
            "end (the last block: routed)"])


PARTS = {"attn": attn, "moe": moe_stamps, "matvec": matvec_stamps, "router": router_stamps,
         "route_twice": lambda ctx: router_stamps(ctx, twice=True),
         "route_phases": lambda ctx: router_stamps(ctx, phases=True),
         "moe_early": lambda ctx: moe_stamps(ctx, early=True)}


def main():
    import argparse
    ap = argparse.ArgumentParser(description="timestamps inside decode kernels")
    ap.add_argument("--only", default="attn,moe,matvec,router",
                    help=f"comma-separated parts to run, of {','.join(PARTS)} (default: all "
                         f"but the variants route_twice and moe_early)")
    names = [n for n in ap.parse_args().only.split(",") if n]
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        ap.error(f"--only: unknown part(s) {unknown}, expected some of {list(PARTS)}")
    ctx = Ctx()
    for n in names:
        PARTS[n](ctx)


if __name__ == "__main__":
    main()
