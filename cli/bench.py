"""`strata bench --backend cpu`: prefill and decode speed of the CPU engine, and the expert
path's read throughput, against this machine's memory bandwidth measured in the same run.

`strata bench --backend cuda -m FILE [--gpu-mem SIZE] [--prompt-tokens N] [--gen N] [--json]`:
the CUDA engine's prefill and decode against their bounds (`strata.bench.engine_cuda`).

With no `-m`, synthetic files of `--preset` with `--layers` blocks are written once per mix to the
user cache; decode time is scaled to the preset's full depth (the head runs once per token, the
blocks once per layer). With `-m` nothing reads `--preset`, `--mix` or `--layers`, so they are
refused there; a flag of the other backend is named in a note (`strata.cli.flags`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone

from strata.cpus import load_average
from strata.errors import UsageError

MEMBW_BYTES = 1 << 29  # 512 MiB copied: far past every cache
# the synthetic files' defaults: their flags default to None, so that one given with -m (which
# nothing then reads) is refused even where it spells the default
PRESET, MIXES, LAYERS = "qwen3-30b-a3b", "Q4_K_M,Q8_0", 4
SYNTHETIC = "synthetic model (without -m)"  # the argument group of those flags
CPU_BENCH = "--backend cpu"  # the flags only the CPU bench reads


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="cpu", choices=("cpu", "cuda"),
                   help="engine to measure (default: the CPU engine)")
    p.add_argument("-m", "--model", action="append", metavar="FILE",
                   help="GGUF file to measure (repeatable); default: synthetic --preset files")
    s = p.add_argument_group(SYNTHETIC)
    s.add_argument("--preset", help=f"synthetic model shape (default {PRESET})")
    s.add_argument("--mix", help=f"comma-separated quant mixes (default {MIXES})")
    s.add_argument("--layers", type=int,
                   help=f"blocks in the synthetic files (default {LAYERS})")
    c = p.add_argument_group(CPU_BENCH)
    c.add_argument("--n-prompt", type=int, default=32, help="prompt tokens to prefill")
    c.add_argument("--n-decode", type=int, default=16, help="tokens to decode")
    c.add_argument("--n-pool", type=int, default=64,
                   help="single-token calls of the expert pool with random experts")
    c.add_argument("--membw-mib", type=int, default=MEMBW_BYTES >> 20,
                   help="MiB the bandwidth copy moves (far more than the caches)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", metavar="FILE", help="also write the results as JSON")
    g = p.add_argument_group("--backend cuda")
    g.add_argument("--gpu-mem", metavar="SIZE[,SIZE...]",
                   help="plan for this much VRAM (e.g. 8GiB): a smaller card's budget; one size "
                        "for every GPU or one per GPU of a layer split")
    g.add_argument("--prompt-tokens", type=int, default=4096, metavar="N",
                   help="prompt length to prefill (default 4096)")
    g.add_argument("--gen", type=int, default=128, metavar="N",
                   help="tokens to decode (default 128)")
    g.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="decode by sampling at T (no top-k/top-p filter, seeded by --seed) "
                        "instead of greedily: a random synthetic model's greedy tokens repeat, "
                        "so its measured hit rate samples few tokens' routing (default 0)")
    g.add_argument("--json", action="store_true", help="print the result as JSON")
    g.add_argument("--no-graph", action="store_true",
                   help="launch the decode kernels one by one instead of a CUDA graph")
    g.add_argument("--profile-decode", action="store_true",
                   help="also time the decode step's kernels by launcher (graph replays)")
    g.add_argument("--profile-prefill", action="store_true",
                   help="also run the prompt once more with CUDA events around every launcher "
                        "of the prompt path (time by launcher, idle gaps, host syncs)")
    g.add_argument("--miss-path", choices=("mapped", "cpu", "hybrid"),
                   help="decode misses: mapped host reads on the GPU, the CPU pool, or both "
                        "(hybrid) (default: the engine's)")
    g.add_argument("--adaptive-cache", action="store_true",
                   help="after each prompt, swap cache slots towards the experts it routed to")
    g.add_argument("--prompt-steps", type=int, default=None, metavar="N",
                   help="prompts of up to N tokens run as decode steps (0: never; default: "
                        "where the plan estimates steps beat the prompt path)")
    g.add_argument("--miss-share", type=float, metavar="F",
                   help="--miss-path hybrid: the CPU pool's fraction of the misses (default: "
                        "from the measured rates of both paths)")
    from strata.plan.knobs import add_engine_knobs
    add_engine_knobs(p)
    from strata.plan.split.knobs import add_split_knobs
    add_split_knobs(p)  # --backend cuda over several GPUs: the layer split


def measure_copy_bandwidth(n_bytes: int = MEMBW_BYTES, repeats: int = 5) -> float:
    """GB/s of a numpy copy (bytes read + bytes written per second), best of `repeats`."""
    import numpy as np

    src = np.ones(n_bytes // 8, np.float64)  # [n] f64, touched
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


def _warm(path: str) -> float:
    """Read the whole file once so its pages are resident (GB/s of that read)."""
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 26):
            n += len(chunk)
    return n / max(time.perf_counter() - t0, 1e-9) / 1e9


def _synthetic(preset_name: str, mix: str, n_layer: int, seed: int) -> tuple[str, int]:
    from strata.synth import preset, write_model
    from strata.synth.cache import ensure_cache_dir

    cfg = preset(preset_name)  # preset and n_layer checked by the caller (`_cpu_files`)
    folder = ensure_cache_dir("bench")
    path = folder / f"{preset_name}-L{n_layer}-{mix}-s{seed}.gguf"
    if not path.is_file():
        write_model(path, cfg.with_layers(n_layer), mix=mix, seed=seed, progress=True)
    return str(path), cfg.n_layer


def _decode(engine, first_logits, n_decode: int) -> float:
    import numpy as np

    logits = first_logits
    t0 = time.perf_counter()
    for _ in range(n_decode):
        logits = engine.decode_step(int(np.argmax(logits)))
    return time.perf_counter() - t0


def _pool(model, n_calls: int, seed: int) -> dict:
    """The expert pool alone: one token, random distinct experts of random layers per call."""
    import numpy as np

    s = model.shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(s.n_embd).astype(np.float32)
    calls = [(int(rng.integers(s.n_layer)), rng.choice(s.n_expert, s.n_expert_used, replace=False))
             for _ in range(n_calls)]
    w = np.full(s.n_expert_used, 1.0 / s.n_expert_used, np.float32)
    layer0, ids0 = calls[0]
    model.experts(x, layer0, ids0, w)  # compile / load outside the timing
    t0 = time.perf_counter()
    for layer, ids in calls:
        model.experts(x, layer, ids, w)
    dt = time.perf_counter() - t0
    n_bytes = sum(model.experts.bytes_read(layer, ids) for layer, ids in calls)
    return {"calls": n_calls, "seconds": dt, "bytes": n_bytes, "gb_per_s": n_bytes / dt / 1e9}


def bench_file(path: str, *, n_layer_full: int, n_prompt: int, n_decode: int, n_pool: int,
               seed: int) -> dict:
    """Measure one file; every number the table and the JSON show."""
    import numpy as np

    from strata.engine.cpu import CpuEngine, CpuModel
    from strata.gguf import open_model

    warm_gbps = _warm(path)
    model = CpuModel(open_model(path))
    s = model.shape
    engine = CpuEngine(model, max_context=n_prompt + n_decode + 1, profile=True)
    prompt = np.random.default_rng(seed).integers(0, s.n_vocab, n_prompt).tolist()
    engine.prefill(prompt[:2])  # compile / load the kernels outside the timing
    engine.decode_step(prompt[2])
    engine.reset()
    t0 = time.perf_counter()
    logits = engine.prefill(prompt)
    prefill_s = time.perf_counter() - t0
    engine.layers.seconds.clear()
    engine.layers.expert_bytes = 0
    decode_s = _decode(engine, logits, n_decode)
    per_tok = {k: v / n_decode for k, v in engine.layers.seconds.items()}
    per_tok["other"] = decode_s / n_decode - sum(per_tok.values())
    expert_gbps = engine.layers.expert_bytes / max(engine.layers.seconds["experts"], 1e-12) / 1e9
    t_tok = decode_s / n_decode
    t_head = per_tok.get("head", 0.0)
    t_full = t_head + (t_tok - t_head) * n_layer_full / s.n_layer
    layer_bytes = (model.dense_bytes_per_token - model.matrices["output"].n_bytes) / s.n_layer \
        + engine.layers.expert_bytes / n_decode / s.n_layer
    full_bytes = layer_bytes * n_layer_full + model.matrices["output"].n_bytes
    return {
        "file": os.path.basename(path), "file_bytes": os.path.getsize(path),
        "n_layer": s.n_layer, "n_layer_scaled_to": n_layer_full, "warm_read_gb_per_s": warm_gbps,
        "prefill_tokens": n_prompt, "prefill_tokens_per_s": n_prompt / prefill_s,
        "decode_tokens": n_decode, "decode_tokens_per_s": 1 / t_tok,
        "decode_tokens_per_s_scaled": 1 / t_full,
        "decode_bytes_per_token_scaled": full_bytes,
        "decode_ms_per_token_by_part": {k: round(v * 1e3, 3) for k, v in per_tok.items()},
        "expert_bytes_per_token": engine.layers.expert_bytes / n_decode,
        "expert_gb_per_s": expert_gbps,
        "pool": _pool(model, n_pool, seed),
    }


def _device() -> dict:
    import numba

    name = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                        name)
    except OSError:
        pass
    return {"cpu": name, "cpu_count": os.cpu_count(), "numba_threads": numba.get_num_threads(),
            "threading_layer": numba.threading_layer(), "python": platform.python_version(),
            "numba": numba.__version__,
            # other processes' load during the run: the numbers are only as quiet as the machine
            "load_average_1_5_15": load_average()}


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _table(res: dict) -> str:
    bw = res["copy_gb_per_s"]
    lines = [f"memory bandwidth (numpy copy, read+write): {bw:.2f} GB/s",
             f"{'file':38s} {'prefill':>9s} {'decode':>8s} {'dec@full':>9s} {'bound':>8s} "
             f"{'experts':>9s} {'of bw':>6s} {'pool':>9s} {'of bw':>6s}",
             f"{'':38s} {'tok/s':>9s} {'tok/s':>8s} {'tok/s':>9s} {'tok/s':>8s} "
             f"{'GB/s':>9s} {'':>6s} {'GB/s':>9s} {'':>6s}"]
    for r in res["results"]:
        pool = r["pool"]["gb_per_s"]
        lines.append(
            f"{r['file'][:38]:38s} {r['prefill_tokens_per_s']:9.2f} "
            f"{r['decode_tokens_per_s']:8.2f} {r['decode_tokens_per_s_scaled']:9.2f} "
            f"{r['decode_tokens_per_s_bound_scaled']:8.2f} {r['expert_gb_per_s']:9.2f} "
            f"{100 * r['expert_fraction_of_copy_bw']:5.1f}% {pool:9.2f} {100 * pool / bw:5.1f}%")
    return "\n".join(lines)


def _visible_gpus() -> int:
    """The GPUs numba sees; a machine where the CUDA driver cannot start is the clean error
    `generate --backend cuda` gives there, not numba's CudaSupportError."""
    from strata.engine.multi.request import visible_gpus

    try:
        return visible_gpus()
    except Exception as e:  # numba's CudaSupportError (no driver), or a broken install
        from strata.engine.backends import BackendError, select_backend

        select_backend("cuda")  # raises BackendError saying why, and what can run here
        raise BackendError(f"--backend cuda: numba's CUDA target cannot start ({e})") from None


def _refuse_header_only(paths) -> None:
    """A header-only file (zero weights) is for `strata plan`: refused before the CUDA bench
    loads it. A missing or unreadable file is left to the bench, which names it."""
    from strata.gguf import open_model

    for p in paths or ():
        if os.path.isfile(p):
            open_model(p).check_weights()


def _refuse_synthetic_flags(args) -> None:
    """--preset, --mix and --layers shape the files measured without -m: with -m (which the
    CUDA bench always needs) nothing reads them, so they are refused rather than ignored."""
    from strata.cli.flags import given_in_groups

    given = given_in_groups(add_arguments, args, (SYNTHETIC,)) if args.model else []
    if given:
        one = len(given) == 1
        raise UsageError(f"{', '.join(given)}: {'shapes' if one else 'shape'} the synthetic "
                         f"files measured without -m; with -m FILE nothing reads "
                         f"{'it' if one else 'them'} (drop {'it' if one else 'them'}, or -m)")


def _run_cuda(args) -> int:
    from strata.bench.engine_cuda import run_cuda
    from strata.cli.flags import given_in_groups, ignored_note
    from strata.engine.multi.request import gpu_request

    given = given_in_groups(add_arguments, args, (CPU_BENCH,))
    if given:
        print(ignored_note(given, "--backend cpu", "the CUDA bench"), file=sys.stderr)
    req = gpu_request(args, _visible_gpus())
    _refuse_header_only(args.model)
    if req.is_split:
        from strata.engine.multi.bench import run_split_cli

        return run_split_cli(args, req)
    if req.devices[0] != 0:
        raise UsageError(f"--gpus {args.gpus}: the one-GPU bench runs on GPU 0 (choose the "
                         f"card with CUDA_VISIBLE_DEVICES={req.devices[0]})")
    return run_cuda(args)


def _cpu_files(args) -> list[tuple[str, int]]:
    """(path, layers to scale decode to) of every file the CPU bench measures, each checked
    (or written) before the first is measured."""
    if args.model:
        from strata.gguf import open_model

        files = []
        for p in args.model:  # every file checked before the first is measured
            mf = open_model(p)
            mf.check_weights()  # a header-only file (zero weights) is for `strata plan` alone
            files.append((p, mf.shape.n_layer))
        return files
    from strata.cli.flags import flag_checks
    from strata.synth import preset
    from strata.synth.errors import SynthError
    from strata.synth.mixes import check_mix
    from strata.synth.writer import check_seed

    mix = MIXES if args.mix is None else args.mix
    mixes = [m.strip() for m in mix.split(",") if m.strip()]
    if not mixes:
        raise UsageError(f"--mix {args.mix!r} names no quant mix (give e.g. Q4_K_M,Q8_0)")
    name, n_layer = args.preset or PRESET, LAYERS if args.layers is None else args.layers
    with flag_checks(SynthError):  # the synth library's errors about these values: bad flags
        cfg = preset(name)
        for m in mixes:  # every name before the first file is written
            check_mix(m)
        check_seed(args.seed, "--seed")  # the synthetic files store it
    if not 1 <= n_layer <= cfg.n_layer:
        raise UsageError(f"--layers must be in 1..{cfg.n_layer} for {name}, got {n_layer}")
    return [_synthetic(name, m, n_layer, args.seed) for m in mixes]


def run(args) -> int:
    from strata.engine.multi.request import split_flags_given
    from strata.plan.split.knobs import split_from_args

    split_from_args(args)  # a bad split flag is refused on every backend
    _refuse_synthetic_flags(args)
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    if args.json_out:  # a path that cannot be written is said before the run, not after
        from strata.cli.output import check_output

        check_output(args.json_out, "--json-out")
    if args.backend == "cuda":
        return _run_cuda(args)
    from strata.cli.flags import cuda_only_given, ignored_note
    from strata.engine.multi.request import gpu_sizes
    from strata.plan.knobs import options_from_args

    gpu_sizes(args.gpu_mem)  # a bad size is refused on every backend
    options_from_args(args)  # and a bad VRAM knob, as the CUDA bench would refuse it
    # --max-context too: the CPU bench sizes its context to --n-prompt + --n-decode
    given = (cuda_only_given(add_arguments, args, read=()) + split_flags_given(args)
             + (["--gpus"] if args.gpus else []))
    if given:
        print(ignored_note(given, "--backend cuda", "the CPU bench"), file=sys.stderr)
    for name in ("n_prompt", "n_decode", "n_pool", "membw_mib"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, "
                             f"got {getattr(args, name)}")
    files = _cpu_files(args)
    res = {"load_average_before": load_average(),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "commit": _commit(), "command": "strata " + " ".join(sys.argv[1:]),
           "backend": "cpu", "results": []}
    copies = []
    for path, n_full in files:
        copies.append(measure_copy_bandwidth(args.membw_mib << 20))
        res["results"].append(bench_file(path, n_layer_full=n_full, n_prompt=args.n_prompt,
                                         n_decode=args.n_decode, n_pool=args.n_pool,
                                         seed=args.seed))
    copies.append(measure_copy_bandwidth(args.membw_mib << 20))
    # the machine's bandwidth is the best copy seen: a busy moment never flatters the ratios
    bw = res["copy_gb_per_s"] = max(copies)
    res["copy_gb_per_s_each"] = copies
    for r in res["results"]:
        r["decode_tokens_per_s_bound_scaled"] = bw * 1e9 / r["decode_bytes_per_token_scaled"]
        r["expert_fraction_of_copy_bw"] = r["expert_gb_per_s"] / bw
        r["pool"]["fraction_of_copy_bw"] = r["pool"]["gb_per_s"] / bw
    res["device"] = _device()
    print(_table(res))
    if args.json_out:
        from strata.cli.output import write_atomic

        write_atomic(args.json_out, "--json-out",
                     lambda f: f.write(json.dumps(res, indent=2).encode()))
        print(f"wrote {args.json_out}", file=sys.stderr)
    return 0
