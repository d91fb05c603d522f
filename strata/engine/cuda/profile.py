"""Where a decode step's time goes: the step captured once whole and once per unit (a launcher; the
matvecs one unit per weight role) with every other launch left out, each graph replayed and
timed with CUDA events.

Every decode kernel reads its inputs from device memory, so a graph of one launcher's kernels
alone (all layers' matvecs, say) reads the same shapes and the buffers' last real values: its
time is that launcher's share of a step. The whole step's time minus the parts' sum is what the
kernels' ordering and the graph's launches cost (each replayed kernel waits for the one before).

Bench-only: the whole-step graph advances the sequence length once per replay, so the engine is
reset afterwards (`strata bench --backend cuda --profile-decode`).
"""

from __future__ import annotations

from typing import Callable

import strata.engine.cuda.decode as decode_mod

# the kernel launchers a decode step calls, by the names decode.py imports them under
LAUNCHERS = ("embed", "rms_norm", "matvec", "matvec_pair", "matvec_normed", "qk_norm_rope",
             "rope_kv", "kv_write", "decode_attention", "add", "route", "router_normed",
             "moe_decode", "moe_decode_mixed", "advance_seq_len", "argmax", "sample")


def _noop(*args, **kwargs) -> None:
    return None


def _time_graph(graph, stream, reps: int) -> float:
    """Milliseconds per replay of `graph`, after one warm replay."""
    from numba import cuda

    graph.replay(stream)
    start, end = cuda.event(), cuda.event()
    start.record(stream)
    for _ in range(reps):
        graph.replay(stream)
    end.record(stream)
    end.synchronize()
    return cuda.event_elapsed_time(start, end) / reps


def _matvec_roles(step) -> dict[int, str]:
    """Which weight a single-token matvec multiplies, by its output length (from the model's
    shape; empty where the step has none)."""
    s = getattr(step.m, "shape", None)
    if s is None:
        return {}
    roles: dict[int, list[str]] = {}
    for n, name in ((s.n_head * s.head_dim, "q"), (s.n_head_kv * s.head_dim, "k/v"),
                    (s.n_embd, "attn_output"), (s.n_expert, "router"), (s.n_vocab, "head")):
        roles.setdefault(int(n), []).append(name)
    return {n: "|".join(names) for n, names in roles.items()}


MATVECS = ("matvec", "matvec_batch", "matvec_tc")  # y: [n_out] (one token) or [n_rows, n_out]


def _unit_key(name: str, roles: dict[int, str], args, kwargs) -> str:
    """The profile's key of one launch: the launcher's name, a matvec's with its weight's role."""
    if name not in MATVECS or not roles:
        return name
    y = args[3] if len(args) > 3 else kwargs.get("y")
    role = roles.get(int(getattr(y, "shape", (-1,))[-1]))
    return f"{name} {role}" if role else name


def profile_step(step, *, reps: int = 20, capture: Callable | None = None,
                 timer: Callable | None = None, module=None,
                 launchers: tuple[str, ...] = LAUNCHERS, record: Callable | None = None,
                 frozen: tuple[str, ...] = (), mode: str = "logits") -> dict[str, dict]:
    """{unit: {"ms": per step, "nodes": kernels}} and "step" for the whole step (of `mode`:
    "logits", or "greedy" / "sample" with the token's choice, which a full history ignores);
    a unit is a launcher (matvecs: one per weight role, "matvec q", "matvec head", ...); units
    the step never launches are left out. `capture` / `timer`: stand-ins for tests (default:
    `strata.cuda_kernels.graph.capture`, CUDA-event timing). `module`, `launchers`, `record`:
    another step's (the batched step: `batch_step`, its launcher names, `record(stream)`);
    `frozen`: launchers left out of every timed graph (a step whose replays must not move the
    sequences on)."""
    if capture is None:
        from strata.cuda_kernels.graph import capture
    timer = timer or _time_graph
    module = module or decode_mod
    stream = step.m.stream
    real = {n: getattr(module, n) for n in launchers if hasattr(module, n)}
    roles = _matvec_roles(step)
    units: dict[str, int] = {}  # launches per step, in first-launch order

    def counting(name):
        def call(*args, **kwargs):
            key = _unit_key(name, roles, args, kwargs)
            units[key] = units.get(key, 0) + 1
            return None if name in frozen else real[name](*args, **kwargs)
        return call

    def only(name, unit):
        def call(*args, **kwargs):
            if _unit_key(name, roles, args, kwargs) == unit:
                return real[name](*args, **kwargs)
            return None
        return call

    if record is None:
        def record(st):
            step.record(st, mode)

    out = {}
    try:
        for name in real:
            setattr(module, name, counting(name))
        g = capture(record, stream)
        out["step"] = {"ms": timer(g, stream, reps), "nodes": g.n_nodes}
        for unit in [u for u in units if u not in frozen]:
            for name in real:
                setattr(module, name, only(name, unit))
            g = capture(record, stream)
            out[unit] = {"ms": timer(g, stream, reps), "nodes": g.n_nodes}
    finally:
        for name, fn in real.items():
            setattr(module, name, fn)
    return out


def profile_table(prof: dict[str, dict]) -> str:
    """One line per launcher, largest first, and the step's unexplained remainder."""
    step = prof["step"]["ms"]
    parts = sorted(((k, v) for k, v in prof.items() if k != "step"), key=lambda kv: -kv[1]["ms"])
    lines = [f"  decode step {step:.3f} ms ({prof['step']['nodes']} kernels), by launcher:"]
    for name, v in parts:
        per = 1e3 * v["ms"] / max(v["nodes"], 1)
        lines.append(f"    {name:22s} {v['ms']:8.3f} ms {v['ms'] / step:6.1%}  "
                     f"{v['nodes']:4d} kernels {per:7.1f} us/kernel")
    rest = step - sum(v["ms"] for _, v in parts)
    lines.append(f"    {'(ordering/launch)':22s} {rest:8.3f} ms {rest / step:6.1%}")
    return "\n".join(lines)
