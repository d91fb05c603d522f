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
LAUNCHERS = ("embed", "rms_norm", "matvec", "matvec_pair", "qk_norm_rope", "rope_kv",
             "kv_write", "decode_attention", "add", "route", "moe_decode", "moe_decode_mixed",
             "advance_seq_len")


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


def _unit_key(name: str, roles: dict[int, str], args, kwargs) -> str:
    """The profile's key of one launch: the launcher's name, a matvec's with its weight's role."""
    if name != "matvec" or not roles:
        return name
    y = args[3] if len(args) > 3 else kwargs.get("y")
    role = roles.get(int(getattr(y, "size", -1)))
    return f"matvec {role}" if role else name


def profile_step(step, *, reps: int = 20, capture: Callable | None = None,
                 timer: Callable | None = None) -> dict[str, dict]:
    """{unit: {"ms": per step, "nodes": kernels}} and "step" for the whole step (mode "logits");
    a unit is a launcher (matvecs: one per weight role, "matvec q", "matvec head", ...); units
    the step never launches are left out. `capture` / `timer`: stand-ins for tests (default:
    `strata.cuda_kernels.graph.capture`, CUDA-event timing)."""
    if capture is None:
        from strata.cuda_kernels.graph import capture
    timer = timer or _time_graph
    stream = step.m.stream
    real = {n: getattr(decode_mod, n) for n in LAUNCHERS if hasattr(decode_mod, n)}
    roles = _matvec_roles(step)
    units: dict[str, int] = {}  # launches per step, in first-launch order

    def counting(name):
        def call(*args, **kwargs):
            key = _unit_key(name, roles, args, kwargs)
            units[key] = units.get(key, 0) + 1
            return real[name](*args, **kwargs)
        return call

    def only(name, unit):
        def call(*args, **kwargs):
            if _unit_key(name, roles, args, kwargs) == unit:
                return real[name](*args, **kwargs)
            return None
        return call

    def record(st):
        step.record(st, "logits")

    out = {}
    try:
        for name in real:
            setattr(decode_mod, name, counting(name))
        g = capture(record, stream)
        out["step"] = {"ms": timer(g, stream, reps), "nodes": g.n_nodes}
        for unit in list(units):
            for name in real:
                setattr(decode_mod, name, only(name, unit))
            g = capture(record, stream)
            out[unit] = {"ms": timer(g, stream, reps), "nodes": g.n_nodes}
    finally:
        for name, fn in real.items():
            setattr(decode_mod, name, fn)
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
