"""`python -m strata.bench.serve_batch -m FILE`: `strata serve`'s decode speed with 1, 2, 4, 8
concurrent clients on the CUDA backend, through the server's own scheduler in-process (the
`Worker` that HTTP requests feed, the batched engine under it), and the batch's correctness.

Per client count n: n jobs (different random prompts, greedy, no stop token, exactly `--gen`
tokens; picked on the device as serve picks them, or with `--pick host` from each step's logits)
are queued at once; the worker prefills them and decodes them together. Reported:
aggregate decode tok/s (tokens after each client's first, over the time from the last first
token to the last finish), each client's own tok/s, end-to-end aggregate (prefills included),
and the milliseconds of one step. Where a step's host time goes (`DecodeTimer`, per round's
"decode_host"): the wall time of `engine.decode()` split at the graph replay's launch and around
the stream's synchronize, and the worker's own time between decodes (with `--no-run-ahead`:
the worker's default runs each step ahead of the one it reads, through `begin_picked`, which the
timer does not see). Correctness: each client's
greedy tokens in every batch against the same prompt decoded alone (how many match, the first
divergence; equal by construction with `--invariant`, else a one-client step's 8-bit-x rounding
may part them at a near-tie). One JSON object (date, commit, device, command) goes to --json.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import numpy as np

TARGET_SPEEDUP_AT_8 = 3.0


class _TokenText:
    """A text stream that spells each token id (the bench reads the ids back from the text)."""

    def push(self, token: int) -> str:
        return f"{token} "

    def flush(self) -> str:
        return ""


class _Greedy:
    """What the worker needs from the model: greedy choice, no stop token. `device`: the host
    `Sampler` at temperature 0, whose settings the worker lets an engine that picks tokens
    pick on the device (as `strata serve` does); else a bare argmax the host runs each step."""

    stop_token_ids: frozenset[int] = frozenset()

    def __init__(self, device: bool = True):
        self.device = device

    def sampler(self, sampling) -> Callable[[np.ndarray], int]:
        if self.device:
            from strata.engine.sampler import Sampler, SamplingParams
            return Sampler(SamplingParams(temperature=0.0))
        return lambda logits: int(np.argmax(logits))

    def text_stream(self, after: int) -> _TokenText:
        return _TokenText()


@dataclass
class _Client:
    prompt: list[int]
    t_submit: float = 0.0
    t_first: float | None = None
    t_finish: float | None = None
    tokens: list[int] = field(default_factory=list)
    reason: str | None = None
    n_cached: int = 0  # prompt tokens the engine found in K/V (`PromptEvent`)
    done: threading.Event = field(default_factory=threading.Event)

    def sink(self, event) -> None:
        from strata.serve.job import FinishEvent, PromptEvent, TextEvent
        now = time.perf_counter()
        if isinstance(event, TextEvent):
            if self.t_first is None:
                self.t_first = now
            self.tokens += [int(t) for t in event.text.split()]
            return
        if isinstance(event, PromptEvent):  # the prompt has run
            self.n_cached = event.n_cached
            return
        if isinstance(event, FinishEvent):
            self.t_finish, self.reason = now, event.reason
            self.done.set()


def run_clients(engine: Any, prompts: list[list[int]], gen: int, *,
                device_pick: bool = True, run_ahead: bool = True,
                prefix_cache: bool = False) -> list[_Client]:
    """Queue one greedy job per prompt on a fresh worker over `engine`; wait for all.
    `device_pick`: tokens picked by the engine where it can (serve's way), else on the host;
    `run_ahead`: the worker enqueues the next step before reading this one's (serve's way);
    `prefix_cache`: prompts take the K/V the engine holds (serve's way; off by default, so
    each round's prompts are computed whole, as the first round's)."""
    from strata.serve.job import Job, Sampling
    from strata.serve.metrics import Metrics
    from strata.serve.worker import Worker

    worker = Worker(engine, _Greedy(device_pick), Metrics(), max_queue=max(1, len(prompts)),
                    run_ahead=run_ahead, prefix_cache=prefix_cache)
    clients = [_Client(list(p)) for p in prompts]
    for c in clients:  # all queued before the worker starts: one admission round
        c.t_submit = time.perf_counter()
        worker.submit(Job(c.prompt, Sampling(max_tokens=gen, temperature=0.0), c.sink))
    worker.start()
    try:
        for c in clients:
            if not c.done.wait(600):
                raise RuntimeError("a benchmark client did not finish in 10 minutes")
    finally:
        worker.stop()
    bad = [c.reason for c in clients if c.reason != "length" or len(c.tokens) != gen]
    if bad:
        raise RuntimeError(f"clients ended early: {bad}")
    return clients


class DecodeTimer:
    """Where `engine.decode()`'s wall time goes, timed from outside the engine: while installed
    (`with timer.installed():`), the engine's `decode`, its step's `run` and its stream's
    `synchronize` are wrapped by instance attributes that read the clock (a few microseconds a
    step, nothing in the engine's own code). Per decode call: the time until the step is
    enqueued (checks, the token copy, the graph launch), until synchronize is entered (the
    logits and hit-count copies enqueued), inside synchronize (the GPU finishing the step and
    the copies) and after it (the logits' host copy, the return)."""

    PARTS = ("until_replay_ms", "enqueue_copies_ms", "sync_wait_ms", "after_sync_ms")

    def __init__(self, engine: Any, *, clock: Callable[[], float] = time.perf_counter):
        self.engine = engine
        self.clock = clock
        self.calls: list[tuple[int, list[float]]] = []  # (rows, [start, run, sync in/out, end])
        self._marks: list[float] | None = None

    @contextmanager
    def installed(self):
        eng, clock = self.engine, self.clock
        run, sync = eng.step.run, eng.m.stream.synchronize

        def timing(decode):
            def timed_decode(slots, *args):
                self._marks = marks = [clock()]
                try:
                    out = decode(slots, *args)
                finally:
                    self._marks = None
                marks.append(clock())
                if len(marks) == 5:  # a step ran (not a refused or empty call)
                    self.calls.append((len(slots), marks))
                return out
            return timed_decode

        def timed_run(n, pick=False):
            run(n, pick)
            if self._marks is not None:
                self._marks.append(clock())

        def timed_sync():
            if self._marks is None:  # a prefill's: not timed
                return sync()
            self._marks.append(clock())
            sync()
            self._marks.append(clock())

        patched = [(eng, "decode", timing(eng.decode)), (eng.step, "run", timed_run),
                   (eng.m.stream, "synchronize", timed_sync)]
        if hasattr(eng, "decode_picked"):
            patched.append((eng, "decode_picked", timing(eng.decode_picked)))
        for obj, name, fn in patched:
            setattr(obj, name, fn)
        try:
            yield self
        finally:
            for obj, name, _ in patched:
                delattr(obj, name)  # the class's method again

    def summary(self, n_rows: int) -> dict | None:
        """Mean milliseconds of the decode calls of `n_rows` rows: the four parts, their sum
        ("decode_ms"), the period between consecutive calls' starts and what the worker spends
        between calls (sampling, text, events: period minus decode)."""
        calls = [m for n, m in self.calls if n == n_rows]
        if not calls:
            return None
        t = np.array(calls) * 1e3  # [n_calls, 5] ms
        parts = np.diff(t, axis=1).mean(axis=0)
        out = {"n_steps": len(calls), "decode_ms": float(parts.sum())}
        out |= {name: float(v) for name, v in zip(self.PARTS, parts)}
        period = float(np.diff(t[:, 0]).mean()) if len(calls) > 1 else None
        out["step_period_ms"] = period
        out["between_decodes_ms"] = None if period is None else period - out["decode_ms"]
        return out


def summarize(clients: list[_Client], gen: int) -> dict:
    """Aggregate and per-client rates of one round."""
    last_first = max(c.t_first for c in clients)
    last_finish = max(c.t_finish for c in clients)
    decode_s = last_finish - last_first
    per = [(gen - 1) / (c.t_finish - c.t_first) for c in clients]
    return {
        "clients": len(clients),
        "aggregate_decode_tok_s": len(clients) * (gen - 1) / decode_s,
        "per_client_tok_s": {"min": min(per), "mean": float(np.mean(per)), "max": max(per)},
        "step_ms": 1e3 * decode_s / (gen - 1),
        "end_to_end_tok_s": len(clients) * gen / (last_finish - min(c.t_submit for c in clients)),
    }


def host_table(rounds: list[dict]) -> str:
    """Each round's mean decode call split into its parts, and the worker's time between calls
    (milliseconds; `DecodeTimer.summary`)."""
    cols = ("decode_ms",) + DecodeTimer.PARTS + ("between_decodes_ms",)
    heads = ("decode", "to replay", "copies", "sync wait", "after", "between")
    lines = ["host ms " + " ".join(f"{h:>9}" for h in heads)]
    for r in rounds:
        h = r.get("decode_host") or {}
        cells = (f"{h[c]:>9.3f}" if h.get(c) is not None else f"{'-':>9}" for c in cols)
        lines.append(f"{r['clients']:>7} " + " ".join(cells))
    return "\n".join(lines)


def _agreement(batched: list[int], alone: list[int]) -> dict:
    diff = [i for i, (a, b) in enumerate(zip(batched, alone)) if a != b]
    return {"equal": batched == alone, "first_divergence": diff[0] if diff else None}


def measure(engine: Any, *, clients: list[int], prompt_tokens: int, gen: int,
            seed: int = 0, device_pick: bool = True, run_ahead: bool = True) -> dict:
    """Warm every client count (compiles, captures its graph), then one timed round per count
    and each prompt alone (picked on the host: the reference) for the correctness check."""
    rng = np.random.default_rng(seed)
    n_max = max(clients)
    prompts = [rng.integers(0, engine.shape.n_vocab, prompt_tokens).tolist()
               for _ in range(n_max)]
    for n in clients:
        run_clients(engine, prompts[:n], 4, device_pick=device_pick, run_ahead=run_ahead)
    rounds, tokens = [], {}
    for n in clients:
        timer = DecodeTimer(engine)
        with timer.installed():
            got = run_clients(engine, prompts[:n], gen, device_pick=device_pick,
                              run_ahead=run_ahead)
        key = ("pick", n) if device_pick else n
        rounds.append(summarize(got, gen) | {"graph_nodes": engine.step.n_graph_nodes.get(key),
                                             "decode_host": timer.summary(n)})
        tokens[n] = [c.tokens for c in got]
        print(f"clients {n}: {rounds[-1]['aggregate_decode_tok_s']:8.1f} tok/s aggregate, "
              f"{rounds[-1]['per_client_tok_s']['mean']:7.1f} per client, "
              f"{rounds[-1]['step_ms']:6.2f} ms/step", file=sys.stderr, flush=True)
    alone = [run_clients(engine, [p], gen, device_pick=False)[0].tokens for p in prompts]
    check = {str(n): [_agreement(t, alone[i]) for i, t in enumerate(tokens[n])]
             for n in clients}
    one = next((r for r in rounds if r["clients"] == 1), None)
    for r in rounds:
        r["speedup_vs_1"] = r["aggregate_decode_tok_s"] / one["aggregate_decode_tok_s"] \
            if one else None
    return {"rounds": rounds, "greedy_vs_alone": check,
            "all_equal": all(a["equal"] for v in check.values() for a in v)}


BATCH_LAUNCHERS = ("scatter_tokens", "embed", "rms_norm", "matvec", "matvec_batch", "matvec_tc",
                   "qk_norm_rope", "kv_write", "decode_attention", "kv_write_rows", "attention_rows",
                   "add", "route", "batch_moe_decode", "moe_decode", "moe_decode_mixed",
                   "advance_seq_len")


def profile_rows(engine: Any, counts: list[int], prompt_tokens: int, seed: int = 1) -> dict:
    """The batched step's time by launcher for each row count in `counts` (graphs replayed,
    `strata.engine.cuda.profile`): n sequences prefilled, each row's next input token in the
    step's token buffer (the step writes it at the row's position), then the step replayed with
    the positions held (advance_seq_len left out, so every replay writes and reads the same KV
    rows)."""
    import strata.engine.cuda.batch_step as batch_step_mod
    import strata.engine.cuda.decode as decode_mod
    from strata.engine.cuda.profile import LAUNCHERS, profile_step

    rng = np.random.default_rng(seed)
    a, st, out = engine.m.acts, engine.m.stream, {}
    for n in counts:
        for slot in range(n):
            engine.prefill(slot, rng.integers(0, engine.shape.n_vocab, prompt_tokens).tolist())
        tok = rng.integers(0, engine.shape.n_vocab, n).astype(np.int32)  # [n] i32
        a["step_tokens"][:n].copy_to_device(tok, stream=st)
        st.synchronize()
        # one row without batch invariance runs the single engine's step (its launchers are
        # decode.py's; the token scatter before it then runs in every unit's graph)
        one = n == 1 and engine.step.one is not None
        out[str(n)] = profile_step(engine.step, module=decode_mod if one else batch_step_mod,
                                   launchers=LAUNCHERS if one else BATCH_LAUNCHERS,
                                   record=lambda s_, n=n: engine.step.record(s_, n),
                                   frozen=("advance_seq_len",))
        for slot in range(n):
            engine.release(slot)
    return out


def _device_name() -> str:
    from numba import cuda
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.bench.serve_batch", description=__doc__)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--clients", default="1,2,4,8", help="client counts (default 1,2,4,8)")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--gen", type=int, default=64, help="tokens per client (default 64)")
    p.add_argument("--max-context", type=int, default=512, help="per sequence (default 512)")
    p.add_argument("--gpu-mem", help="plan within this much VRAM")
    p.add_argument("--json", metavar="FILE", help="write the result here")
    p.add_argument("--pick", choices=("device", "host"), default="device",
                   help="where tokens are chosen: the engine (serve's way; default) or the "
                        "host from each step's logits")
    p.add_argument("--no-run-ahead", dest="run_ahead", action="store_false",
                   help="the worker reads each step before enqueuing the next (device picks "
                        "only; serve runs one step ahead; the host table times only this way)")
    p.add_argument("--compare", action="store_true",
                   help="after the run, the same rounds stepped one at a time (no run-ahead), "
                        "then also batch-invariant (the loop before 2026-12-02's changes), on "
                        "the same loaded engine")
    p.add_argument("--invariant", action="store_true",
                   help="batch-invariant engine (strata serve --batch-invariant): one client's "
                        "steps run the batched kernels' float32 path, not the fused single step")
    p.add_argument("--command", help="the command line to record (default: this one)")
    p.add_argument("--profile-rows", default="", metavar="N,N",
                   help="after the rounds, the batched step's time by launcher at these row "
                        "counts (CUDA graphs; e.g. 1,8)")
    args = p.parse_args(argv)
    clients = sorted({int(c) for c in args.clients.split(",")})
    if args.gen < 2 or args.prompt_tokens + args.gen > args.max_context:
        p.error("need --gen >= 2 and --prompt-tokens + --gen <= --max-context")
    try:
        prof_rows = sorted({int(c) for c in args.profile_rows.split(",") if c.strip()})
    except ValueError:
        p.error(f"--profile-rows {args.profile_rows!r}: expected row counts like 1,8")
    if any(not 1 <= n <= max(clients) for n in prof_rows):
        p.error(f"--profile-rows {args.profile_rows}: each row count must be 1..{max(clients)} "
                f"(the engine holds as many sequences as the most --clients)")

    from strata.bench.engine_cuda import _commit
    from strata.engine.cuda.batch import batch_options, load_batch
    from strata.gguf import open_model
    from strata.plan.devices import parse_size
    from strata.plan.options import PlanOptions

    mf = open_model(args.model)
    t0 = time.perf_counter()
    opts = batch_options(mf, max(clients), PlanOptions(max_context=args.max_context),
                         gpu_mem=parse_size(args.gpu_mem) if args.gpu_mem else None,
                         progress=False)
    engine = load_batch(mf, opts, log=lambda t: print(t, file=sys.stderr),
                        invariant=args.invariant)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = measure(engine, clients=clients, prompt_tokens=args.prompt_tokens, gen=args.gen,
                     device_pick=args.pick == "device", run_ahead=args.run_ahead)
    compare = {}
    if args.compare:  # the same engine, stepped one at a time, then also batch-invariant
        for name, invariant in (("no run-ahead", args.invariant),
                                ("no run-ahead, batch-invariant", True)):
            engine.set_invariant(invariant)
            got = measure(engine, clients=clients, prompt_tokens=args.prompt_tokens,
                          gen=args.gen, device_pick=args.pick == "device", run_ahead=False)
            compare[name] = got
        engine.set_invariant(args.invariant)
    hits = engine.hit_counts().sum(axis=0)
    profile = profile_rows(engine, prof_rows, args.prompt_tokens) if prof_rows else None
    out = {
        "bench": "serve_batch", "model": args.model, "arch": mf.arch,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(), "device": _device_name(),
        "command": args.command or " ".join(["python -m strata.bench.serve_batch"]
                                            + (argv if argv is not None else sys.argv[1:])),
        "slots": engine.n_slots, "max_context_per_sequence": engine.max_context,
        "prompt_tokens": args.prompt_tokens, "gen": args.gen, "pick": args.pick,
        "invariant": args.invariant, "run_ahead": args.run_ahead and args.pick == "device",
        "load_seconds": load_s,
        "run_seconds": time.perf_counter() - t0,
        "decode_hit_rate": float(hits[0] / max(1, hits.sum())),
        "target": {"aggregate_speedup_at_8": TARGET_SPEEDUP_AT_8},
        **result, "profile": profile, "compare": compare or None,
    }
    r8 = next((r for r in result["rounds"] if r["clients"] == 8), None)
    out["target_met"] = None if r8 is None else r8["speedup_vs_1"] >= TARGET_SPEEDUP_AT_8
    print(f"{'clients':>7} {'agg tok/s':>10} {'per client':>10} {'ms/step':>8} {'x vs 1':>7}")
    for r in result["rounds"]:
        print(f"{r['clients']:>7} {r['aggregate_decode_tok_s']:>10.1f} "
              f"{r['per_client_tok_s']['mean']:>10.1f} {r['step_ms']:>8.2f} "
              f"{r['speedup_vs_1'] or 0:>7.2f}")
    print(host_table(result["rounds"]))
    for name, got in compare.items():
        print(f"{name}: " + ", ".join(f"{r['clients']} clients {r['aggregate_decode_tok_s']:.1f} "
                                      f"tok/s" for r in got["rounds"])
              + f"; tokens equal alone: {got['all_equal']}")
    print(f"greedy tokens equal to each prompt decoded alone: {result['all_equal']}")
    if profile:
        from strata.engine.cuda.profile import profile_table
        for n, prof in profile.items():
            print(f"rows {n}:\n{profile_table(prof)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
