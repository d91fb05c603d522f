"""The knobs a refused stage offers: each a concrete flag, with the bytes it frees on that card
computed by the same stage pricing the refusal's 'needed' comes from (`decide_stage`), largest
effect first. Besides the single-GPU knobs (lighter KV, a shorter context, a smaller reserve, no
draft head, the carve back on), a split can move a layer off the short card: the `--layer-split`
that gives one of its edge layers to its neighbour."""

from __future__ import annotations

from dataclasses import replace

from strata.gguf.shape import ModelShape
from strata.plan.devices import DeviceInfo, MiB
from strata.plan.layout import KV_TYPES, Q4_0_BLOCK
from strata.plan.options import CHUNK_GRID, PlanOptions
from strata.plan.profile import RoutingProfile
from strata.plan.result import Knob
from strata.plan.split.stage import decide_stage

RESERVE_MIN_MIB = 256
NOT_ENOUGH = "not enough alone"


def stage_knobs(shape: ModelShape, profile: RoutingProfile, dev: DeviceInfo,
                options: PlanOptions, cuts: tuple[int, ...], stage: int, *, carve: bool,
                needed: int, max_context: int, reserve_bytes: int,
                searched: tuple[int, ...] | None = None) -> tuple[Knob, ...]:
    """Every change that frees bytes on the refused stage's card, largest effect first;
    `searched`: the placement search's cuts when they differ from the refused ones."""
    edges = (0, *cuts, shape.n_layer)
    lo, hi = edges[stage], edges[stage + 1]

    def need(opts: PlanOptions = options, a: int = lo, b: int = hi, c: bool = carve) -> int:
        return decide_stage(shape, profile, dev, opts, a, b, first=a == 0, carve=c).needed_bytes

    def knob(flag: str, n: int) -> Knob | None:
        freed = needed - n
        if freed <= 0:
            return None
        return Knob(flag, freed, NOT_ENOUGH if n > dev.free_bytes else "")

    found = [knob(f"--kv {t}", need(replace(options, kv_type=t)))
             for t in KV_TYPES[KV_TYPES.index(options.kv_type) + 1:]
             if t != "q4_0" or shape.head_dim % Q4_0_BLOCK == 0]
    ctx = max_context // 2 // CHUNK_GRID * CHUNK_GRID
    if ctx >= CHUNK_GRID:
        found.append(knob(f"--max-context {ctx}", need(replace(options, max_context=ctx))))
    if reserve_bytes > RESERVE_MIN_MIB * MiB:
        found.append(knob(f"--vram-reserve-mib {RESERVE_MIN_MIB}",
                          need(replace(options, vram_reserve_mib=RESERVE_MIN_MIB))))
    if options.spec and lo == 0:
        found.append(knob("--spec 0 (no draft head)", need(replace(options, spec=0))))
    if not carve:
        found.append(knob("the carve on (drop --no-carve)", need(c=True)))
    for a, b, g in ((lo + 1, hi, stage - 1), (lo, hi - 1, stage + 1)):
        if a < b and 0 <= g < len(cuts) + 1:
            moved = list(cuts)
            moved[min(stage, g)] += 1 if g < stage else -1
            found.append(knob(f"--layer-split {','.join(map(str, moved))} (one layer to GPU "
                              f"stage {g})", need(a=a, b=b)))
    if searched is not None and searched != cuts:
        e = (0, *searched, shape.n_layer)
        found.append(knob(f"--layer-split {','.join(map(str, searched))} (the placement "
                          f"search's choice)", need(a=e[stage], b=e[stage + 1])))
    return tuple(sorted((k for k in found if k is not None), key=lambda k: -k.frees_bytes))
