"""Short prompts as decode steps: a prompt of a few tokens — often a chat turn's new tokens after
the history its sequence already holds — runs through the decode step one token at a time (logits
mode, nothing picked) instead of through the prompt path.

Why: the prompt path's cost hardly depends on a short prompt's length. Under a budget it lends
cache slots, streams each layer's routed non-resident experts through the ring, waits on routing
counts and refills the loan afterwards; with every expert in VRAM its chunk still pays per-layer
host work. A decode step reads only its own token's experts, missed ones zero-copy. On the H200
(Q4_K_M 30B-A3B, after a 256-token history; `bench/results/2026-12-04_prompt_steps.json`):

    --gpu-mem 8GiB (77% hits)   prompt path 151-221 ms for 1-16 tokens, ~350 ms from 32 on;
                                steps 7.9-9.3 ms a token: steps win below about 40 tokens
    no cap (every expert in VRAM) prompt path 53-57 ms for 1-16 tokens;
                                steps 2.5-2.9 ms a token: steps win below about 20 tokens

Both paths compute the same logits but for the decode step's 8-bit x rounding (there: relative
difference under 2e-3, the same greedy token at every length).

The longest prompt that runs as steps (`limit`) is a pure function of the plan unless given
(`--prompt-steps N`, 0: never): the time a short prompt costs on the path the plan gives it,
over a decode step's time estimated from the plan's predicted hit rate (its VRAM bytes at the
rate a decode step reads them, its missed bytes at the mapped-read rate), both measured on the
H200. It is the same for every run of a plan, so a seeded run repeats its tokens.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from strata.plan.layout import ring_slot_bytes

# Measured on the H200 (2026-12-04; see the module doc), per layer of a 48-layer model: the
# prompt path's cost for a short prompt scales with the layers it runs (per-layer launches,
# syncs and ring traffic), as a decode step's launch-bound floor does.
PROMPT_STREAMED_LAYER_S = 0.30 / 48  # under a budget: the ring, a loan and its refill
PROMPT_RESIDENT_LAYER_S = 0.054 / 48  # every expert in VRAM: the chunk path
STEP_LAYER_S = 20e-6       # a decode step's floor: a layer's ~7 graph-replayed launches
STEP_VRAM_BPS = 0.83e12    # a decode step's VRAM bytes a second (D1: 1.92 GB in 2.32 ms)
MAPPED_BPS = 50e9          # its missed experts' bytes a second: the measured PCIe 5 rate
MAX_STEPS = 64             # never more: past that the prompt path's chunks win everywhere


def _layers_run(plan) -> int:
    """Layers `plan` runs: all of them, or a layer split's stage's."""
    return sum(hi - lo for lo, hi in (d.layers for d in plan.devices))


def step_seconds(plan) -> float:
    """A decode step's estimated time over the layers `plan` runs: their dense weights and hit
    experts read from VRAM, their missed experts from mapped host memory, and never under
    their launch floor."""
    s, n_run = plan.shape, _layers_run(plan)
    hit = plan.predicted_hit_rate if plan.predicted_hit_rate is not None else 0.0
    expert = n_run * s.n_expert_used * ring_slot_bytes(s)  # a token's experts there
    dense = sum(d.regions["weights"] for d in plan.devices)
    reads = (dense + hit * expert) / STEP_VRAM_BPS + (1.0 - hit) * expert / MAPPED_BPS
    return max(reads, n_run * STEP_LAYER_S)


def streams(plan) -> bool:
    """Whether the plan's prompt path moves experts through a ring (not every one is resident)."""
    p = plan.prefill
    return p is not None and (p.mode == "borrowed" or p.ring_slots > 0)


def auto_limit(*plans) -> int:
    """The longest prompt that runs as decode steps (see the module doc): the prompt path's
    cost for a short prompt over a step's, summed over `plans` (one, or a layer split's
    stages' in their order: a step and a prompt run each stage in turn)."""
    if not plans or any(not p.accepted or p.shape is None for p in plans):
        return 0
    prompt_s = sum(_layers_run(p) * (PROMPT_STREAMED_LAYER_S if streams(p) else
                                     PROMPT_RESIDENT_LAYER_S) for p in plans)
    step_s = sum(step_seconds(p) for p in plans)
    return max(0, min(MAX_STEPS, int(prompt_s / step_s)))


def limit(given: int | None, *plans) -> int:
    """`given` (`--prompt-steps`), or the `auto_limit` of `plans` (one, or a split's stages')."""
    return auto_limit(*plans) if given is None else given


def feed(step, ids: Sequence[int] | np.ndarray, start: int) -> None:
    """Run `ids` at positions start.. through `step` (a `DecodeStep` whose sequence holds
    `start` tokens: seq_len on the device is `start`): the tokens go into the history in one copy,
    then one step a token, each embedding history[seq_len] and advancing seq_len; the last one's
    logits land in the step's logits buffer. Nothing is read back."""
    arr = np.ascontiguousarray(ids, dtype=np.int32)  # [n] i32
    n = int(arr.size)
    if n == 0:
        return
    stream = step.m.stream
    step.history[start:start + n].copy_to_device(arr, stream=stream)
    for _ in range(n):
        step.run("logits")
