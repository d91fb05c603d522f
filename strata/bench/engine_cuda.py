"""`strata bench --backend cuda`: the CUDA engine's prefill and decode speed on one model, each
against the bound it is held to, measured in the same run:

* decode: the bytes one token reads — dense weights and cached experts from VRAM at the measured
  device copy bandwidth, missed experts over PCIe at the measured host->device bandwidth (the
  miss-path bound) — and the measured vs the plan's predicted expert hit rate;
* prefill: the bytes streamed through the ring at the measured PCIe bandwidth (the streaming
  bound), and llama.cpp's measured number on the same card (REFERENCE.md) as the bar;
* the device allocations made while loading and running (numba's memory manager, counted): one,
  the arena, is the plan's contract.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from strata.engine.sampler import SamplingParams
from strata.errors import StrataError, UsageError
from strata.plan.knobs import knob_flags

LLAMA_CPP_BAR = {  # REFERENCE.md, llama.cpp on the same H200 (tok/s)
    "decode_q4_k_m_all_gpu": 304, "prefill_pp4096_q4_k_m_all_gpu": 9100,
    "decode_q8_0_n_cpu_moe_39": 35.2, "prefill_pp4096_q8_0_n_cpu_moe_39": 463}
COPY_BYTES = 1 << 30


def _bandwidths(n: int = COPY_BYTES) -> dict:
    """Device-to-device copy (HBM traffic: bytes read + written per second) and pinned
    host->device GB/s, measured on temporary buffers of `n` bytes (freed on return; halved
    down to 64 MiB where the card has no room left beside a loaded model)."""
    from numba import cuda
    from numba.cuda.cudadrv.driver import CudaAPIError

    try:
        a = cuda.device_array(n, np.uint8)
        b = cuda.device_array(n, np.uint8)
    except CudaAPIError:
        if n <= COPY_BYTES >> 4:
            raise
        return _bandwidths(n // 2)
    host = cuda.pinned_array(n // 4, np.uint8)
    host[:] = 1
    s = cuda.stream()
    out = {}
    for name, fn, n_bytes in (("d2d", lambda: b.copy_to_device(a, stream=s), 2 * n),
                              ("h2d", lambda: a[:n // 4].copy_to_device(host, stream=s), n // 4)):
        fn()
        s.synchronize()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            s.synchronize()
            best = min(best, time.perf_counter() - t0)
        out[name + "_gb_per_s"] = n_bytes / best / 1e9
    return out  # the temporary buffers are freed with this frame


def _commit() -> str | None:
    if os.environ.get("STRATA_COMMIT"):  # an installed copy has no git checkout beside it
        return os.environ["STRATA_COMMIT"]
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parent, timeout=10)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _decode_bytes(m, hit_rate: float) -> tuple[float, float]:
    """(VRAM bytes, host bytes) one decode token reads at `hit_rate`."""
    s = m.shape
    dense = sum(x.data.size for x in m.matrices.values())  # every layer's and the head
    expert = sum(s.n_expert_used * lay.n_bytes for lay in m.store.layouts)
    return dense + hit_rate * expert, (1 - hit_rate) * expert


def kv_read_bytes(kv_layout, n_layer: int, positions: range, resident: int
                  ) -> tuple[float, float]:
    """(VRAM bytes, host bytes) of KV the attention reads per decoded token, averaged over the
    steps at `positions` (a step at position p reads the rows of tokens 0 .. p, K and V, every
    layer): the rows of the first `resident` tokens are in VRAM, later ones (streamed KV,
    `--kv-resident`) in host memory and read over PCIe; int8's scales stay in VRAM."""
    if not len(positions):
        return 0.0, 0.0
    row = kv_layout.token_rows_bytes  # one token's rows, one side, one layer
    scale = kv_layout.bytes_per_token - row
    n_rows = np.arange(positions.start, positions.stop, positions.step, dtype=np.float64) + 1
    in_vram = np.minimum(n_rows, resident)
    per_side = 2 * n_layer  # K and V of every layer
    vram = per_side * (row * in_vram + scale * n_rows).mean()
    host = per_side * row * (n_rows - in_vram).mean()
    return float(vram), float(host)


def prompt_flops(s, n_prompt: int) -> float:
    """The model's math in a prompt of `n_prompt` tokens from position 0 (a multiply-add counts
    2): each layer's q/k/v/o projections, router and routed experts (gate, up, down) for every
    token, causal attention over the prompt (QK^T and PV of the unmasked pairs), and the head
    once (the last token's logits)."""
    q_dim, kv_dim = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    per_token = 2 * s.n_embd * (2 * q_dim + 2 * kv_dim + s.n_expert
                                + 3 * s.n_expert_used * s.n_ff_expert)
    attention = 4 * (n_prompt * (n_prompt + 1) // 2) * s.n_head * s.head_dim
    return float(s.n_layer * (n_prompt * per_token + attention) + 2 * s.n_embd * s.n_vocab)


def measure(args, options, *, host_store=None, bw: dict | None = None) -> dict:
    """Load `args.model[0]` by `options`, prefill `args.prompt_tokens` random tokens, decode
    `args.gen`; every number against its bound. `host_store` / `bw`: a shared (HostStore,
    MappedHost) and bandwidths measured earlier in the same process (the suite's many loads)."""
    from numba import cuda

    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.cuda.model import CudaModel
    from strata.gguf import open_model
    from strata.memory import emm

    counter = emm.install_counting_manager()
    # counted only when numba's context was made with the counting manager (no context before)
    counting = isinstance(getattr(cuda.current_context(), "memory_manager", None),
                          emm.CountingMemoryManager)
    n_before = len(counter.sizes)
    mf = open_model(args.model[0])
    t0 = time.perf_counter()
    m = CudaModel(mf, options, log=lambda t: print(t, file=sys.stderr), host_store=host_store)
    load_s = time.perf_counter() - t0
    eng = CudaEngine(m, use_graph=options.graph, miss_path=options.miss_path)
    s = mf.shape
    rng = np.random.default_rng(args.seed)
    n_prompt, n_gen = args.prompt_tokens, args.gen
    if n_prompt + n_gen > eng.max_context:
        raise StrataError(f"--prompt-tokens {n_prompt} + --gen {n_gen} exceed the plan's "
                          f"context of {eng.max_context} (raise --max-context)")
    warm = rng.integers(0, s.n_vocab, min(n_prompt, 300)).tolist()
    eng.prefill(warm)  # compiles every kernel outside the timings
    sampling = decode_sampling(args)
    eng.decode_tokens(4, sampling)  # and captures the decode graph of the timed mode
    eng.reset()
    prompt = rng.integers(0, s.n_vocab, n_prompt).tolist()
    streamed0 = eng.traffic.bytes_streamed
    t0 = time.perf_counter()
    eng.prefill(prompt)
    prefill_s = time.perf_counter() - t0
    streamed = eng.traffic.bytes_streamed - streamed0
    hits0 = eng.hits()
    pool = eng.step.pool  # the CPU pool's own counters, from here on (not its compile)
    pool0 = (pool.n_bytes, pool.seconds) if pool is not None else (0, 0.0)
    t0 = time.perf_counter()
    toks = eng.decode_tokens(n_gen, sampling)
    decode_s = time.perf_counter() - t0
    hits = eng.hits().since(hits0)
    allocs = counter.sizes[n_before:]
    profile = _profile(args, eng, options, sampling)
    prefill_profile = None
    if getattr(args, "profile_prefill", False):  # last: every number above is un-instrumented
        from strata.engine.cuda.prefill_profile import profile_prefill

        eng.reset()  # the same prompt again from position 0, as after the warm-up
        prefill_profile = profile_prefill(lambda: eng.prefill(prompt), stream=m.stream, shape=s)
    m.close()
    # The bounds' rates, measured after the run: temporary buffers made and freed before the
    # load left the same decode 4-5% slower on the H200 (D1 394.6 -> 413.5 tok/s with this
    # order, the kernels unchanged: bench/results/2026-12-02_engine_cuda_d1_v18.json), and
    # `strata generate` / `serve` load first. (The suite measures them once, before its loads.)
    bw = bw or _bandwidths()
    hit = hits.hit_rate if hits.hit_rate is not None else 0.0
    vram_b, host_b = _decode_bytes(m, hit)
    # the KV the timed steps read: positions n_prompt .. n_prompt + n_gen - 2 (the first of the
    # n_gen tokens comes from the prompt's logits)
    kv_vram_b, kv_host_b = kv_read_bytes(m.kv_layout, m.layers[1] - m.layers[0],
                                         range(n_prompt, n_prompt + n_gen - 1),
                                         m.plan.kv.resident_tokens)
    pool_b, pool_s = (pool.n_bytes - pool0[0], pool.seconds - pool0[1]) if pool else (0, 0.0)
    pool_gbps = pool_b / pool_s / 1e9 if pool is not None and pool_s else None
    split = pool.split if pool is not None else None
    # the paths serving misses: mapped reads at the measured PCIe rate, the pool at its own
    # measured rate, or (hybrid) both at once
    miss_gbps = (bw["h2d_gb_per_s"] if pool is None else pool_gbps if split is None
                 else (pool_gbps or 0.0) + bw["h2d_gb_per_s"])
    # KV rows in host memory are read by the attention over PCIe whatever serves the misses
    t_bound = ((vram_b + kv_vram_b) / (bw["d2d_gb_per_s"] * 1e9)
               + host_b / (max(miss_gbps or 0, 1e-9) * 1e9)
               + kv_host_b / (bw["h2d_gb_per_s"] * 1e9))
    decode_tps = (n_gen - 1) / decode_s
    prefill_tps = n_prompt / prefill_s
    stream_bound = n_prompt / (streamed / (bw["h2d_gb_per_s"] * 1e9)) if streamed else None
    flops = prompt_flops(s, n_prompt)
    pred = m.plan.predicted_hit_rate
    use = eng.last_prompt_use  # None: the prompt ran as decode steps
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    res = {
        "model": Path(args.model[0]).name, "file_bytes": mf.file_bytes,
        "gpu_mem_cap": options.gpu_mem, "plan": m.plan.to_dict(), "load": m.report,
        "load_seconds": load_s, "bandwidth": bw,
        "device_allocations": {"count": len(allocs) if counting else None,
                               "bytes": allocs if counting else None,
                               "arena_bytes": m.arena.device_plan.arena_bytes},
        "prefill": {"tokens": n_prompt, "seconds": prefill_s, "tokens_per_s": prefill_tps,
                    # a prompt of up to `prompt_steps` tokens ran as decode steps
                    "chunk": use.chunk if use else None, "mode": use.mode if use else "steps",
                    "ring_slots": use.ring_slots if use else 0,
                    "prompt_steps": eng.prompt_steps,
                    "bytes_streamed": streamed,
                    # what the prompt's rate means in compute (a prompt that fits runs
                    # compute-bound; against the card's tensor-core rate, not a bound)
                    "model_tflop": flops / 1e12, "model_tflops_per_s": flops / prefill_s / 1e12,
                    "pcie_streaming_bound_tokens_per_s": stream_bound,
                    "fraction_of_streaming_bound": prefill_tps / stream_bound
                    if stream_bound else None},
        "decode": {"tokens": n_gen, "seconds": decode_s, "tokens_per_s": decode_tps,
                   "miss_path": options.miss_path, "miss_path_gb_per_s": miss_gbps,
                   "cpu_pool_gb_per_s": pool_gbps, "graph": options.graph,
                   "miss_split": split.summary() if split is not None else None,
                   "adaptive_cache_swaps": eng.n_adaptive_swaps
                   if options.adaptive_cache else None,
                   "graph_nodes": eng.step.n_graph_nodes,
                   "hit_rate_measured": hits.hit_rate, "hit_rate_predicted": pred,
                   "hit_rate_per_layer": [None if np.isnan(x) else float(x)
                                          for x in hits.layer_rates()],
                   "vram_bytes_per_token": vram_b, "host_bytes_per_token": host_b,
                   "kv_vram_bytes_per_token": kv_vram_b, "kv_host_bytes_per_token": kv_host_b,
                   "bound_tokens_per_s": 1 / t_bound,
                   "fraction_of_bound": decode_tps * t_bound, "first_tokens": toks[:16],
                   "n_distinct_tokens": len(set(toks)),
                   "temperature": sampling.temperature if sampling else 0.0,
                   "profile": profile},
        "llama_cpp_bar": LLAMA_CPP_BAR, "device": name,
    }
    if prefill_profile is not None:
        res["prefill"]["profile"] = prefill_profile
    return res


def decode_sampling(args) -> SamplingParams | None:
    """How the bench decodes: greedy (None) by default; `--temperature T` > 0 samples at T with
    no top-p / min-p filter and top-k 0 (on the device: the 256 best), seeded by --seed. A random synthetic model's greedy tokens
    soon repeat one token, so its decode routes a handful of tokens' experts and the measured
    hit rate is a tiny sample of the routing the plan predicts from; sampling spreads it."""
    t = float(getattr(args, "temperature", 0.0) or 0.0)
    if t == 0:
        return None
    return SamplingParams(temperature=t, top_k=0, top_p=1.0, min_p=0.0,
                          seed=int(getattr(args, "seed", 0) or 0))


def _profile(args, eng, options, sampling) -> dict | None:
    """The decode step's time by launcher (`--profile-decode`; graphs, mapped misses only), the
    token's choice (greedy or `sampling`'s) included, measured last: its whole-step graph
    advances the sequence."""
    from strata.engine.cuda.profile import profile_step

    if not getattr(args, "profile_decode", False):
        return None
    if not options.graph or eng.step.pool is not None:
        raise UsageError("--profile-decode times CUDA graphs of the mapped miss path: drop "
                         "--no-graph and --miss-path cpu")
    reps = min(20, (eng.max_context - eng.n_past) // 2 - 2)
    if reps < 1:
        raise StrataError("--profile-decode needs room in the context: raise --max-context")
    return profile_step(eng.step, reps=reps, mode=eng.set_sampling(sampling))


def _kv_note(d: dict, bw: dict) -> str:
    """The KV part of the decode bound (absent in JSON written before 2026-12-07)."""
    kv_v, kv_h = d.get("kv_vram_bytes_per_token"), d.get("kv_host_bytes_per_token")
    if kv_v is None:
        return ""
    note = f"; KV {kv_v / 1e9:.3f} GB in VRAM"
    if kv_h:
        note += f" + {kv_h / 1e9:.3f} GB in host memory at {bw['h2d_gb_per_s']:.1f} GB/s"
    return note


def _math_line(p: dict) -> list[str]:
    """The prompt's rate as TFLOP/s of the model's math (absent in JSON before 2026-12-07)."""
    if p.get("model_tflops_per_s") is None:
        return []
    return [f"  {'':8s} {p['model_tflops_per_s']:10.1f} TFLOP/s of the model's math "
            f"({p['model_tflop']:.2f} TFLOP: projections, router, routed experts, causal "
            "attention)"]


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def table(r: dict) -> str:
    p, d, bw = r["prefill"], r["decode"], r["bandwidth"]
    bound_p = p["pcie_streaming_bound_tokens_per_s"]
    alloc = r["device_allocations"]
    cap = f" (budget {r['gpu_mem_cap'] / 2**30:.1f} GiB)" if r["gpu_mem_cap"] else ""
    bp = "-" if bound_p is None else f"{bound_p:.1f}"
    lines = [
        f"{r['model']} on {r['device']}{cap}",
        f"  measured: device copy {bw['d2d_gb_per_s']:.0f} GB/s (read+write), host->device "
        f"{bw['h2d_gb_per_s']:.1f} GB/s; device allocations: "
        f"{'not counted' if alloc['count'] is None else alloc['count']} "
        f"(arena {alloc['arena_bytes'] / 2**30:.2f} GiB)",
        f"  {'':8s} {'tok/s':>10s} {'bound':>10s} {'of bound':>9s}  held against",
        f"  {'prefill':8s} {p['tokens_per_s']:10.1f} {bp:>10s} "
        f"{_pct(p['fraction_of_streaming_bound']):>9s}  PCIe streaming of "
        f"{p['bytes_streamed'] / 1e9:.2f} GB ({p['tokens']} tokens, "
        + (f"run as decode steps: --prompt-steps {p.get('prompt_steps')})"
           if p["mode"] == "steps" else
           f"chunk {p['chunk']} {p['mode']}, ring {p['ring_slots']} slots)"),
        *_math_line(p),
        f"  {'decode':8s} {d['tokens_per_s']:10.1f} {d['bound_tokens_per_s']:10.1f} "
        f"{_pct(d['fraction_of_bound']):>9s}  VRAM {d['vram_bytes_per_token'] / 1e9:.3f} GB + "
        f"missed {d['host_bytes_per_token'] / 1e9:.3f} GB per token"
        + (f" at {d['miss_path_gb_per_s']:.1f} GB/s ({d.get('miss_path', 'mapped')})"
           if d.get("miss_path_gb_per_s") else "")
        + _kv_note(d, bw),
        f"  expert hit rate: measured {_pct(d['hit_rate_measured'])}, predicted "
        f"{_pct(d['hit_rate_predicted'])} ({r['plan']['predicted']['model']}); decoded "
        + (f"at temperature {d['temperature']:g}" if d.get("temperature") else "greedily")
        + (f", {d['n_distinct_tokens']} distinct of {d['tokens']} tokens"
           if d.get("n_distinct_tokens") is not None else ""),
    ]
    if d.get("profile"):
        from strata.engine.cuda.profile import profile_table

        lines.append(profile_table(d["profile"]))
    if p.get("profile"):
        from strata.engine.cuda.prefill_profile import profile_table as prefill_table

        lines.append(prefill_table(p["profile"], n_tokens=p["tokens"]))
    return "\n".join(lines)


def run_cuda(args) -> int:
    """The CLI entry: measure, print the table, write JSON when asked."""
    from strata.engine.cuda.options import CudaOptions
    from strata.plan.devices import parse_size
    from strata.plan.knobs import options_from_args

    if not args.model or len(args.model) != 1:
        raise UsageError("--backend cuda measures one model: give -m FILE once")
    if args.prompt_tokens < 1 or args.gen < 2:
        raise UsageError("--prompt-tokens must be >= 1 and --gen >= 2")
    t = getattr(args, "temperature", 0.0)
    if not (math.isfinite(t) and t >= 0):
        raise UsageError(f"--temperature must be a finite number >= 0, got {t}")
    gpu_mem = parse_size(args.gpu_mem) if args.gpu_mem else None
    extra = {"miss_path": args.miss_path} if getattr(args, "miss_path", None) else {}
    if getattr(args, "miss_share", None) is not None:
        extra["miss_share"] = args.miss_share
    if getattr(args, "adaptive_cache", False):
        extra["adaptive_cache"] = True
    if getattr(args, "prompt_steps", None) is not None:
        extra["prompt_steps"] = args.prompt_steps
    options = CudaOptions(plan=options_from_args(args), gpu_mem=gpu_mem, graph=not args.no_graph,
                          profile_path=args.profile, progress=not args.json, **extra)
    res = measure(args, options)
    command = (f"strata bench --backend cuda -m {args.model[0]} --prompt-tokens "
               f"{args.prompt_tokens} --gen {args.gen}"
               + (f" --gpu-mem {args.gpu_mem}" if args.gpu_mem else "")
               + "".join(f" {f}" for f in knob_flags(args))
               + (" --no-graph" if args.no_graph else "")
               + (f" --miss-path {options.miss_path}" if "miss_path" in extra else "")
               + (f" --miss-share {options.miss_share}" if "miss_share" in extra else "")
               + (" --adaptive-cache" if "adaptive_cache" in extra else "")
               + (f" --prompt-steps {args.prompt_steps}" if "prompt_steps" in extra else "")
               + (f" --temperature {args.temperature:g} --seed {args.seed}"
                  if getattr(args, "temperature", 0.0) else "")
               + (" --profile-decode" if args.profile_decode else "")
               + (" --profile-prefill" if getattr(args, "profile_prefill", False) else ""))
    res.update(date=datetime.now(timezone.utc).isoformat(timespec="seconds"), commit=_commit(),
               command=command, backend="cuda")
    if args.json:
        print(json.dumps(res, indent=2, default=float))
    else:
        print(table(res))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=2, default=float))
        print(f"wrote {args.json_out}", file=sys.stderr)
    return 0
