"""The CUDA engine's device suite in one process over one host store (a 31 GB Q8_0 store is
filled and registered once, not per load):

* `d2`: decode after a 4096-token prompt with `--gpu-mem 8GiB`, by each miss path;
* `p1`: a 16K-token prompt with `--gpu-mem 8GiB` against the PCIe streaming bound;
* `miss`: decode with expert caches of several sizes (hit rates), misses served by mapped reads,
  by the CPU pool and by both at once (hybrid, the split from measured rates), on one card
  (`--gpu-mem` caps it, e.g. beside another process);
* `oom`: budgets x contexts x chunks: every accepted plan runs a prompt and 32 decode steps,
  every refusal comes at start-up (no device allocation) with knobs; printed as a matrix.

    python -m strata.bench.engine_cuda_suite -m FILE.gguf --out DIR [--parts d2,p1,miss,oom]
        [--oom-budgets 6,8,16,24] [--oom-contexts 4096,32768,131072] [--oom-prompt 2048]

Each part writes DIR/<part>.json (date, commit, device, command inside) as soon as it is done.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

GIB = 1 << 30
PARTS = ("d2", "p1", "miss", "oom")
MISS_PATHS = ("mapped", "cpu", "hybrid")
OOM_BUDGETS_GIB = (6, 8, 12, 16, 24)
OOM_CONTEXTS = (4096, 16384, 32768, 65536, 131072)
OOM_CHUNKS = ("auto", "2048")
OOM_PROMPT_MAX = 2048  # the matrix's prompt: one chunk of the plan, at most this many tokens
OOM_DECODE_STEPS = 32


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Suite:
    def __init__(self, args):
        from strata.bench.engine_cuda import _commit
        from strata.engine.cuda.hostmem import map_host
        from strata.experts import build_store
        from strata.gguf import open_model
        from strata.memory import emm

        self.args = args
        self.counter = emm.install_counting_manager()
        # the bounds' rates: measured by the first run, after it (as `strata bench` does: made
        # before a load, their buffers slowed that model's decode), then shared
        self.bw: dict | None = None
        self.mf = open_model(args.model)
        t0 = time.perf_counter()
        store = build_store(self.mf, with_embd=True)
        self.store = (store, map_host(store.buffer))
        self.store_seconds = time.perf_counter() - t0
        self.commit = args.commit or _commit()
        _log(f"store {store.n_bytes / 1e9:.1f} GB filled and registered in "
             f"{self.store_seconds:.1f} s")

    def options(self, *, gpu_mem=None, miss_path="mapped", **plan):
        from strata.engine.cuda.options import CudaOptions
        from strata.plan.options import PlanOptions

        return CudaOptions(plan=PlanOptions(**plan), gpu_mem=gpu_mem, progress=False,
                           miss_path=miss_path)

    def bench(self, *, prompt: int, gen: int, options) -> dict:
        from strata.bench.engine_cuda import measure

        ns = SimpleNamespace(model=[self.args.model], prompt_tokens=prompt, gen=gen, seed=0,
                             temperature=self.args.temperature)
        res = measure(ns, options, host_store=self.store, bw=self.bw)
        if self.bw is None:
            self.bw = res["bandwidth"]
            _log(f"bandwidths {self.bw}")
        return res

    def write(self, part: str, body: dict) -> None:
        from numba import cuda

        try:
            name = cuda.get_current_device().name
        except Exception:  # the simulator's device
            name = "unknown"
        t = getattr(self.args, "temperature", 0.0)
        sampled = f" --temperature {t:g}" if t else ""
        body.update(date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    commit=self.commit, device=name.decode() if isinstance(name, bytes) else name,
                    command=f"python -m strata.bench.engine_cuda_suite -m {self.args.model} "
                            f"--parts {part}{sampled}  (file: {self.args.file_note})",
                    bandwidth=self.bw, store_seconds=self.store_seconds)
        path = Path(self.args.out) / f"{part}.json"
        path.write_text(json.dumps(body, indent=2, default=float))
        _log(f"wrote {path}")

    # -- parts ---------------------------------------------------------------------------------

    def d2(self) -> None:
        runs = {mp: self.bench(prompt=4096, gen=128, options=self.options(
            gpu_mem=8 * GIB, miss_path=mp, max_context=4608)) for mp in ("mapped", "cpu")}
        for mp, r in runs.items():
            d = r["decode"]
            _log(f"D2 {mp}: {d['tokens_per_s']:.1f} tok/s, bound {d['bound_tokens_per_s']:.1f}, "
                 f"hit {d['hit_rate_measured']:.3f} (plan {d['hit_rate_predicted']:.3f})")
        self.write("d2", {"target": {"decode_tok_s": 70, "fraction_of_miss_path_bound": 0.6},
                          "runs": runs})

    def p1(self) -> None:
        r = self.bench(prompt=16384, gen=32, options=self.options(gpu_mem=8 * GIB,
                                                                  max_context=16896))
        p = r["prefill"]
        _log(f"P1: {p['tokens_per_s']:.0f} tok/s, bound {p['pcie_streaming_bound_tokens_per_s']}")
        self.write("p1", {"target": {"fraction_of_streaming_bound": 0.8}, "run": r,
                          "compute_only": self.compute_only(p["tokens_per_s"], prompt=16384)})

    def compute_only(self, tok_s: float, *, prompt: int) -> dict:
        """The same prompt with no budget cap, every expert resident where the card holds them
        all: nothing streams, so its rate is what the kernels allow, the other bound P1 is held
        to (measured at 16K: P1 is compute-bound, far below the PCIe one)."""
        r = self.bench(prompt=prompt, gen=2, options=self.options(max_context=prompt + 512))
        rate, streamed = r["prefill"]["tokens_per_s"], r["prefill"]["bytes_streamed"]
        if streamed:  # some experts still streamed: not a compute-only rate
            _log(f"compute-only: not every expert fits this card ({streamed / 1e9:.2f} GB "
                 f"streamed uncapped)")
            return {"tokens_per_s": None, "why": f"not every expert fits: {streamed} bytes "
                                                 "streamed with no budget cap"}
        _log(f"compute-only: {rate:.0f} tok/s; P1 at {tok_s / rate:.1%} of it")
        return {"tokens_per_s": rate, "fraction": tok_s / rate, "load": r["load"]}

    def miss(self) -> None:
        n_pairs = self.mf.shape.n_layer * self.mf.shape.n_expert
        rows = []
        for frac in self.args.sweep:
            for mp in self.args.miss_paths:
                r = self.bench(prompt=512, gen=64, options=self.options(
                    miss_path=mp, max_context=1024, expert_cache=int(round(frac * n_pairs)),
                    gpu_mem=self.args.gpu_mem))
                d = r["decode"]
                rows.append({"cache_fraction": frac, "miss_path": mp,
                             "tokens_per_s": d["tokens_per_s"],
                             "hit_rate_measured": d["hit_rate_measured"],
                             "hit_rate_predicted": d["hit_rate_predicted"],
                             "missed_bytes_per_token": d["host_bytes_per_token"],
                             "missed_gb_per_s_achieved": d["host_bytes_per_token"]
                             * d["tokens_per_s"] / 1e9,
                             "cpu_pool_gb_per_s": d["cpu_pool_gb_per_s"],
                             "miss_split": d.get("miss_split")})
                _log(f"miss sweep {frac:.2f} {mp:6s}: {d['tokens_per_s']:7.1f} tok/s, hit "
                     f"{d['hit_rate_measured']:.3f}")
                self.write("miss", {"rows": rows, "partial": True})  # kept if a later run dies
        self.write("miss", {"rows": rows, "table": miss_table(rows),
                            "gpu_mem_cap": self.args.gpu_mem})
        print(miss_table(rows), flush=True)

    def oom(self, *, budgets_gib=None, contexts=None, chunks=OOM_CHUNKS,
            prompt_max: int | None = None, steps: int = OOM_DECODE_STEPS) -> None:
        """Every (budget, context, chunk): load by the plan or be refused at start-up; an
        accepted load runs a prompt of min(chunk, prompt_max, context - 40) tokens and `steps`
        decode steps. The device allocations of each cell are counted (one: the arena)."""
        from strata.plan.options import PrefillRequest

        a = self.args
        budgets_gib = budgets_gib or getattr(a, "oom_budgets", None) or OOM_BUDGETS_GIB
        contexts = contexts or getattr(a, "oom_contexts", None) or OOM_CONTEXTS
        prompt_max = prompt_max or getattr(a, "oom_prompt", None) or OOM_PROMPT_MAX
        cells, t_end = [], time.perf_counter() + self.args.oom_seconds
        for budget in budgets_gib:
            for ctx in contexts:
                for chunk in chunks:
                    cell = {"budget_gib": budget, "context": ctx, "chunk": chunk}
                    cells.append(cell)
                    if time.perf_counter() > t_end:
                        cell["result"] = "not run (suite time budget)"
                        continue
                    opts = self.options(gpu_mem=int(budget * GIB), max_context=ctx,
                                        prefill=PrefillRequest.parse(chunk))
                    cell.update(self._oom_cell(opts, ctx, prompt_max, steps))
                    _log(f"oom {budget} GiB ctx {ctx} {chunk}: {cell['result']}")
        table = oom_table(cells)
        print(table, flush=True)
        self.write("oom", {"cells": cells, "table": table,
                           "prompt": f"min(plan chunk, {prompt_max}, context - 40) tokens",
                           "decode_steps": steps})

    def _oom_cell(self, opts, ctx: int, prompt_max: int, steps: int) -> dict:
        from strata.engine.cuda import engine as engine_mod
        from strata.engine.cuda import model as model_mod
        from strata.engine.cuda.options import CudaEngineError

        n0 = len(self.counter.sizes)
        try:
            m = model_mod.CudaModel(self.mf, opts, host_store=self.store)
        except CudaEngineError as e:
            msg = str(e)
            return {"result": "refused", "allocations": len(self.counter.sizes) - n0,
                    "knobs": [ln.strip() for ln in msg.splitlines() if ln.startswith("    ")],
                    "message": msg.splitlines()[0]}
        except Exception as e:  # recorded: a load that dies instead of refusing is a failure
            return {"result": f"FAILED at load: {type(e).__name__}: {e}"}
        try:
            out = self._oom_run(m, engine_mod.CudaEngine, ctx, prompt_max, steps)
        finally:
            m.close()
        out["allocations"] = len(self.counter.sizes) - n0
        return out

    def _oom_run(self, m, engine_cls, ctx: int, prompt_max: int, steps: int) -> dict:
        import numpy as np

        p = m.plan.prefill
        out = {"chunk_planned": p.chunk, "mode": p.mode, "lend_slots": p.lend_slots,
               "ring_slots": p.ring_slots, "cache_slots": m.arena.device_plan.cache.n_slots,
               "arena_bytes": m.arena.device_plan.arena_bytes,
               "hit_rate_predicted": m.plan.predicted_hit_rate}
        try:
            eng = engine_cls(m)
            n = max(1, min(p.chunk, prompt_max, ctx - 40))
            prompt = np.random.default_rng(ctx).integers(0, m.shape.n_vocab, n).tolist()
            t0 = time.perf_counter()
            eng.prefill(prompt)
            eng.decode_tokens(steps + 1)
            h = eng.hits()
            out.update(result="ok", prompt_tokens=n, seconds=time.perf_counter() - t0,
                       hit_rate_measured=h.hit_rate)
        except Exception as e:  # recorded: a failure after READY is what the matrix looks for
            out.update(result=f"FAILED after load: {type(e).__name__}: {e}")
        return out


def miss_table(rows: list[dict]) -> str:
    """Decode tok/s per cache size (a row) and miss path (a column), the fastest named."""
    paths = list(dict.fromkeys(r["miss_path"] for r in rows))
    lines = [f"{'cache':>6s} {'hit':>6s} " + " ".join(f"{p:>9s}" for p in paths)
             + "  faster   (decode tok/s)"]
    for f in sorted({r["cache_fraction"] for r in rows}):
        by = {r["miss_path"]: r for r in rows if r["cache_fraction"] == f}
        if len(by) < 2:
            continue
        first = next(iter(by.values()))
        hit = first["hit_rate_measured"] or 0.0
        best = max(by, key=lambda p: by[p]["tokens_per_s"])
        cells = " ".join(f"{by[p]['tokens_per_s']:9.1f}" if p in by else f"{'-':>9s}"
                         for p in paths)
        lines.append(f"{f:6.0%} {hit:6.1%} {cells}  {best}")
    return "\n".join(lines)


def oom_table(cells: list[dict]) -> str:
    """The matrix: a row per budget, a column per (context, chunk)."""
    def show(c):
        r = c.get("result", "")
        if r == "ok":
            return f"ok {c['mode'][0]}{c['chunk_planned']}"
        if r == "refused":
            return f"refused({len(c.get('knobs', []))}k)"
        return "FAIL" if r.startswith("FAILED") else "-"
    cols = list(dict.fromkeys((c["context"], c["chunk"]) for c in cells))
    budgets = list(dict.fromkeys(c["budget_gib"] for c in cells))
    by = {(c["budget_gib"], c["context"], c["chunk"]): c for c in cells}
    head = f"{'budget':>8s} " + " ".join(f"{f'{ctx // 1024}K/{ch}':<13s}" for ctx, ch in cols)
    lines = [head]
    for b in budgets:
        lines.append(f"{b:>5g}GiB " + " ".join(f"{show(by[(b, ctx, ch)]):<13s}"
                                                for ctx, ch in cols))
    lines.append("ok o|bN: accepted, prompt path owned|borrowed with chunk N, a prompt and the "
                 "decode steps ran; refused(Nk): refused at start-up with N knobs; FAIL: see the "
                 "cell")
    return "\n".join(lines)


def _numbers(text: str | None, kind) -> tuple | None:
    return None if not text else tuple(kind(x) for x in text.split(",") if x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata.bench.engine_cuda_suite")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--sweep", default="0,0.15,0.35,0.7",
                    help="expert-cache sizes of the miss sweep, as fractions of all experts")
    ap.add_argument("--miss-paths", default=",".join(MISS_PATHS),
                    help="the miss sweep's paths (default: all)")
    ap.add_argument("--gpu-mem", default=None,
                    help="the miss sweep's VRAM budget cap (e.g. 40GiB; default: the card)")
    ap.add_argument("--oom-budgets", default=None,
                    help="the OOM matrix's budgets in GiB (default: 6,8,12,16,24)")
    ap.add_argument("--oom-contexts", default=None,
                    help="its contexts (default: 4096,16384,32768,65536,131072)")
    ap.add_argument("--oom-prompt", type=int, default=None,
                    help=f"its prompt: at most this many tokens (default {OOM_PROMPT_MAX})")
    ap.add_argument("--oom-seconds", type=float, default=120.0,
                    help="time budget of the OOM matrix (later cells: not run)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="decode by sampling at this temperature (strata bench --temperature)")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--file-note", default="")
    args = ap.parse_args(argv)
    args.sweep = [float(x) for x in args.sweep.split(",")]
    args.miss_paths = [p for p in args.miss_paths.split(",") if p]
    if set(args.miss_paths) - set(MISS_PATHS):
        ap.error(f"--miss-paths {args.miss_paths}: known: {', '.join(MISS_PATHS)}")
    if args.gpu_mem:
        from strata.plan.devices import parse_size
        args.gpu_mem = parse_size(args.gpu_mem)
    args.oom_budgets = _numbers(args.oom_budgets, float)
    args.oom_contexts = _numbers(args.oom_contexts, int)
    parts = [p for p in args.parts.split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"unknown parts {bad}; known: {', '.join(PARTS)}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    suite = Suite(args)
    for part in parts:
        t0 = time.perf_counter()
        try:
            getattr(suite, part)()
        except Exception as e:  # one part's failure must not lose the others' results
            import traceback

            traceback.print_exc()
            suite.write(part, {"error": f"{type(e).__name__}: {e}"})
        _log(f"part {part}: {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
