"""Where a prompt's time goes: the prompt run once with every launcher of the prompt path
(`strata.engine.cuda.prefill`) wrapped so that a CUDA event is recorded on the compute stream
before and after each call, the pairs resolved once the prompt is done.

A launcher's time is the sum of its [start, end] event intervals (the kernels it launches, and
any wait between them). What the stream does between one launcher's end and the next one's start
is idle time: the host preparing the next launch, the per-layer host sync (the grouping's counts
read back in `_moe`) or a wait on the ring's copies; it is reported per pair of neighbouring
launchers ("route_tokens -> moe_gate_up"). The host side: the prompt's wall time, the time spent
inside the launchers (Python dispatch and the driver's launch), and the time from the last launch
before each stream synchronize to that synchronize's return (the counts' copy and the wait).

The events cost a few microseconds of host time per launch, so the profiled prompt is a little
slower than an un-instrumented one: bench reports its tokens/s from its own timed run
(`strata bench --backend cuda --profile-prefill`). The prompt path takes no CUDA graph, so the
events are never recorded inside a capture.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import strata.engine.cuda.prefill as prefill_mod

# the kernel launchers a prompt chunk calls, by the names prefill.py imports them under
LAUNCHERS = ("embed", "rms_norm", "rms_norm_f16", "dense_matmul", "fill_positions",
             "qk_norm_rope", "kv_write", "prefill_attention", "add", "route", "route_tokens",
             "mask_ids", "moe_gate_up", "gate_up_unfused", "moe_down", "combine", "matvec",
             "advance_seq_len")
ROLE_LAUNCHERS = {"dense_matmul": 2, "matvec": 3}  # launcher -> position of its output argument
EVENTS_PER_LAYER = 64  # the pool made up front: two events per launch, ~20 launches a layer


@dataclass(frozen=True, slots=True)
class CudaEvents:
    """The event source: numba's CUDA events (timing on)."""

    def new(self) -> Any:
        from numba import cuda

        return cuda.event()

    def record(self, ev, stream) -> None:
        ev.record(stream)

    def elapsed_ms(self, start, end) -> float:
        from numba import cuda

        return cuda.event_elapsed_time(start, end)


def output_roles(shape) -> dict[int, str]:
    """Which weight a prompt-path projection multiplies, by its output's last dimension."""
    roles: dict[int, list[str]] = {}
    for n, name in ((shape.n_head * shape.head_dim, "q"), (shape.n_head_kv * shape.head_dim, "k/v"),
                    (shape.n_embd, "attn_output"), (shape.n_expert, "router"),
                    (shape.n_vocab, "head")):
        roles.setdefault(int(n), []).append(name)
    return {n: "|".join(names) for n, names in roles.items()}


def unit_key(name: str, roles: dict[int, str], args, kwargs) -> str:
    """The profile's key of one launch: the launcher's name, a projection's with its role."""
    pos = ROLE_LAUNCHERS.get(name)
    if pos is None:
        return name
    out = args[pos] if len(args) > pos else kwargs.get("y", kwargs.get("out"))
    role = roles.get(int(getattr(out, "shape", (-1,))[-1]))
    return f"{name} {role}" if role else name


@dataclass(slots=True)
class _Tally:
    """What the wrapped launchers and synchronizes saw during one profiled prompt."""

    events: Any
    stream: Any
    clock: Callable[[], float]
    pool: list = field(default_factory=list)
    used: int = 0
    launches: list = field(default_factory=list)  # (key, start event, end event, host s)
    last_return: float | None = None
    sync_s: float = 0.0
    n_sync: int = 0

    def event(self) -> Any:
        if self.used == len(self.pool):
            self.pool.append(self.events.new())
        ev = self.pool[self.used]
        self.used += 1
        return ev

    def launch(self, key: str, fn, args, kwargs):
        start, end = self.event(), self.event()
        t0 = self.clock()
        self.events.record(start, self.stream)
        out = fn(*args, **kwargs)
        self.events.record(end, self.stream)
        self.last_return = self.clock()
        self.launches.append((key, start, end, self.last_return - t0))
        return out

    def synchronize(self, real_sync) -> None:
        real_sync()
        now = self.clock()
        if self.last_return is not None:  # from the last launch: the counts' copy and the wait
            self.sync_s += now - self.last_return
            self.n_sync += 1
            self.last_return = None


def _add(table: dict, key: str, ms: float, host_ms: float = 0.0) -> None:
    row = table.setdefault(key, {"ms": 0.0, "calls": 0, "host_ms": 0.0})
    row["ms"] += ms
    row["calls"] += 1
    row["host_ms"] += host_ms


def _resolve(tally: _Tally, wall_s: float) -> dict:
    units: dict[str, dict] = {}
    gaps: dict[str, dict] = {}
    prev = None
    for key, start, end, host_s in tally.launches:
        _add(units, key, tally.events.elapsed_ms(start, end), 1e3 * host_s)
        if prev is not None:
            _add(gaps, f"{prev[0]} -> {key}", max(tally.events.elapsed_ms(prev[2], start), 0.0))
        prev = (key, start, end)
    gpu = sum(u["ms"] for u in units.values())
    span = (tally.events.elapsed_ms(tally.launches[0][1], tally.launches[-1][2])
            if tally.launches else 0.0)
    for g in gaps.values():
        del g["host_ms"]
    return {"wall_ms": 1e3 * wall_s, "gpu_ms": gpu, "span_ms": span,
            "idle_ms": sum(g["ms"] for g in gaps.values()), "n_launches": len(tally.launches),
            "launch_host_ms": sum(u["host_ms"] for u in units.values()),
            "host_sync": {"ms": 1e3 * tally.sync_s, "calls": tally.n_sync},
            "units": units, "gaps": gaps}


def profile_prefill(run_prompt: Callable[[], Any], *, stream, shape, module=None,
                    launchers: tuple[str, ...] = LAUNCHERS, events=None,
                    clock: Callable[[], float] = time.perf_counter) -> dict:
    """Run `run_prompt()` (one whole prompt through `module`'s launchers, default the prompt
    path) with every launcher timed by events on `stream`; returns {"wall_ms", "gpu_ms" (the
    launchers' sum), "span_ms" (first start to last end), "idle_ms" (the stream between
    launchers), "n_launches", "launch_host_ms", "host_sync": {"ms", "calls"}, "units": {key:
    {"ms", "calls", "host_ms"}}, "gaps": {"a -> b": {"ms", "calls"}}}. A unit is a launcher,
    dense_matmul / matvec one per weight role ("dense_matmul q", ...). `events` / `clock`:
    stand-ins for tests (default: CUDA events, perf_counter)."""
    module = module or prefill_mod
    events = events or CudaEvents()
    roles = output_roles(shape)
    real = {n: getattr(module, n) for n in launchers if hasattr(module, n)}
    tally = _Tally(events, stream, clock)
    n_layer = int(getattr(shape, "n_layer", 1))
    tally.pool = [events.new() for _ in range(EVENTS_PER_LAYER * (n_layer + 1))]
    real_sync = stream.synchronize

    def wrapped(name):
        def call(*args, **kwargs):
            return tally.launch(unit_key(name, roles, args, kwargs), real[name], args, kwargs)
        return call

    try:
        for name in real:
            setattr(module, name, wrapped(name))
        stream.synchronize = lambda: tally.synchronize(real_sync)  # this stream object only
        t0 = clock()
        run_prompt()
        real_sync()
        wall = clock() - t0
    finally:
        for name, fn in real.items():
            setattr(module, name, fn)
        del stream.synchronize
    return _resolve(tally, wall)


def profile_table(prof: dict, *, n_tokens: int, n_gaps: int = 6) -> str:
    """The profiled prompt by unit, largest first (ms, share of the launchers' sum, calls,
    ms/call), the stream's idle time and its largest gaps, and the host's share."""
    gpu, wall = prof["gpu_ms"], prof["wall_ms"]
    lines = [(f"  prefill profile ({n_tokens} tokens, {prof['n_launches']} launches): wall "
              f"{wall:.1f} ms ({n_tokens / max(wall, 1e-9) * 1e3:.0f} tok/s instrumented), "
              f"launchers {gpu:.1f} ms on the GPU, stream idle {prof['idle_ms']:.1f} ms")]
    for name, u in sorted(prof["units"].items(), key=lambda kv: -kv[1]["ms"]):
        lines.append(f"    {name:26s} {u['ms']:9.2f} ms {u['ms'] / max(gpu, 1e-9):6.1%} "
                     f"{u['calls']:5d} calls {u['ms'] / u['calls']:8.3f} ms/call")
    gaps = sorted(prof["gaps"].items(), key=lambda kv: -kv[1]["ms"])[:n_gaps]
    if gaps:
        lines.append(f"  stream idle between launchers {prof['idle_ms']:.2f} ms, largest:")
    for name, g in gaps:
        lines.append(f"    {name:48s} {g['ms']:8.2f} ms {g['calls']:5d} times "
                     f"{g['ms'] / g['calls']:8.3f} ms each")
    hs = prof["host_sync"]
    lines.append(f"  host: {prof['launch_host_ms']:.1f} ms inside launchers, {hs['ms']:.1f} ms in "
                 f"{hs['calls']} stream syncs (from the last launch), wall - GPU span "
                 f"{wall - prof['span_ms']:.1f} ms")
    return "\n".join(lines)
